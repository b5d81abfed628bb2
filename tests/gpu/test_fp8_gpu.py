"""FP8 output on the GPU (docs/design.md section 1b): q and the scales bit-identical to torch's quantization of
the `out` the same call returns without quantization (`(y * (1.0 / s)).clamp(-M, M).to(fp8)`), residual_out
bit-exact; static, per-token and per-group scales; E4M3FN (hardware on sm_90) and E4M3FNUZ (the software
conversion); add_rmsnorm_fp8 and the communicator (N ranks in one process, both paths); 200 calls back to
back; bad input refused before any launch."""

from __future__ import annotations

import importlib

import pytest
import torch

import fused_ar
from fused_ar import InputError
from tests.gpu.test_communicator_gpu import emulated_group, run_ranks

pytestmark = pytest.mark.gpu
FORMATS = {"e4m3fn": (torch.float8_e4m3fn, 448.0), "e4m3fnuz": (torch.float8_e4m3fnuz, 240.0)}
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def torch_quant(y: torch.Tensor, mode: str, fmt: str, scale=None, group=None):
    """The unfused pipeline's quantization of y = float(out), as section 1b writes it."""
    dtype, big = FORMATS[fmt]
    y = y.float()
    if mode == "static":
        s = scale.reshape(())
        s_full = s
    elif mode == "token":
        s = torch.clamp(_div(y.abs().amax(-1, keepdim=True), big), min=1 / (512 * big))
        s_full = s
    else:
        groups = y.view(*y.shape[:-1], y.shape[-1] // group, group)
        s = torch.clamp(_div(groups.abs().amax(-1), big), min=1 / (512 * big))
        s_full = s.repeat_interleave(group, dim=-1)
    q = (y * (1.0 / s_full)).clamp(-big, big).to(dtype)
    return q, s


def _div(a, b: float):
    """a / b as IEEE division: torch divides by a Python scalar as a multiplication by its reciprocal."""
    return a / torch.full_like(a, b)


def _bits(t):
    return t.view(torch.uint8)


MODES = [("static", None), ("token", None), ("group", 128), ("group", 64)]


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("mode,group", MODES, ids=["static", "token", "group128", "group64"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", [1, 7, 128, 1000])
@pytest.mark.parametrize("n", [2048, 4096, 7168])
def test_add_rmsnorm_fp8_matches_torch(fmt, mode, group, dtype, m, n):
    g = torch.Generator(device="cuda").manual_seed(m * 31 + n)
    x = torch.randn(m, n, device="cuda", dtype=dtype, generator=g) * 3
    residual = torch.randn(m, n, device="cuda", dtype=dtype, generator=g)
    weight = (torch.rand(n, device="cuda", generator=g) + 0.5).to(dtype)
    scale = torch.tensor([0.02], device="cuda") if mode == "static" else None
    out, ro = fused_ar.add_rmsnorm(x, residual, weight, 1e-6)
    q, ro8, scales = fused_ar.add_rmsnorm_fp8(x, residual, weight, 1e-6, scale=scale, group_size=group,
                                              fp8_dtype=FORMATS[fmt][0])
    ref_q, ref_s = torch_quant(out, mode, fmt, scale, group)
    assert torch.equal(ro8, ro)
    assert q.dtype == FORMATS[fmt][0] and torch.equal(_bits(q), _bits(ref_q)), \
        f"{(_bits(q) != _bits(ref_q)).sum().item()} codes differ"
    assert torch.equal(scales.reshape(ref_s.shape), ref_s)


@pytest.mark.parametrize("variant", ["in_place", "fp32_weight", "no_weight_no_residual"])
@pytest.mark.parametrize("mode,group", MODES[:3], ids=["static", "token", "group128"])
@pytest.mark.parametrize("n", [2048, 8192, 16384, 32768])  # short rows of 128 and 512 threads, long rows of 512, 1024
def test_add_rmsnorm_fp8_variants_quantize_their_t_out(variant, mode, group, n):
    """Each kernel variant (in place, an fp32 weight, neither weight nor residual), short and long rows: q and
    the scales are torch's quantization of the T call's out of the same variant, residual_out its bits."""
    g = torch.Generator(device="cuda").manual_seed(n + len(variant))
    m = 33
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=g) * 3
    residual = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=g)
    weight = torch.rand(n, device="cuda", generator=g) + 0.5
    weight = weight if variant == "fp32_weight" else weight.to(torch.bfloat16)
    if variant == "no_weight_no_residual":
        weight = residual = None
    scale = torch.tensor([0.02], device="cuda") if mode == "static" else None
    out, ro = fused_ar.add_rmsnorm(x, residual, weight, 1e-6)
    res8 = None if residual is None else residual.clone()
    q, ro8, scales = fused_ar.add_rmsnorm_fp8(x, res8, weight, 1e-6, scale=scale, group_size=group,
                                              residual_out=res8 if variant == "in_place" else None)
    ref_q, ref_s = torch_quant(out, mode, "e4m3fn", scale, group)
    assert torch.equal(ro8, ro) and (variant != "in_place" or ro8.data_ptr() == res8.data_ptr())
    assert torch.equal(_bits(q), _bits(ref_q)), f"{(_bits(q) != _bits(ref_q)).sum().item()} codes differ"
    assert torch.equal(scales.reshape(ref_s.shape), ref_s)


# (x dtype, weight dtype, n, group): rows the policy gives 192, 320, 384 or 448 threads, with groups wider than a
# run of lanes, so the per-group kernel keeps the shared-memory amax and, with an fp32 x or weight, the whole
# register file: at 448 threads it took 130-144 registers under a cap of 65536 / 448 and could not launch.
WIDE_GROUP_CASES = [(torch.bfloat16, torch.float32, n, 512) for n in (3072, 5120, 6144, 7168)] + \
                   [(torch.float32, torch.float32, n, 256) for n in (1536, 2560, 3072, 3584)]


@pytest.mark.parametrize("dtype,weight_dtype,n,group", WIDE_GROUP_CASES, ids=str)
def test_wide_groups_launch_at_every_block(dtype, weight_dtype, n, group):
    g = torch.Generator(device="cuda").manual_seed(n + group)
    x = torch.randn(9, n, device="cuda", dtype=dtype, generator=g) * 3
    residual = torch.randn(9, n, device="cuda", dtype=dtype, generator=g)
    weight = (torch.rand(n, device="cuda", generator=g) + 0.5).to(weight_dtype)
    out, ro = fused_ar.add_rmsnorm(x, residual, weight, 1e-6)
    q, ro8, scales = fused_ar.add_rmsnorm_fp8(x, residual, weight, 1e-6, group_size=group)
    ref_q, ref_s = torch_quant(out, "group", "e4m3fn", None, group)
    assert torch.equal(ro8, ro)
    assert torch.equal(_bits(q), _bits(ref_q)), f"{(_bits(q) != _bits(ref_q)).sum().item()} codes differ"
    assert torch.equal(scales.reshape(ref_s.shape), ref_s)


def test_fp8_extremes_and_defaults():
    """Rows that saturate, rows of zeros (the minimum scale) and tiny values (FP8 subnormals)."""
    n = 1024
    x = torch.zeros(4, n, device="cuda", dtype=torch.bfloat16)
    x[0] = torch.linspace(-1e4, 1e4, n)
    x[2] = torch.linspace(-1e-3, 1e-3, n)
    x[3, 7] = 1.0
    residual = torch.zeros_like(x)
    for fmt, (dtype, _) in FORMATS.items():
        out, _ = fused_ar.add_rmsnorm(x, residual, None, 1e-6)
        for mode, group, scale in (("token", None, None), ("group", 128, None),
                                   ("static", None, torch.tensor([1e-3], device="cuda"))):
            q, _, s = fused_ar.add_rmsnorm_fp8(x, residual, None, 1e-6, scale=scale, group_size=group, fp8_dtype=dtype)
            ref_q, ref_s = torch_quant(out, mode, fmt, scale, group)
            assert torch.equal(_bits(q), _bits(ref_q)), (fmt, mode)
    q, _, s = fused_ar.add_rmsnorm_fp8(x, residual, None)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (4, 1)  # NVIDIA's native format, a scale per row


def test_bad_fp8_input_is_refused():
    x = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
    for kwargs, match in (({"scale": torch.tensor([-1.0], device="cuda")}, "positive and finite"),
                          ({"scale": torch.tensor([float("inf")], device="cuda")}, "positive and finite"),
                          ({"scale": torch.tensor([1.0, 2.0], device="cuda")}, "one float32"),
                          ({"scale": torch.tensor([1.0], device="cuda", dtype=torch.float16)}, "one float32"),
                          ({"scale": torch.tensor([1.0])}, "scales is on cpu"),
                          ({"group_size": 100}, "group_size=100"), ({"group_size": 4}, "group_size=4"),
                          ({"fp8_dtype": torch.float16}, "fp8_dtype"),
                          ({"scale": torch.tensor([1.0], device="cuda"), "group_size": 128}, "both given"),
                          ({"out": torch.empty(4, 256, device="cuda", dtype=torch.float8_e5m2)}, "out has dtype"),
                          ({"scales_out": torch.empty(4, 2, device="cuda")}, "scales_out has"),
                          ({"scale": torch.tensor([1.0], device="cuda"), "scales_out": torch.empty(2, device="cuda")},
                           "it receives the scale's value, float32 of shape \\(1,\\)"),
                          ({"scale": torch.tensor([1.0], device="cuda"), "scales_out": torch.empty(1)},
                           "scales_out is on cpu")):
        with pytest.raises(InputError, match=match):
            fused_ar.add_rmsnorm_fp8(x, x, None, **kwargs)


@pytest.mark.parametrize("m", [0, 1, 7, 1000])
def test_static_scale_copied_by_the_kernel(m):
    """A static scale with scales_out: the kernel writes the scale's value there and the call returns it (the
    torch op's fresh scales, no copy launch); a call without it returns the scale and writes nowhere else."""
    n = 2048
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    residual = torch.randn_like(x)
    scale = torch.tensor([0.03], device="cuda")
    copy = torch.full_like(scale, float("nan"))
    q, ro, s = fused_ar.add_rmsnorm_fp8(x, residual, None, scale=scale, scales_out=copy)
    assert s is copy and torch.equal(copy, scale)
    copy.fill_(float("nan"))
    q2, _, s2 = fused_ar.add_rmsnorm_fp8(x, residual, None, scale=scale)
    torch.cuda.synchronize()
    assert s2 is scale and torch.equal(_bits(q), _bits(q2)) and torch.isnan(copy).all()
    importlib.import_module("fused_ar.torch_ops")  # registers torch.ops.fused_ar
    q3, _, s3 = torch.ops.fused_ar.add_rmsnorm_fp8(x, residual, None, 1e-6, scale=scale)
    assert s3.data_ptr() != scale.data_ptr() and torch.equal(s3, scale) and torch.equal(_bits(q3), _bits(q))
    if m:  # written: it may not share a byte with an input
        with pytest.raises(InputError, match="scales_out overlaps x"):
            fused_ar.add_rmsnorm_fp8(x, residual, None, scale=scale, scales_out=x.view(torch.float32).view(-1)[:1])


@pytest.fixture(scope="module", params=[2, 3, 4, 5], ids=lambda n: f"N{n}")
def group(request):
    yield from emulated_group(request.param, 1000 * 7168 * 4)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("mode,group_size", MODES[:3], ids=["static", "token", "group128"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("m", [1, 7, 128, 1000])
@pytest.mark.parametrize("n", [2048, 7168])
@pytest.mark.parametrize("path", ["1stage", "2stage"])
def test_communicator_fp8_matches_torch(group, fmt, mode, group_size, dtype, m, n, path):
    comms, _ = group
    gen = torch.Generator(device="cuda").manual_seed(m + n)
    xs = [torch.randn(m, n, device="cuda", dtype=dtype, generator=gen) for _ in comms]
    residual = torch.randn(m, n, device="cuda", dtype=dtype, generator=gen)
    weight = (torch.rand(n, device="cuda", generator=gen) + 0.5).to(dtype)
    scale = torch.tensor([0.05], device="cuda") if mode == "static" else None
    fp8 = FORMATS[fmt][0]
    plain = [(torch.empty_like(residual), torch.empty_like(residual)) for _ in comms]
    # a static scale's scales_out receives its value (written by the kernel on every rank)
    quant = [(torch.empty(m, n, device="cuda", dtype=fp8), torch.empty_like(residual),
              torch.full_like(scale, float("nan")) if scale is not None else
              torch.empty(torch_quant(residual, mode, fmt, scale, group_size)[1].shape, device="cuda")) for _ in comms]
    run_ranks(group, lambda r, c: c.allreduce_rmsnorm(xs[r], residual, weight, path=path, out=plain[r][0],
                                                      residual_out=plain[r][1]))
    run_ranks(group, lambda r, c: c.allreduce_rmsnorm_fp8(xs[r], residual, weight, scale=scale, group_size=group_size,
                                                          fp8_dtype=fp8, path=path, out=quant[r][0],
                                                          residual_out=quant[r][1], scales_out=quant[r][2]))
    ref_q, ref_s = torch_quant(plain[0][0], mode, fmt, scale, group_size)
    for r in range(len(comms)):
        assert torch.equal(quant[r][1], plain[0][1])
        assert torch.equal(_bits(quant[r][0]), _bits(ref_q)), f"rank {r}"
        assert torch.equal(quant[r][2], ref_s if scale is None else scale), f"rank {r}"


def test_200_fp8_calls_back_to_back(group):
    comms, _ = group
    m, n = 16, 4096
    xs = [torch.randn(m, n, device="cuda", dtype=torch.bfloat16) for _ in comms]
    residual = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    weight = torch.rand(n, device="cuda", dtype=torch.bfloat16) + 0.5
    outs = [(torch.empty(m, n, device="cuda", dtype=torch.float8_e4m3fn), torch.empty_like(residual),
             torch.empty(m, n // 128, device="cuda")) for _ in comms]
    for _ in range(200):
        run_ranks(group, lambda r, c: c.allreduce_rmsnorm_fp8(xs[r], residual, weight, group_size=128,
                                                              out=outs[r][0], residual_out=outs[r][1],
                                                              scales_out=outs[r][2]))
    plain = [(torch.empty_like(residual), torch.empty_like(residual)) for _ in comms]
    run_ranks(group, lambda r, c: c.allreduce_rmsnorm(xs[r], residual, weight, out=plain[r][0], residual_out=plain[r][1]))
    ref_q, ref_s = torch_quant(plain[0][0], "group", "e4m3fn", None, 128)
    assert all(torch.equal(_bits(o[0]), _bits(ref_q)) and torch.equal(o[2], ref_s) for o in outs)

"""Per-group FP8 with power-of-two scales (docs/design.md section 1b) on the GPU: q and the scales bit-identical
to fused_ar.reference.fp8_group_ue8m0_reference applied to the `out` the same call returns in T, the scales
as fp32 ("ue8m0") or as UE8M0 bytes packed four to an int32 ("ue8m0_packed", pack_ue8m0), row-major or
MN-major; add_rmsnorm_fp8, the communicator's fused op (both paths, N ranks in one process) and the
sequence-parallel op; group widths whose amax is a lane shuffle and those that go through shared memory;
edge rows (zeros, one huge value, tiny values, inf and NaN); bad input refused before any launch."""

from __future__ import annotations

import pytest
import torch

import fused_ar
from fused_ar import InputError
from fused_ar.reference import fp8_group_ue8m0_reference, pack_ue8m0
from tests.gpu.test_communicator_gpu import emulated_group, run_ranks
from tests.gpu.test_fp8_gpu import _bits, torch_quant

pytestmark = pytest.mark.gpu
FORMATS = ["ue8m0", "ue8m0_packed"]


def expected(out: torch.Tensor, group: int, scales_format: str, mn_major: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scales) the call must return for its own T out, in the layout it must return them."""
    q, s = fp8_group_ue8m0_reference(out, group)
    s2 = s.reshape(-1, s.shape[-1])
    if scales_format == "ue8m0_packed":
        s2 = pack_ue8m0(s2, mn_major)
    elif mn_major:
        m = s2.shape[0]
        storage = torch.zeros((s2.shape[1], -(-m // 4) * 4), dtype=s2.dtype, device=s2.device)
        storage[:, :m] = s2.t()
        s2 = storage.t()[:m]
    return q, s2


def same_codes(q, ref_q):
    """FP8 codes equal, NaN for NaN (a NaN's sign bit is free)."""
    nan, ref_nan = torch.isnan(q.float()), torch.isnan(ref_q.float())
    return torch.equal(nan, ref_nan) and torch.equal(_bits(q)[~nan], _bits(ref_q)[~ref_nan])


def same_floats(a, b):
    nan = torch.isnan(a)
    return torch.equal(nan, torch.isnan(b)) and torch.equal(a[~nan], b[~nan])


def check(q, scales, out, group, scales_format, mn_major):
    ref_q, ref_s = expected(out, group, scales_format, mn_major)
    assert same_codes(q, ref_q), f"{(_bits(q) != _bits(ref_q)).sum().item()} codes differ"
    assert scales.dtype == ref_s.dtype and scales.shape == ref_s.shape, (scales.dtype, scales.shape)
    assert not scales.numel() or scales.stride() == ref_s.stride(), (scales.stride(), ref_s.stride())  # empty: any
    if scales.dtype == torch.int32:
        assert torch.equal(scales, ref_s), f"{(scales != ref_s).sum().item()} scale words differ"
    else:
        assert same_floats(scales, ref_s)


def inputs(m, n, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, n, device="cuda", dtype=dtype, generator=g) * 3
    residual = torch.randn(m, n, device="cuda", dtype=dtype, generator=g)
    weight = (torch.rand(n, device="cuda", generator=g) + 0.5).to(dtype)
    return x, residual, weight


@pytest.mark.parametrize("scales_format", FORMATS)
@pytest.mark.parametrize("mn_major", [False, True], ids=["row_major", "mn_major"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("m", [1, 7, 130])
@pytest.mark.parametrize("n", [2176, 7168])  # 17 groups (a partly filled word), 56 groups
def test_add_rmsnorm_fp8_ue8m0_matches_reference(scales_format, mn_major, dtype, m, n):
    x, residual, weight = inputs(m, n, dtype, m * 31 + n)
    out, ro = fused_ar.add_rmsnorm(x, residual, weight, 1e-6)
    q, ro8, scales = fused_ar.add_rmsnorm_fp8(x, residual, weight, 1e-6, group_size=128, scales_format=scales_format,
                                              scales_mn_major=mn_major)
    assert torch.equal(ro8, ro)
    check(q, scales, out, 128, scales_format, mn_major)


@pytest.mark.parametrize("scales_format", ["fp32"] + FORMATS)
@pytest.mark.parametrize("group,n,pack", [(96, 6144, 16), (512, 6144, 16), (128, 6144, 2), (16, 2048, 16),
                                          (32, 4096, 16), (256, 8192, 16)],
                         ids=["96_shared", "512_shared", "128_unaligned_shared", "16_lanes2", "32_lanes4", "256_lanes32"])
def test_group_widths_on_both_amax_paths(scales_format, group, n, pack):
    """Groups of a power-of-two number of packs up to a warp take the shuffle; the rest (12 or 64 packs, or
    one-element accesses of unaligned rows) the shared-memory amax: the same bits either way."""
    m = 9
    x, residual, weight = inputs(m, n + 1, torch.bfloat16, group + n)
    if pack == 2:  # rows one element off 16-byte alignment: add_rmsnorm's one-element kernel
        x, residual = x[:, 1:], residual[:, 1:]
    else:
        x, residual = x[:, :n], residual[:, :n]
    weight = weight[:n]
    out, _ = fused_ar.add_rmsnorm(x, residual, weight, 1e-6)
    if scales_format == "fp32":
        q, _, scales = fused_ar.add_rmsnorm_fp8(x, residual, weight, 1e-6, group_size=group)
        ref_q, ref_s = torch_quant(out, "group", "e4m3fn", None, group)
        assert torch.equal(_bits(q), _bits(ref_q)) and torch.equal(scales, ref_s)
        return
    q, _, scales = fused_ar.add_rmsnorm_fp8(x, residual, weight, 1e-6, group_size=group, scales_format=scales_format)
    check(q, scales, out, group, scales_format, False)


def edge_rows(zero_cols: int, n: int = 1024):
    """(x, residual, weight, out) of 8 rows: all zeros, `zero_cols` leading zeros, one huge value, tiny values,
    an inf (out NaN there, 0 elsewhere: inv_rms is 0), a NaN (out NaN throughout), a wide ramp, random."""
    x = torch.randn(8, n, device="cuda", dtype=torch.bfloat16)
    x[0] = 0
    x[1, :zero_cols] = 0
    x[2, 5] = 3e4
    x[3] = torch.linspace(-1e-30, 1e-30, n)
    x[4, 77] = float("inf")
    x[5, 300] = float("nan")
    x[6] = torch.linspace(-1e4, 1e4, n)
    residual = torch.zeros_like(x)
    weight = torch.rand(n, device="cuda", dtype=torch.bfloat16) + 0.5
    return x, residual, weight, fused_ar.add_rmsnorm(x, residual, weight, 1e-6)[0]


def test_edge_rows():
    """All-zero rows and groups (the minimum scale, 2^-17 after rounding up), one huge value in a group, tiny
    values, an inf in x and a NaN (NaN codes where out is NaN, the scale of their groups NaN, byte 255)."""
    x, residual, weight, out = edge_rows(128)
    for scales_format in FORMATS:
        for mn_major in (False, True):
            q, _, scales = fused_ar.add_rmsnorm_fp8(x, residual, weight, 1e-6, group_size=128,
                                                    scales_format=scales_format, scales_mn_major=mn_major)
            check(q, scales, out, 128, scales_format, mn_major)
            first = scales[0, 0].item() & 0xFF if scales_format == "ue8m0_packed" else scales[0, 0].item()
            assert first == (127 - 17 if scales_format == "ue8m0_packed" else 2.0 ** -17)  # 1 / (512 * 448), rounded up
            nan_groups = (scales[4:6].contiguous().view(torch.uint8)[:, :8] == 255) if scales_format == "ue8m0_packed" else \
                torch.isnan(scales[4:6])
            # the inf's row: out is NaN at the inf (inf * 0), 0 elsewhere (inv_rms 0); the NaN's row: NaN throughout
            assert nan_groups[0].tolist() == [True] + [False] * 7 and nan_groups[1].all()


def test_bad_input_is_refused():
    x = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
    for kwargs, match in (({"group_size": 128, "scales_format": "e8m0"}, "scales_format='e8m0'"),
                          ({"group_size": 128, "scales_format": None}, "scales_format=None"),
                          ({"scales_format": "ue8m0"}, "give group_size"),
                          ({"scales_mn_major": True}, "give group_size"),
                          ({"scale": torch.tensor([1.0], device="cuda"), "scales_format": "ue8m0_packed"},
                           "give group_size"),
                          ({"group_size": 128, "scales_mn_major": 1}, "scales_mn_major=1"),
                          ({"group_size": 128, "scales_format": "ue8m0_packed",
                            "scales_out": torch.empty(4, 2, device="cuda")}, "scales_out has dtype"),
                          ({"group_size": 128, "scales_format": "ue8m0_packed", "scales_mn_major": True,
                            "scales_out": torch.empty(4, 1, device="cuda", dtype=torch.int32)}, "strides")):
        with pytest.raises(InputError, match=match):
            fused_ar.add_rmsnorm_fp8(x, x.clone(), None, **kwargs)


def test_given_scales_out_and_torch_op():
    """scales_out of the layout the call allocates is written in place; torch.ops.fused_ar takes the formats."""
    m, n = 6, 1024
    x, residual, weight = inputs(m, n, torch.bfloat16, 5)
    out, _ = fused_ar.add_rmsnorm(x, residual, weight, 1e-6)
    given = torch.empty_strided((m, 2), (1, 8), dtype=torch.int32, device="cuda")
    q, _, scales = fused_ar.add_rmsnorm_fp8(x, residual, weight, 1e-6, group_size=128, scales_format="ue8m0_packed",
                                            scales_mn_major=True, scales_out=given)
    assert scales is given
    check(q, scales, out, 128, "ue8m0_packed", True)
    q, _, scales = torch.ops.fused_ar.add_rmsnorm_fp8(x, residual, weight, 1e-6, group_size=128,
                                                      scales_format="ue8m0_packed", scales_mn_major=True)
    check(q, scales, out, 128, "ue8m0_packed", True)


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda n: f"N{n}")
def group(request):
    yield from emulated_group(request.param, 1000 * 7168 * 4)


@pytest.mark.parametrize("scales_format,mn_major", [("ue8m0", False), ("ue8m0_packed", False), ("ue8m0_packed", True),
                                                    ("fp32", True)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("m", [1, 7, 130])
@pytest.mark.parametrize("path", ["1stage", "2stage"])
def test_communicator_ue8m0_matches_reference(group, scales_format, mn_major, dtype, m, path):
    comms, _ = group
    n = 2176
    gen = torch.Generator(device="cuda").manual_seed(m + n)
    xs = [torch.randn(m, n, device="cuda", dtype=dtype, generator=gen) for _ in comms]
    residual = torch.randn(m, n, device="cuda", dtype=dtype, generator=gen)
    weight = (torch.rand(n, device="cuda", generator=gen) + 0.5).to(dtype)
    plain = run_ranks(group, lambda r, c: c.allreduce_rmsnorm(xs[r], residual, weight, path=path))
    quant = run_ranks(group, lambda r, c: c.allreduce_rmsnorm_fp8(xs[r], residual, weight, group_size=128,
                                                                  scales_format=scales_format,
                                                                  scales_mn_major=mn_major, path=path))
    for r in range(len(comms)):
        assert torch.equal(quant[r][1], plain[0][1])
        if scales_format == "fp32":
            ref_q, ref_s = torch_quant(plain[0][0], "group", "e4m3fn", None, 128)
            assert torch.equal(_bits(quant[r][0]), _bits(ref_q)) and torch.equal(quant[r][2], ref_s)
            assert quant[r][2].stride() == (1, -(-m // 4) * 4)
        else:
            check(quant[r][0], quant[r][2], plain[0][0], 128, scales_format, mn_major)


@pytest.mark.parametrize("mn_major", [False, True], ids=["row_major", "mn_major"])
def test_reduce_scatter_ue8m0_shards(group, mn_major):
    """Each rank's shard quantized with its own rows' scale layout (MN-major over the shard's rows)."""
    comms, _ = group
    m, n = 37, 2176
    gen = torch.Generator(device="cuda").manual_seed(m)
    xs = [torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in comms]
    residual = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=gen)
    weight = torch.rand(n, device="cuda", dtype=torch.bfloat16) + 0.5
    plain = run_ranks(group, lambda r, c: c.allreduce_rmsnorm(xs[r], residual, weight))
    got = run_ranks(group, lambda r, c: c.reduce_scatter_rmsnorm_fp8(
        xs[r], residual[slice(*c.shard_rows(m))], weight, group_size=128, scales_format="ue8m0_packed",
        scales_mn_major=mn_major))
    for r, c in enumerate(comms):
        lo, hi = c.shard_rows(m)
        check(got[r][0], got[r][2], plain[0][0][lo:hi], 128, "ue8m0_packed", mn_major)

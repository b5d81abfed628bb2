"""FP4 output on the GPU (docs/design.md section 1b): NVFP4 (E4M3 scales per 16, row-major or in the GEMMs'
swizzled tiles) and MXFP4 (UE8M0 scales per 32), values and scales bit-identical to fused_ar.reference's
nvfp4_reference / swizzle_nvfp4_scales / mxfp4_reference applied to the `out` the same call returns in T;
add_rmsnorm_fp4, the communicator's fused op (both paths, N ranks in one process, in chunks) and the
sequence-parallel op; edge rows; bad input refused before any launch."""

from __future__ import annotations

import pytest
import torch

import fused_ar
from fused_ar import InputError
from fused_ar.comm.communicator import Communicator
from fused_ar.reference import mxfp4_reference, nvfp4_reference, prime_allocator, swizzle_nvfp4_scales
from tests.gpu.test_communicator_gpu import emulated_group, run_ranks
from tests.gpu.test_ue8m0_gpu import edge_rows

pytestmark = pytest.mark.gpu
KINDS = [("nvfp4", False), ("nvfp4", True), ("mxfp4", False), ("mxfp4_rceil", False), ("mxfp4_even", False)]
KIND_IDS = ["nvfp4", "nvfp4_swizzled", "mxfp4", "mxfp4_rceil", "mxfp4_even"]


def rounding(fmt: str) -> str:
    """The reference's rounding of an MXFP4 fp4_format's scale: mxfp4 (OCP floor), mxfp4_rceil, mxfp4_even."""
    return fmt.removeprefix("mxfp4").removeprefix("_") or "floor"


def expected(out: torch.Tensor, fmt: str, swizzled: bool, global_scale) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, scales) the call must return for its own T out."""
    if fmt.startswith("mxfp4"):
        return mxfp4_reference(out, rounding=rounding(fmt))
    values, scales = nvfp4_reference(out, global_scale)
    if swizzled:
        scales = swizzle_nvfp4_scales(scales.reshape(-1, scales.shape[-1]))
    return values, scales


def nan_safe_equal(values, scales, ref_values, ref_scales, fmt):
    """Scale bytes equal; value bytes equal but for the sign bit of a NaN's code (the largest magnitude, 7:
    the sign of a NaN is free), which only a block whose scale is NaN (NVFP4 0x7f, MXFP4 255) may hold."""
    s, rs = scales.view(torch.uint8), ref_scales.view(torch.uint8)
    assert torch.equal(s, rs), f"{(s != rs).sum().item()} scale bytes differ"
    assert torch.equal(values & 0x77, ref_values & 0x77), f"{((values ^ ref_values) & 0x77 != 0).sum().item()} codes differ"
    nan_blocks = (s == (0x7F if fmt == "nvfp4" else 0xFF)).repeat_interleave((16 if fmt == "nvfp4" else 32) // 2, dim=-1)
    assert not ((values != ref_values) & ~nan_blocks).any(), "a sign differs outside a NaN block"


def inputs(m, n, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, n, device="cuda", dtype=dtype, generator=g) * 3
    residual = torch.randn(m, n, device="cuda", dtype=dtype, generator=g)
    weight = (torch.rand(n, device="cuda", generator=g) + 0.5).to(dtype)
    return x, residual, weight


GLOBAL = 448.0 * 6.0 / 40.0  # an amax of about 40 maps to the top of E4M3


@pytest.mark.parametrize("fmt,swizzled", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("m", [1, 7, 130])
@pytest.mark.parametrize("n", [2048, 2080, 7168])  # 2080: 130 NVFP4 blocks (the swizzled tiles pad to 132)
def test_add_rmsnorm_fp4_matches_reference(fmt, swizzled, dtype, m, n):
    if fmt.startswith("mxfp4") and n % 32:
        n += 16
    x, residual, weight = inputs(m, n, dtype, m * 31 + n)
    g = torch.tensor([GLOBAL], device="cuda")
    out, ro = fused_ar.add_rmsnorm(x, residual, weight, 1e-6)
    values, ro4, scales = fused_ar.add_rmsnorm_fp4(x, residual, weight, 1e-6, fp4_format=fmt,
                                                   global_scale=g if fmt == "nvfp4" else None, scales_swizzled=swizzled)
    ref_values, ref_scales = expected(out, fmt, swizzled, g)
    assert torch.equal(ro4, ro)
    assert values.dtype == torch.uint8 and values.shape == (m, n // 2)
    assert scales.dtype == ref_scales.dtype and scales.shape == ref_scales.shape
    assert torch.equal(values, ref_values), f"{(values != ref_values).sum().item()} value bytes differ"
    assert torch.equal(scales.view(torch.uint8), ref_scales.view(torch.uint8))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp4_rceil", "mxfp4_even"])
def test_edge_rows(fmt):
    """All-zero rows and blocks (scale 0: NVFP4 code 0, MXFP4 2^-127), one huge value (saturation, small values
    of its block to 0), tiny values, an inf in x and a NaN (their blocks' scale is NaN)."""
    x, residual, weight, out = edge_rows(64)
    for g in ([1.0, 1e4, 1e30] if fmt == "nvfp4" else [None]):  # 1e30: every block scale saturates at 448
        gt = None if g is None else torch.tensor([g], device="cuda")
        values, _, scales = fused_ar.add_rmsnorm_fp4(x, residual, weight, 1e-6, fp4_format=fmt, global_scale=gt)
        ref_values, ref_scales = expected(out, fmt, False, gt)
        nan_safe_equal(values, scales, ref_values, ref_scales, fmt)
    assert (scales[0].view(torch.uint8) == 0).all() and (values[0] == 0).all()


def test_bad_input_is_refused():
    x = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
    g = torch.tensor([1.0], device="cuda")
    for kwargs, match in (({"fp4_format": "fp4"}, "fp4_format='fp4'"),
                          ({}, "needs global_scale"),
                          ({"global_scale": torch.tensor([-1.0], device="cuda")}, "global_scale=-1.0"),
                          ({"global_scale": torch.tensor([float("nan")], device="cuda")}, "global_scale=nan"),
                          ({"global_scale": torch.tensor([1.0, 2.0], device="cuda")}, "one float32"),
                          ({"global_scale": torch.tensor([1.0])}, "global_scale is on cpu"),
                          ({"fp4_format": "mxfp4", "global_scale": g}, "MXFP4's scales are powers of two"),
                          ({"fp4_format": "mxfp4", "scales_swizzled": True}, "NVFP4's layout"),
                          ({"global_scale": g, "scales_swizzled": 1}, "scales_swizzled=1"),
                          ({"global_scale": g, "out": torch.empty(4, 256, device="cuda", dtype=torch.uint8)},
                           r"out has dtype torch.uint8 and shape \(4, 256\): it must be uint8 of shape \(4, 128\)"),
                          ({"global_scale": g, "scales_out": torch.empty(4, 16, device="cuda")}, "scales_out has")):
        with pytest.raises(InputError, match=match):
            fused_ar.add_rmsnorm_fp4(x, x.clone(), None, **kwargs)
    with pytest.raises(InputError, match="n=248: nvfp4 quantizes blocks of 16"):
        fused_ar.add_rmsnorm_fp4(x[:, :248], None, None, global_scale=g)
    with pytest.raises(InputError, match="n=240: mxfp4 quantizes blocks of 32"):
        fused_ar.add_rmsnorm_fp4(x[:, :240], None, None, fp4_format="mxfp4")
    with pytest.raises(InputError, match="16-byte aligned rows"):
        fused_ar.add_rmsnorm_fp4(torch.randn(4, 257, device="cuda", dtype=torch.bfloat16)[:, 1:], None, None,
                                 global_scale=g)


def test_torch_op_and_given_outputs():
    m, n = 5, 1024
    x, residual, weight = inputs(m, n, torch.bfloat16, 9)
    g = torch.tensor([GLOBAL], device="cuda")
    out, _ = fused_ar.add_rmsnorm(x, residual, weight, 1e-6)
    ref_values, ref_scales = expected(out, "nvfp4", True, g)
    values, _, scales = torch.ops.fused_ar.add_rmsnorm_fp4(x, residual, weight, 1e-6, 0.0, "nvfp4", g, True)
    assert torch.equal(values, ref_values) and torch.equal(scales.view(torch.uint8), ref_scales.view(torch.uint8))
    given_values = torch.empty(m, n // 2, device="cuda", dtype=torch.uint8)
    given_scales = torch.zeros_like(ref_scales)
    got = fused_ar.add_rmsnorm_fp4(x, residual, weight, 1e-6, global_scale=g, scales_swizzled=True, out=given_values,
                                   scales_out=given_scales)
    assert got[0] is given_values and got[2] is given_scales
    assert torch.equal(given_values, ref_values) and torch.equal(given_scales.view(torch.uint8), ref_scales.view(torch.uint8))


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda n: f"N{n}")
def group(request):
    yield from emulated_group(request.param, 1000 * 7168 * 4)


@pytest.mark.parametrize("fmt,swizzled", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("m", [1, 7, 130])
@pytest.mark.parametrize("path", ["1stage", "2stage"])
def test_communicator_fp4_matches_reference(group, fmt, swizzled, dtype, m, path):
    comms, _ = group
    n = 2080 if fmt == "nvfp4" else 2112
    gen = torch.Generator(device="cuda").manual_seed(m + n)
    xs = [torch.randn(m, n, device="cuda", dtype=dtype, generator=gen) for _ in comms]
    residual = torch.randn(m, n, device="cuda", dtype=dtype, generator=gen)
    weight = (torch.rand(n, device="cuda", generator=gen) + 0.5).to(dtype)
    g = torch.tensor([GLOBAL], device="cuda") if fmt == "nvfp4" else None
    plain = run_ranks(group, lambda r, c: c.allreduce_rmsnorm(xs[r], residual, weight, path=path))
    quant = run_ranks(group, lambda r, c: c.allreduce_rmsnorm_fp4(xs[r], residual, weight, fp4_format=fmt,
                                                                  global_scale=g, scales_swizzled=swizzled, path=path))
    ref_values, ref_scales = expected(plain[0][0], fmt, swizzled, g)
    for r in range(len(comms)):
        assert torch.equal(quant[r][1], plain[0][1])
        assert torch.equal(quant[r][0], ref_values), f"rank {r}: {(quant[r][0] != ref_values).sum().item()} bytes"
        assert torch.equal(quant[r][2].view(torch.uint8), ref_scales.view(torch.uint8)), f"rank {r}: scales"


@pytest.mark.parametrize("fmt,swizzled", KINDS, ids=KIND_IDS)
def test_reduce_scatter_fp4_shards(group, fmt, swizzled):
    comms, _ = group
    m, n = 37, 2080 if fmt == "nvfp4" else 2112
    gen = torch.Generator(device="cuda").manual_seed(m)
    xs = [torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in comms]
    residual = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=gen)
    weight = torch.rand(n, device="cuda", dtype=torch.bfloat16) + 0.5
    g = torch.tensor([GLOBAL], device="cuda") if fmt == "nvfp4" else None
    plain = run_ranks(group, lambda r, c: c.allreduce_rmsnorm(xs[r], residual, weight))
    got = run_ranks(group, lambda r, c: c.reduce_scatter_rmsnorm_fp4(
        xs[r], residual[slice(*c.shard_rows(m))], weight, fp4_format=fmt, global_scale=g, scales_swizzled=swizzled))
    for r, c in enumerate(comms):
        lo, hi = c.shard_rows(m)
        ref_values, ref_scales = expected(plain[0][0][lo:hi], fmt, swizzled, g)
        assert torch.equal(got[r][0], ref_values) and torch.equal(got[r][2].view(torch.uint8), ref_scales.view(torch.uint8))


def test_chunked_call_places_swizzled_rows():
    """A call over the staging buffer runs in chunks of 100 rows: each chunk's rows land in their own places of
    the 128-row tiles (the launch's first row is passed, not folded into the pointer)."""
    n = 2048
    prime_allocator()
    comms = Communicator.local_group(2, device=0, max_bytes=100 * n * 2)
    streams = [torch.cuda.Stream() for _ in comms]
    try:
        m = 300
        gen = torch.Generator(device="cuda").manual_seed(3)
        xs = [torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in comms]
        residual = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=gen)
        weight = torch.rand(n, device="cuda", dtype=torch.bfloat16) + 0.5
        g = torch.tensor([GLOBAL], device="cuda")
        plain = run_ranks((comms, streams), lambda r, c: c.allreduce_rmsnorm(xs[r], residual, weight, path="2stage"))
        got = run_ranks((comms, streams), lambda r, c: c.allreduce_rmsnorm_fp4(
            xs[r], residual, weight, global_scale=g, scales_swizzled=True, path="2stage"))
        ref_values, ref_scales = expected(plain[0][0], "nvfp4", True, g)
        for r in range(2):
            assert torch.equal(got[r][0], ref_values)
            assert torch.equal(got[r][2].view(torch.uint8), ref_scales.view(torch.uint8))
    finally:
        torch.cuda.synchronize()
        for c in comms:
            c.close()

"""add_rmsnorm on a real GPU against the docs/design.md section 1 reference: residual_out bit-exact, out
within 1 ulp, inputs untouched, every output element written; eager and inside a captured CUDA graph."""

from __future__ import annotations

import pytest
import torch

from fused_ar import add_rmsnorm
from tests.reference import assert_rmsnorm_matches

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
MS = [1, 3, 17, 128, 4096]
NS = [512, 2880, 4096, 7168, 8192, 16384]


def _inputs(m, n, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, n, device="cuda", dtype=dtype, generator=g)
    r = torch.randn(m, n, device="cuda", dtype=dtype, generator=g)
    w = torch.rand(n, device="cuda", dtype=dtype, generator=g) + 0.5
    return x, r, w


def _check(x, r, w, eps, out, ro):
    assert_rmsnorm_matches([x], r, w, eps, out, ro)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("m", MS)
def test_matches_reference(m, n, dtype):
    x, r, w = _inputs(m, n, dtype, seed=m * 100003 + n)
    before = [t.clone() for t in (x, r, w)]
    out = torch.full_like(x, float("nan"))
    ro = torch.full_like(x, float("nan"))
    got = add_rmsnorm(x, r, w, 1e-6, out=out, residual_out=ro)
    assert got[0] is out and got[1] is ro
    torch.cuda.synchronize()
    _check(x, r, w, 1e-6, out, ro)
    for t, b in zip((x, r, w), before):
        assert torch.equal(t, b), "an input was written"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [40960, 65536])
def test_rows_wider_than_registers(n, dtype):
    """Rows beyond FA_BLOCK * FA_REG_PACKS packs take the re-read path."""
    x, r, w = _inputs(5, n, dtype, seed=n)
    out, ro = add_rmsnorm(x, r, w, 1e-5)
    _check(x, r, w, 1e-5, out, ro)


@pytest.mark.parametrize("dtype,n", [(d, n) for d in DTYPES[:2] for n in (1000, 4100, 8192)] +
                         [(torch.float32, n) for n in (1002, 4096)], ids=str)
def test_sum_order_is_the_packs_whatever_the_block(dtype, n):
    """A row whose packs all sit in registers, at most kSums x block of them (kernels_src/fa_rmsnorm.h: the
    wave size squared at most), sums its squares in the order of its packs: every block size and register
    policy that holds it gives out the same bits, tail columns included (4100, 1002). That is what lets a
    quantized call, whose kernel may keep other packs in registers, quantize its T call's out exactly."""
    from fused_ar.device.launch import launch, named_args, spec_for
    from fused_ar.jit.kernels import add_rmsnorm_reg_packs
    from fused_ar.jit.spec import ADD_RMSNORM_BLOCKS, DType, Op

    m, wave = 5, 64 if torch.version.hip else 32
    size = torch.tensor([], dtype=dtype).element_size()
    pitch = -(-n * size // 16) * 16 // size  # rows 16-byte aligned, the tail columns inside them
    x, r, w = _inputs(m, pitch, dtype, seed=n + 17)
    x, r, w = x[:, :n], r[:, :n], w[:n]
    packs = n * size // 16
    results = {}
    for block in ADD_RMSNORM_BLOCKS:
        for short in (True, False):
            spec = spec_for(Op.ADD_RMSNORM, DType.parse(dtype), 0, block, short_rows=short)
            reg = add_rmsnorm_reg_packs(spec)
            sums = reg if reg * block <= wave * wave else wave * wave // block
            if packs > sums * block:
                continue  # packs past the partial sums: the order of this kernel's threads
            out, ro = (torch.full((m, pitch), float("nan"), device="cuda", dtype=dtype)[:, :n] for _ in range(2))
            launch(spec, 0, m, named_args(spec, out=out.data_ptr(), residual_out=ro.data_ptr(), x=x.data_ptr(),
                                          residual=r.data_ptr(), weight=w.data_ptr(), rows=m, cols=n, eps=1e-6,
                                          weight_offset=0.0, x_stride=pitch, residual_stride=pitch,
                                          out_stride=pitch, residual_out_stride=pitch))
            results[(block, short)] = (out, ro)
    assert len(results) >= 3, f"only {sorted(results)} hold n={n} in registers"
    (first, (out0, ro0)), *rest = results.items()
    _check(x, r, w, 1e-6, out0, ro0)
    for kernel, (out, ro) in rest:
        assert torch.equal(ro, ro0), f"residual_out of {kernel} differs from {first}"
        assert torch.equal(out, out0), f"{(out != out0).sum().item()} elements of out differ: {kernel} against {first}"


def test_allocating_form_and_leading_dims():
    x, r, w = _inputs(6, 1024, torch.bfloat16, seed=7)
    out, ro = add_rmsnorm(x.view(2, 3, 1024), r.view(2, 3, 1024), w)
    assert out.shape == (2, 3, 1024)
    _check(x, r, w, 1e-6, out.view(6, 1024), ro.view(6, 1024))


def test_m_zero():
    x = torch.empty(0, 4096, device="cuda", dtype=torch.bfloat16)
    out, ro = add_rmsnorm(x, x.clone(), torch.ones(4096, device="cuda", dtype=torch.bfloat16))
    assert out.shape == (0, 4096) and ro.shape == (0, 4096)


def test_large_values_and_eps():
    x, r, w = _inputs(64, 4096, torch.float16, seed=11)
    x, r = x * 100, r * 100  # squares far beyond fp16 range: the sum of squares must stay fp32
    out, ro = add_rmsnorm(x, r, w, 0.5)
    _check(x, r, w, 0.5, out, ro)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_graph_replay_with_new_data(dtype):
    m, n = 33, 4096
    x, r, w = _inputs(m, n, dtype, seed=3)
    out = torch.full_like(x, float("nan"))
    ro = torch.full_like(x, float("nan"))
    add_rmsnorm(x, r, w, out=out, residual_out=ro)  # compile and load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        add_rmsnorm(x, r, w, out=out, residual_out=ro)
    for seed in range(4):
        nx, nr, nw = _inputs(m, n, dtype, seed=100 + seed)
        x.copy_(nx), r.copy_(nr), w.copy_(nw)
        out.fill_(float("nan")), ro.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(nx, nr, nw, 1e-6, out, ro)


def test_side_stream_and_second_device_index():
    x, r, w = _inputs(8, 2048, torch.bfloat16, seed=5)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out, ro = add_rmsnorm(x, r, w)
    s.synchronize()
    _check(x, r, w, 1e-6, out, ro)

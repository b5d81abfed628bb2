"""Launch plans on the GPU: a key seen before takes the per-call checks only, and those still refuse what
the full checks refuse (a misaligned view, an output aliasing an input, a bad eps) before any launch; a
key's plan follows the environment's path overrides; calls alternating between keys stay exact."""

from __future__ import annotations

import pytest
import torch

import fused_ar
from fused_ar import Communicator, InputError, UnsupportedShapeError
from tests.gpu.test_communicator_gpu import make_inputs, poisoned, run_ranks
from tests.reference import add_rmsnorm_reference, allreduce_reference, assert_rmsnorm_matches

pytestmark = pytest.mark.gpu
M, N = 8, 4096


def _odd_view(t):
    """A tensor of t's shape, dtype and strides whose data starts 2 bytes into an allocation."""
    flat = torch.randn(t.numel() + 8, device=t.device, dtype=t.dtype)
    return flat[1:1 + t.numel()].view(t.shape)


def test_add_rmsnorm_per_call_checks_after_the_plan_exists():
    x, residual = torch.randn(M, N, device="cuda", dtype=torch.bfloat16), torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    weight = torch.rand(N, device="cuda", dtype=torch.bfloat16) + 0.5
    out, ro = poisoned(x), poisoned(x)
    fused_ar.add_rmsnorm(x, residual, weight, 1e-6, out=out, residual_out=ro)  # the plan of this key
    _, ref_ro, _ = add_rmsnorm_reference([x], residual, weight, 1e-6)
    assert torch.equal(ro, ref_ro)
    odd = _odd_view(x).copy_(x)  # the same key, a pointer 2 bytes off: the one-element access serves it
    fused_ar.add_rmsnorm(odd, residual, weight, 1e-6, out=out, residual_out=ro)
    assert torch.equal(ro, ref_ro)
    before = (out.clone(), ro.clone())
    with pytest.raises(InputError, match="out overlaps residual"):  # in place is out=x only
        fused_ar.add_rmsnorm(x, residual, weight, 1e-6, out=residual, residual_out=ro)
    with pytest.raises(InputError, match="overlaps"):
        fused_ar.add_rmsnorm(x, residual, weight, 1e-6, out=out, residual_out=out)
    for eps in (0.0, -1.0, float("nan"), float("inf"), "1e-6", None):
        with pytest.raises(InputError, match="eps"):
            fused_ar.add_rmsnorm(x, residual, weight, eps, out=out, residual_out=ro)
    torch.cuda.synchronize()
    assert torch.equal(out, before[0]) and torch.equal(ro, before[1]), "a refused call wrote its outputs"
    fused_ar.add_rmsnorm(x, residual, weight, 1, out=out, residual_out=ro)  # an int eps is a real number


def test_add_rmsnorm_alternating_keys_stay_exact():
    shapes = [(1, 4096), (7, 2048), (128, 8192), (7, 2048), (1, 4096)]
    for i in range(40):
        m, n = shapes[i % len(shapes)]
        x, residual = torch.randn(m, n, device="cuda"), torch.randn(m, n, device="cuda")
        x, residual = x.to(torch.float16), residual.to(torch.float16)
        weight = torch.rand(n, device="cuda", dtype=torch.float16) + 0.5
        out, ro = fused_ar.add_rmsnorm(x, residual, weight, 1e-5)
        assert torch.equal(ro, add_rmsnorm_reference([x], residual, weight, 1e-5)[1])


@pytest.fixture(scope="module")
def group():
    comms = Communicator.local_group(2, device=0, max_bytes=8 << 20)
    yield comms, [torch.cuda.Stream() for _ in comms]
    torch.cuda.synchronize()
    for c in comms:
        c.close()


def test_communicator_per_call_checks_after_the_plan_exists(group):
    comms, _ = group
    xs, residual, weight = make_inputs(2, M, N, torch.bfloat16, seed=3)
    bufs = [(poisoned(residual), poisoned(residual)) for _ in xs]
    run_ranks(group, lambda r, c: c.allreduce_rmsnorm(xs[r], residual, weight, out=bufs[r][0], residual_out=bufs[r][1]))
    assert_rmsnorm_matches(xs, residual, weight, 1e-6, *bufs[0])
    c = comms[0]
    odd_residual = _odd_view(residual).copy_(residual)  # residual rows the kernels cannot take: a local group
    with pytest.raises(UnsupportedShapeError, match="aligned"):  # has no fallback
        c.allreduce_rmsnorm(xs[0], odd_residual, weight, out=bufs[0][0], residual_out=bufs[0][1])
    with pytest.raises(InputError, match="overlaps"):
        c.allreduce_rmsnorm(xs[0], residual, weight, out=residual, residual_out=bufs[0][1])
    with pytest.raises(InputError, match="eps"):
        c.allreduce_rmsnorm(xs[0], residual, weight, -1.0, out=bufs[0][0], residual_out=bufs[0][1])
    plain = [poisoned(x) for x in xs]
    run_ranks(group, lambda r, cc: cc.allreduce(xs[r], out=plain[r]))
    big = torch.empty(xs[0].numel() + 8, device="cuda", dtype=xs[0].dtype)
    with pytest.raises(InputError, match="overlaps"):  # a partial overlap (out=x itself is in place)
        c.allreduce(big[:xs[0].numel()].view(xs[0].shape), out=big[8:8 + xs[0].numel()].view(xs[0].shape))
    with pytest.raises(UnsupportedShapeError, match="aligned"):
        c.allreduce(xs[0], out=_odd_view(plain[0]))
    assert all(cc.error_code() == 0 for cc in comms)
    assert torch.equal(plain[1], allreduce_reference(xs))


@pytest.mark.parametrize("forced", ["0", "1"])
def test_plans_follow_the_path_override(group, monkeypatch, forced):
    comms, _ = group
    monkeypatch.setenv("FUSED_AR_1STAGE", forced)
    xs, residual, weight = make_inputs(2, M, N, torch.float32, seed=5)
    bufs = [(poisoned(residual), poisoned(residual)) for _ in xs]
    run_ranks(group, lambda r, c: c.allreduce_rmsnorm(xs[r], residual, weight, out=bufs[r][0], residual_out=bufs[r][1]))
    assert_rmsnorm_matches(xs, residual, weight, 1e-6, *bufs[0])
    plans = [p for k, p in comms[0]._plans.items() if k[2][0] == forced.encode()]
    assert plans and all(p.spec.op.value.endswith("1stage" if forced == "1" else "2stage") for p in plans)

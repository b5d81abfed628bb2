"""Programmatic dependent launch: with it (FUSED_AR_PDL=1, the default on sm_90) a kernel may start while the
previous kernel on its stream finishes, so every kernel must wait before touching memory. Chains where each
call reads what the previous one wrote (in place: the next call overwrites what the previous one reads),
with torch kernels between them, eager and replayed from a CUDA graph, give the same bits with and without
it, and match the reference."""

from __future__ import annotations

import pytest
import torch

import fused_ar
from fused_ar import Communicator
from fused_ar.backends import current_runtime
from fused_ar.device import ops
from tests.gpu.test_communicator_gpu import make_inputs, run_ranks
from tests.reference import add_rmsnorm_reference

pytestmark = pytest.mark.gpu
STEPS = 12


@pytest.fixture(params=[False, True], ids=["pdl0", "pdl1"])
def pdl(request, monkeypatch):
    """Plans made under FUSED_AR_PDL=0 or 1 (a plan reads it when made: fresh plans for each)."""
    monkeypatch.setenv("FUSED_AR_PDL", "1" if request.param else "0")
    ops._plans.clear()
    ops._by_pack.clear()
    yield request.param
    ops._plans.clear()
    ops._by_pack.clear()


def _inputs(m, n, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, n, device="cuda", dtype=dtype, generator=g)
    residual = torch.randn(m, n, device="cuda", dtype=dtype, generator=g)
    weight = torch.rand(n, device="cuda", dtype=dtype, generator=g) + 0.5
    return x, residual, weight


def _chain_in_place(x, residual, weight, serialized=False):
    """STEPS in-place calls, each reading what the one before wrote, a torch kernel between each two;
    `serialized`: the device waited on after every kernel (nothing can overlap: the bits to match)."""
    for _ in range(STEPS):
        fused_ar.add_rmsnorm(x, residual, weight, 1e-6, out=x, residual_out=residual)
        if serialized:
            torch.cuda.synchronize()
        x.mul_(0.5)
        if serialized:
            torch.cuda.synchronize()
    return x, residual


def _plans_pdl(plans, pdl):
    plans = list(plans)
    assert plans and all(p.pdl == (pdl and current_runtime().supports_pdl(p.spec.arch)) for p in plans)


@pytest.mark.parametrize("m,n", [(1, 4096), (64, 8192), (4096, 8192)])
def test_in_place_chain_eager_and_graph(pdl, m, n):
    x, residual, weight = _inputs(m, n)
    want = _chain_in_place(x.clone(), residual.clone(), weight, serialized=True)
    one = fused_ar.add_rmsnorm(x, residual, weight, 1e-6)
    assert torch.equal(one[1], add_rmsnorm_reference([x], residual, weight, 1e-6)[1])
    got = _chain_in_place(x.clone(), residual.clone(), weight)
    torch.cuda.synchronize()
    _plans_pdl(ops._plans.values(), pdl)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])
    gx, gr = x.clone(), residual.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        _chain_in_place(gx.clone(), gr.clone(), weight)  # plans made outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _chain_in_place(gx, gr, weight)
    for _ in range(2):
        gx.copy_(x)
        gr.copy_(residual)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(gr, want[1]) and torch.equal(gx, want[0])


def test_out_of_place_chain_with_allocations_between(pdl):
    x, residual, weight = _inputs(256, 5120, torch.float16, seed=1)
    want_x, want_r = x, residual
    for _ in range(STEPS):
        out, want_r = fused_ar.add_rmsnorm(want_x, want_r, weight, 1e-5)
        torch.cuda.synchronize()
        want_x = out + 1
        torch.cuda.synchronize()
    got_x, got_r = x, residual
    for _ in range(STEPS):
        out, got_r = fused_ar.add_rmsnorm(got_x, got_r, weight, 1e-5)
        got_x = out + 1
    assert torch.equal(got_r, want_r) and torch.equal(got_x, want_x)


@pytest.mark.parametrize("world", [2, 4])
def test_communicator_chain_same_bits_as_serialized(pdl, world):
    """allreduce_rmsnorm -> torch -> add_rmsnorm -> allreduce_rmsnorm on every rank (a stream each), all
    enqueued at once, against the same steps with the device waited on between them."""
    xs, residual, weight = make_inputs(world, 32, 4096, torch.bfloat16, seed=world)
    comms = Communicator.local_group(world, 0)
    group = (comms, [torch.cuda.Stream() for _ in comms])
    try:
        def buffers():
            return [[torch.empty_like(residual) for _ in range(4)] for _ in range(world)]

        def first(r, c, b):
            return c.allreduce_rmsnorm(xs[r], residual, weight, 1e-6, out=b[r][0], residual_out=b[r][1])

        def middle(r, b):
            b[r][0].mul_(2)
            fused_ar.add_rmsnorm(b[r][0], b[r][1], weight, 1e-6, out=b[r][0], residual_out=b[r][1])

        def last(r, c, b):
            return c.allreduce_rmsnorm(b[r][0], b[r][1], weight, 1e-6, out=b[r][2], residual_out=b[r][3])

        chained = buffers()
        got = run_ranks(group, lambda r, c: (first(r, c, chained), middle(r, chained), last(r, c, chained))[-1])
        steps = buffers()
        run_ranks(group, lambda r, c: first(r, c, steps))
        run_ranks(group, lambda r, c: middle(r, steps))
        want = run_ranks(group, lambda r, c: last(r, c, steps))
        _plans_pdl([p for c in comms for p in c._plans.values()], pdl)
        for (out, ro), (want_out, want_ro) in zip(got, want):
            assert torch.equal(out, want_out) and torch.equal(ro, want_ro)
            assert torch.equal(out, got[0][0]) and torch.equal(ro, got[0][1]), "ranks disagree"
    finally:
        for c in comms:
            c.close()

"""Sequence parallelism on one GPU, N ranks in one process: reduce_scatter_rmsnorm gives each rank exactly its
rows of allreduce_rmsnorm on the same inputs (T and FP8 outputs), all_gather reassembles the shards, for
every group size 2-8, m not divisible by N (shorter and empty last shards), buffers smaller than the call
(chunks), graph capture and the torch ops; bad shapes are refused by name before anything launches."""

from __future__ import annotations

from contextlib import ExitStack

import pytest
import torch

from fused_ar import InputError
from tests.gpu.test_communicator_gpu import emulated_group, make_inputs, poisoned, run_ranks
from tests.gpu.test_fp8_gpu import FORMATS
from tests.reference import assert_rmsnorm_matches

pytestmark = pytest.mark.gpu

MS = [1, 2, 7, 16, 17, 64, 1000]
ROW = 4096 * 2  # a bf16 row of the chunked test


def small_bytes(ranks: int) -> int:
    """A staging buffer of 3 rows of every shard (and a little): the calls of the chunked test run in chunks."""
    return 3 * ranks * ROW + 48


@pytest.fixture(scope="module", params=[2, 3, 4, 5, 7, 8], ids=lambda n: f"N{n}")
def group(request):
    yield from emulated_group(request.param, 1000 * 7168 * 4)


@pytest.fixture(scope="module", params=[3, 8], ids=lambda n: f"N{n}")
def small(request):
    yield from emulated_group(request.param, small_bytes(request.param))


def scatter_and_gather(group, xs, residual, weight, path="auto"):
    """Per rank: (out, residual_out) of reduce_scatter_rmsnorm and the all_gather of that out."""
    comms = group[0]
    m, n = xs[0].shape
    bounds = [c.shard_rows(m) for c in comms]
    outs = [(poisoned(residual[lo:hi]), poisoned(residual[lo:hi])) for lo, hi in bounds]
    gathered = [poisoned(residual) for _ in comms]
    run_ranks(group, lambda r, c: c.reduce_scatter_rmsnorm(xs[r], residual[bounds[r][0]:bounds[r][1]], weight,
                                                           path=path, out=outs[r][0], residual_out=outs[r][1]))
    run_ranks(group, lambda r, c: c.all_gather(outs[r][0], m, out=gathered[r]))
    return bounds, outs, gathered


def whole(group, xs, residual, weight):
    outs = [(poisoned(residual), poisoned(residual)) for _ in xs]
    run_ranks(group, lambda r, c: c.allreduce_rmsnorm(xs[r], residual, weight, out=outs[r][0],
                                                      residual_out=outs[r][1]))
    return outs[0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("n", [4096, 7168])
def test_reduce_scatter_rows_are_the_fused_all_reduce_rows(group, dtype, n):
    ranks = len(group[0])
    for m in MS:
        xs, residual, weight = make_inputs(ranks, m, n, dtype, seed=m * 13 + n + ranks)
        before = [x.clone() for x in xs]
        bounds, outs, gathered = scatter_and_gather(group, xs, residual, weight)
        full_out, full_ro = whole(group, xs, residual, weight)
        assert_rmsnorm_matches(xs, residual, weight, 1e-6, full_out, full_ro)
        for r, ((lo, hi), (out, ro)) in enumerate(zip(bounds, outs)):
            assert out.shape == (hi - lo, n) and hi - lo == min(max(m - r * -(-m // ranks), 0), -(-m // ranks))
            assert torch.equal(out, full_out[lo:hi]) and torch.equal(ro, full_ro[lo:hi]), f"m={m} rank {r}"
            assert torch.equal(gathered[r], full_out), f"m={m} rank {r}: all_gather"
        assert all(torch.equal(a, b) for a, b in zip(xs, before)), "an input was written"


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("mode,group_size", [("static", None), ("token", None), ("group", 128)])
def test_reduce_scatter_fp8_rows_are_the_fused_fp8_rows(group, fmt, mode, group_size):
    comms = group[0]
    ranks, n, fp8 = len(comms), 4096, FORMATS[fmt][0]
    scale = torch.tensor([0.05], device="cuda") if mode == "static" else None
    for m in (1, 17, 64):
        xs, residual, weight = make_inputs(ranks, m, n, torch.bfloat16, seed=m + ranks)
        fulls = [(torch.empty(m, n, device="cuda", dtype=fp8), poisoned(residual)) for _ in comms]
        full = run_ranks(group, lambda r, c: c.allreduce_rmsnorm_fp8(xs[r], residual, weight, scale=scale,
                                                                     group_size=group_size, fp8_dtype=fp8,
                                                                     out=fulls[r][0], residual_out=fulls[r][1]))
        bounds = [c.shard_rows(m) for c in comms]
        shards = [(torch.empty(hi - lo, n, device="cuda", dtype=fp8), poisoned(residual[lo:hi])) for lo, hi in bounds]
        # a static scale's scales_out receives its value on every rank, one whose shard is empty too
        copies = [None if scale is None else torch.full_like(scale, float("nan")) for _ in comms]
        got = run_ranks(group, lambda r, c: c.reduce_scatter_rmsnorm_fp8(
            xs[r], residual[bounds[r][0]:bounds[r][1]], weight, scale=scale, group_size=group_size, fp8_dtype=fp8,
            out=shards[r][0], residual_out=shards[r][1], scales_out=copies[r]))
        q, ro, s = full[0]
        for r, ((lo, hi), (gq, gro, gs)) in enumerate(zip(bounds, got)):
            assert torch.equal(gq.view(torch.uint8), q[lo:hi].view(torch.uint8)), f"m={m} rank {r}: FP8 bytes"
            assert torch.equal(gro, ro[lo:hi]), f"m={m} rank {r}: residual_out"
            assert torch.equal(gs, s if scale is not None else s[lo:hi]), f"m={m} rank {r}: scales"
            assert scale is None or gs is copies[r], f"m={m} rank {r}: the scale's copy"


def test_in_place_with_empty_shards(group):
    """residual_out=residual on every rank, m < N (the last shards empty, their tensors at address 0): each
    rank's residual shard becomes the fused op's residual_out rows, and no rank waits on another's kernel."""
    comms = group[0]
    ranks, n = len(comms), 4096
    for m in (1, 2, ranks + 1):
        xs, residual, weight = make_inputs(ranks, m, n, torch.bfloat16, seed=m + 7 * ranks)
        full_out, full_ro = whole(group, xs, residual, weight)
        bounds = [c.shard_rows(m) for c in comms]
        shards = [residual[lo:hi].clone() for lo, hi in bounds]
        outs = [poisoned(s) for s in shards]
        run_ranks(group, lambda r, c: c.reduce_scatter_rmsnorm(xs[r], shards[r], weight, out=outs[r],
                                                               residual_out=shards[r]))
        for r, (lo, hi) in enumerate(bounds):
            assert torch.equal(outs[r], full_out[lo:hi]) and torch.equal(shards[r], full_ro[lo:hi]), f"m={m} r={r}"


def test_chunks_graphs_and_torch_ops(small):
    comms, streams = small
    ranks, n, dtype = len(comms), 4096, torch.bfloat16
    for m in (5, 23, 100):  # 3 rows of every shard per launch at most: several chunks, uneven shards
        xs, residual, weight = make_inputs(ranks, m, n, dtype, seed=m)
        bounds, outs, gathered = scatter_and_gather(small, xs, residual, weight)
        full_out, full_ro = whole(small, xs, residual, weight)
        for r, (lo, hi) in enumerate(bounds):
            assert torch.equal(outs[r][0], full_out[lo:hi]) and torch.equal(outs[r][1], full_ro[lo:hi]), f"m={m}"
            assert torch.equal(gathered[r], full_out), f"m={m} rank {r}: chunked all_gather"
    m = 23
    xs, residual, weight = make_inputs(ranks, m, n, dtype, seed=99)
    bounds = [c.shard_rows(m) for c in comms]
    graphs, outs = [], []
    with ExitStack() as stack:
        for c in comms:
            stack.enter_context(c.capture())
        for r, (c, s) in enumerate(zip(comms, streams)):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s):
                out, ro = torch.ops.fused_ar.reduce_scatter_rmsnorm(xs[r], residual[bounds[r][0]:bounds[r][1]],
                                                                    weight, 1e-6, c.handle)
                outs.append((out, ro, torch.ops.fused_ar.all_gather(out, c.handle, m)))
            graphs.append(g)
    for rep in range(2):
        new, new_res, _ = make_inputs(ranks, m, n, dtype, seed=200 + rep)
        for r in range(ranks):
            xs[r].copy_(new[r])
            for t in outs[r]:
                t.fill_(float("nan"))
        residual.copy_(new_res)
        run_ranks(small, lambda r, c: graphs[r].replay())
        full_out, full_ro = whole(small, new, new_res, weight)
        for r, (lo, hi) in enumerate(bounds):
            assert torch.equal(outs[r][0], full_out[lo:hi]) and torch.equal(outs[r][1], full_ro[lo:hi])
            assert torch.equal(outs[r][2], full_out), f"replay {rep} rank {r}"


def test_bad_shapes_are_refused_by_name(group):
    comms = group[0]
    c = comms[-1]
    x = torch.randn(10, 4096, device="cuda", dtype=torch.bfloat16)
    lo, hi = c.shard_rows(10)
    with pytest.raises(InputError, match=rf"residual has shape \(10, 4096\): rank {c.rank}'s shard .*\[{lo}, {hi}\)"):
        c.reduce_scatter_rmsnorm(x, x.clone(), None)
    with pytest.raises(InputError, match="2-D x"):
        c.reduce_scatter_rmsnorm(x.view(2, 5, 4096), None, None)
    with pytest.raises(InputError, match=rf"x has 10 rows: rank {c.rank}'s shard of rows=10"):
        c.all_gather(x, 10)
    with pytest.raises(InputError, match="path='2stage'"):
        c.reduce_scatter_rmsnorm(x, None, None, path="2stage")
    with pytest.raises(InputError, match="rows=-1"):
        c.all_gather(x[:0], -1)
    # values the per-call plan key cannot hold: named by the full checks, never a TypeError
    with pytest.raises(InputError, match=r"path=\['auto'\]"):
        c.all_gather(x, path=["auto"])
    with pytest.raises(InputError, match=r"path=\['auto'\]"):
        c.reduce_scatter_rmsnorm(x, None, None, path=["auto"])

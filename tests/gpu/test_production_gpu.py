"""The production path on one GPU: graph capture and replay (three batch sizes), a rank that never calls
(PeerTimeoutError, then a new communicator works), ranks that disagree on m (MismatchError everywhere,
nothing written), a graph replayed before registration, the fallback through torch.distributed (gloo
processes sharing the GPU) with the real peer-access probe, the custom ops eager and compiled, and the
tp_decode example in every mode."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from contextlib import ExitStack

import pytest
import torch

from fused_ar import Communicator, FusedArError, MismatchError, PeerTimeoutError
from tests.gpu.test_communicator_gpu import check_fused, make_inputs, poisoned, run_ranks, spawn_ranks
from tests.reference import add_rmsnorm_reference, allreduce_reference, assert_rmsnorm_matches, prime_allocator

pytestmark = pytest.mark.gpu
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def local(n, max_bytes=8 << 20):
    prime_allocator()
    comms = Communicator.local_group(n, device=0, max_bytes=max_bytes)
    return comms, [torch.cuda.Stream() for _ in comms]


def close(group):
    torch.cuda.synchronize()
    for c in group[0]:
        c.close()


@pytest.mark.parametrize("n_ranks", [2, 3, 4, 7, 8])
def test_graphs_of_three_batch_sizes_replay_bit_exact(n_ranks):
    group = local(n_ranks)
    comms, streams = group
    n, dtype = 4096, torch.bfloat16
    try:
        weight = torch.rand(n, device="cuda", dtype=dtype) + 0.5
        graphs = {}
        for m in (1, 16, 128):  # warm every kernel first: nothing compiles or loads during capture
            xs, residual, _ = make_inputs(n_ranks, m, n, dtype, seed=m)
            bufs = [(poisoned(residual), poisoned(residual), poisoned(residual)) for _ in comms]
            run_ranks(group, lambda r, c: (c.allreduce_rmsnorm(xs[r], residual, weight, out=bufs[r][0],
                                                                residual_out=bufs[r][1]),
                                           c.allreduce(xs[r], out=bufs[r][2])))
        with ExitStack() as stack:
            for c in comms:
                stack.enter_context(c.capture())
            for m in (1, 16, 128):
                xs, residual, _ = make_inputs(n_ranks, m, n, dtype, seed=m + 1)
                outs, gs = [], []
                for r, (c, s) in enumerate(zip(comms, streams)):
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g, stream=s):
                        outs.append((*c.allreduce_rmsnorm(xs[r], residual, weight), c.allreduce(xs[r])))
                    gs.append(g)
                graphs[m] = (xs, residual, outs, gs)
        for rep in range(3):
            for m in ((1, 16, 128) if rep % 2 == 0 else (128, 16, 1)):
                xs, residual, outs, gs = graphs[m]
                new, new_res, _ = make_inputs(n_ranks, m, n, dtype, seed=100 * rep + m)
                for r in range(n_ranks):
                    xs[r].copy_(new[r])
                    for t in outs[r]:
                        t.fill_(float("nan"))
                residual.copy_(new_res)
                run_ranks(group, lambda r, c: gs[r].replay())
                for out, ro, ar in outs:
                    assert_rmsnorm_matches(new, new_res, weight, 1e-6, out, ro)
                    assert torch.equal(ar, allreduce_reference(new))
        # eager calls still right after the graphs
        xs, residual, _ = make_inputs(n_ranks, 3, n, dtype, seed=7)
        check_fused(group, xs, residual, weight, "auto")
    finally:
        close(group)


def test_replay_before_registration_raises_instead_of_reading():
    group = local(2)
    comms, streams = group
    try:
        xs, residual, weight = make_inputs(2, 4, 4096, torch.bfloat16, seed=3)
        check_fused(group, xs, residual, weight, "auto")
        gs, outs = [], []
        for r, (c, s) in enumerate(zip(comms, streams)):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s):
                outs.append(c.allreduce_rmsnorm(xs[r], residual, weight))
            gs.append(g)
        for out, _ in outs:
            out.fill_(float("nan"))
        for g, s in zip(gs, streams):
            with torch.cuda.stream(s):
                g.replay()
        torch.cuda.synchronize()
        for c, (out, _) in zip(comms, outs):
            with pytest.raises(FusedArError, match="before its buffers were registered"):
                c.check()
            assert torch.isnan(out).all()
    finally:
        close(group)


def test_rank_that_never_calls_times_out_and_a_new_communicator_works(monkeypatch):
    monkeypatch.setenv("FUSED_AR_TIMEOUT_S", "1")
    group = local(4)
    comms, streams = group
    try:
        xs, residual, weight = make_inputs(4, 8, 4096, torch.bfloat16, seed=5)
        check_fused(group, xs, residual, weight, "auto")  # healthy first
        outs = [poisoned(residual) for _ in range(3)]
        start = time.monotonic()
        for r in range(3):  # rank 3 never calls
            with torch.cuda.stream(streams[r]):
                comms[r].allreduce_rmsnorm(xs[r], residual, weight, out=outs[r])
        torch.cuda.synchronize()
        elapsed = time.monotonic() - start
        assert elapsed < 1 + 5, f"the waiting ranks took {elapsed:.1f} s to give up (timeout 1 s)"
        for r in range(3):
            with pytest.raises(PeerTimeoutError, match=r"rank\(s\) \[3\] did not arrive") as info:
                comms[r].check()
            assert info.value.ranks == (3,)
            with pytest.raises(FusedArError, match="failed earlier"):
                comms[r].allreduce_rmsnorm(xs[r], residual, weight)
    finally:
        close(group)
    fresh = local(4)
    try:
        xs, residual, weight = make_inputs(4, 8, 4096, torch.bfloat16, seed=6)
        check_fused(fresh, xs, residual, weight, "auto")
    finally:
        close(fresh)


@pytest.mark.parametrize("path", ["1stage", "2stage"])
def test_ranks_with_different_m_raise_mismatch_everywhere(monkeypatch, path):
    monkeypatch.setenv("FUSED_AR_TIMEOUT_S", "20")
    group = local(2)
    comms, streams = group
    try:
        weight = torch.rand(4096, device="cuda", dtype=torch.bfloat16) + 0.5
        inputs = [make_inputs(1, m, 4096, torch.bfloat16, seed=m) for m in (4, 8)]
        outs = [poisoned(res) for _, res, _ in inputs]
        start = time.monotonic()
        for r, ((x, res, _), s) in enumerate(zip(inputs, streams)):
            with torch.cuda.stream(s):
                comms[r].allreduce_rmsnorm(x[0], res, weight, path=path, out=outs[r])
        torch.cuda.synchronize()
        assert time.monotonic() - start < 10, "the mismatch was found by the timeout, not the descriptors"
        for r, c in enumerate(comms):
            with pytest.raises(MismatchError, match=r"m=4.*m=8|m=8.*m=4"):
                c.check()
            assert torch.isnan(outs[r]).all(), f"rank {r} wrote output for a mismatched call"
    finally:
        close(group)


def test_custom_ops_eager_and_compiled(monkeypatch):
    # Rank 1 compiles its variant (the handle is a constant) while rank 0's first kernel waits for it: the
    # compiled graph holds our op alone, so that compile is host work only. A Triton kernel in it would
    # load and autotune on first use, which waits for the device, behind rank 0's spinning kernel.
    monkeypatch.setenv("FUSED_AR_TIMEOUT_S", "120")
    group = local(2)
    comms, _ = group
    try:
        xs, residual, weight = make_inputs(2, 16, 4096, torch.bfloat16, seed=11)

        def f(x, res, w, comm: int):
            return torch.ops.fused_ar.allreduce_rmsnorm(x, res, w, 1e-6, comm, "auto")

        compiled = torch.compile(f, fullgraph=True)
        for fn in (f, compiled):
            outs = run_ranks(group, lambda r, c: fn(xs[r], residual, weight, c.handle))
            for out, ro in outs:
                assert_rmsnorm_matches(xs, residual, weight, 1e-6, out, ro)
        ar = run_ranks(group, lambda r, c: torch.ops.fused_ar.allreduce(xs[r], c.handle, "auto"))
        assert all(torch.equal(a, allreduce_reference(xs)) for a in ar)
        out, ro = torch.ops.fused_ar.add_rmsnorm(xs[0], residual, weight, 1e-6)
        assert_rmsnorm_matches([xs[0]], residual, weight, 1e-6, out, ro)
    finally:
        close(group)


# -- the fallback, with gloo processes sharing the GPU ----------------------------------------------------
def _fallback_worker(rank, world, init_file, result_dir):
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("fused_ar").addHandler(handler)
    try:
        # The real probe runs here (one child for the node, the others read its verdict).
        with Communicator(device=0, max_bytes=1 << 20) as comm:
            assert comm.fallback_reason is None, comm.fallback_reason
            for m, n, dtype in [(1, 4096, torch.bfloat16), (17, 2880, torch.float16), (64, 8192, torch.float32),
                                (3, 1004, torch.bfloat16)]:  # n=1004 bf16: not whole 16-byte packs
                xs, residual, weight = make_inputs(world, m, n, dtype, seed=m * 7 + n)
                for path in ("fallback", "auto"):
                    out, ro = comm.allreduce_rmsnorm(xs[rank], residual, weight, path=path)
                    ar = comm.allreduce(xs[rank], path=path)
                    torch.cuda.synchronize()
                    comm.check()
                    ref_ar, ref_ro, _ = add_rmsnorm_reference(xs, residual, weight, 1e-6)
                    if world == 2:  # one addition: any summation order gives the reference's bits
                        assert torch.equal(ar, ref_ar), f"{path} m={m} n={n}: all-reduce differs"
                        assert_rmsnorm_matches(xs, residual, weight, 1e-6, out, ro)
                    else:  # the collective's own order and rounding: close, not bit-exact
                        torch.testing.assert_close(ar, ref_ar, rtol=2e-2, atol=2e-2)
                        torch.testing.assert_close(ro, ref_ro, rtol=2e-2, atol=2e-2)
            bigs, _, _ = make_inputs(world, 1024, 1024, torch.float32, seed=5)  # 4 MiB > max_bytes: 4 chunks
            got = comm.allreduce(bigs[rank])
            torch.cuda.synchronize()
            assert torch.equal(got, allreduce_reference(bigs)), "the chunked all-reduce differs"
            longs, long_res, long_w = make_inputs(world, 2, 1 << 19, torch.float32, seed=6)  # 2 MiB rows: fallback
            _, ro = comm.allreduce_rmsnorm(longs[rank], long_res, long_w)
            torch.testing.assert_close(ro, add_rmsnorm_reference(longs, long_res, long_w, 1e-6)[1], rtol=2e-2,
                                       atol=2e-2)
        reasons = [r.getMessage() for r in records]
        assert any("path='fallback' was asked for" in m for m in reasons), reasons
        assert any("n=1004" in m for m in reasons), reasons
        assert any("a row of x has 2097152 bytes" in m for m in reasons), reasons
        assert len(reasons) == len(set(reasons)), f"a reason was logged twice: {reasons}"
        open(os.path.join(result_dir, f"ok-{rank}"), "w").close()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_fallback_through_torch_distributed(tmp_path, world):
    spawn_ranks(_fallback_worker, world, tmp_path)


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_decode_example_every_mode(tp):
    # A stuck rank shows up as the example's own PeerTimeoutError (FUSED_AR_TIMEOUT_S) with the modes it
    # finished printed, well before the subprocess limit.
    try:
        done = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "tp_decode.py"), "--tp", str(tp),
                               "--one-process"], capture_output=True, text=True, timeout=240, cwd=ROOT,
                              env=dict(os.environ, PYTHONPATH=ROOT, FUSED_AR_TIMEOUT_S="30"))
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"tp_decode --tp {tp} ran past 240 s; it printed:\n{e.stdout}\n{e.stderr}")
    assert done.returncode == 0, done.stdout + done.stderr
    for mode in ("eager", "graph", "compiled"):
        assert f"{mode}:" in done.stdout, done.stdout
    assert "all modes match" in done.stdout

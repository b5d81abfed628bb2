"""The communicator with one process per rank: rank r on GPU r % device_count, so the same tests run one
process per GPU over NVLink on a multi-GPU machine (NCCL for the fallback) and N processes sharing one GPU
elsewhere (gloo, no fallback through NCCL there). Every path and dtype on the communicator issue's
shapes, 200 calls back to back, graphs of three batch sizes, a rank that never calls, ranks that disagree,
calls over the buffer in chunks (eager and captured), a rank that leaves after the first chunk, the
sequence-parallel ops, and the quantized outputs (FP8 every scale kind and format, NVFP4, MXFP4).
The real peer-access probe runs in every group."""

from __future__ import annotations

import os
import time

import pytest
import torch

from fused_ar import Communicator, FusedArError, MismatchError, PeerTimeoutError
from tests.reference import allreduce_reference, assert_rmsnorm_matches
from tests.gpu.test_communicator_gpu import make_inputs, spawn_ranks

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
SHAPES = [(1, 4096), (3, 2880), (16, 7168), (17, 8192), (128, 8192), (1000, 4096)]
TIMEOUT_S = 2.0


def _paths_and_stress(comm, rank, world, device, per_gpu):
    paths = ("1stage", "2stage", "auto") + (("fallback",) if per_gpu else ())
    for dtype in DTYPES:
        for m, n in SHAPES:
            xs, residual, weight = make_inputs(world, m, n, dtype, seed=m * 31 + n)
            for path in paths:
                out, ro = comm.allreduce_rmsnorm(xs[rank], residual, weight, path=path)
                ar = comm.allreduce(xs[rank], path=path)
                torch.cuda.synchronize()
                comm.check()
                if path == "fallback" and world > 2:  # the collective's own summation order
                    torch.testing.assert_close(ar, allreduce_reference(xs), rtol=2e-2, atol=2e-2)
                    continue
                assert_rmsnorm_matches(xs, residual, weight, 1e-6, out, ro)
                assert torch.equal(ar, allreduce_reference(xs)), f"{path} {dtype} m={m} n={n}: all-reduce differs"
    for path in ("1stage", "2stage"):  # 200 calls back to back, results kept, checked at the end
        sets = [make_inputs(world, 16, 4096, torch.bfloat16, seed=1000 + i) for i in range(200)]
        results = [comm.allreduce_rmsnorm(xs[rank], res, w, path=path) for xs, res, w in sets]
        torch.cuda.synchronize()
        comm.check()
        for (xs, res, w), (out, ro) in zip(sets, results):
            assert_rmsnorm_matches(xs, res, w, 1e-6, out, ro)


def _graphs(comm, rank, world, device):
    n, dtype = 4096, torch.bfloat16
    weight = torch.rand(n, device=device, dtype=dtype) + 0.5
    graphs = {}
    for m in (1, 16, 128):
        xs, residual, _ = make_inputs(world, m, n, dtype, seed=m)
        comm.allreduce_rmsnorm(xs[rank], residual, weight)
        comm.allreduce(xs[rank])
    torch.cuda.synchronize()
    with comm.capture():
        for m in (1, 16, 128):
            xs, residual, _ = make_inputs(world, m, n, dtype, seed=m + 1)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outs = (*comm.allreduce_rmsnorm(xs[rank], residual, weight), comm.allreduce(xs[rank]))
            graphs[m] = (xs, residual, outs, graph)
    for rep in range(3):
        for m in ((1, 16, 128) if rep % 2 == 0 else (128, 16, 1)):
            xs, residual, outs, graph = graphs[m]
            new, new_res, _ = make_inputs(world, m, n, dtype, seed=100 * rep + m)
            xs[rank].copy_(new[rank])
            residual.copy_(new_res)
            for t in outs:
                t.fill_(float("nan"))
            torch.cuda.synchronize()
            graph.replay()
            torch.cuda.synchronize()
            comm.check()
            assert_rmsnorm_matches(new, new_res, weight, 1e-6, outs[0], outs[1])
            assert torch.equal(outs[2], allreduce_reference(new))


def _timeout(comm, rank, world, device, make):
    xs, residual, weight = make_inputs(world, 8, 4096, torch.bfloat16, seed=5)
    comm.allreduce_rmsnorm(xs[rank], residual, weight)
    torch.cuda.synchronize()
    comm.check()
    if rank != world - 1:  # the last rank never calls
        start = time.monotonic()
        out, _ = comm.allreduce_rmsnorm(xs[rank], residual, weight, out=torch.full_like(residual, float("nan")))
        torch.cuda.synchronize()
        assert time.monotonic() - start < TIMEOUT_S + 5
        with pytest.raises(PeerTimeoutError) as info:
            comm.check()
        assert info.value.ranks == (world - 1,)
        with pytest.raises(FusedArError, match="failed earlier"):
            comm.allreduce_rmsnorm(xs[rank], residual, weight)
    with make() as fresh:  # the process stays usable: a new communicator works
        out, ro = fresh.allreduce_rmsnorm(xs[rank], residual, weight)
        torch.cuda.synchronize()
        fresh.check()
        assert_rmsnorm_matches(xs, residual, weight, 1e-6, out, ro)


CHUNK_ROWS = 1000  # the communicator's buffer holds 1000 rows of 8192 fp32


def _chunks(comm, rank, world, device):
    """4096 rows of 8192: 5 launches in fp32, 3 in bf16 (chunks of 1000 and 2000 rows and a shorter last
    one), eager and in a graph, plain and fused."""
    for dtype in (torch.float32, torch.bfloat16):
        xs, residual, weight = make_inputs(world, 4096, 8192, dtype, seed=17)
        for path in ("auto", "1stage", "2stage"):
            out, ro = comm.allreduce_rmsnorm(xs[rank], residual, weight, path=path)
            ar = comm.allreduce(xs[rank], path=path)
            torch.cuda.synchronize()
            comm.check()
            assert_rmsnorm_matches(xs, residual, weight, 1e-6, out, ro)
            assert torch.equal(ar, allreduce_reference(xs)), f"{path} {dtype}: chunked all-reduce differs"
    xs, residual, weight = make_inputs(world, 2500, 8192, torch.float32, seed=18)
    with comm.capture():
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = (*comm.allreduce_rmsnorm(xs[rank], residual, weight), comm.allreduce(xs[rank]))
    new, new_res, _ = make_inputs(world, 2500, 8192, torch.float32, seed=19)
    xs[rank].copy_(new[rank])
    residual.copy_(new_res)
    for t in outs:
        t.fill_(float("nan"))
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()
    comm.check()
    assert_rmsnorm_matches(new, new_res, weight, 1e-6, outs[0], outs[1])
    assert torch.equal(outs[2], allreduce_reference(new))


def _chunk_timeout(comm, rank, world, device, make):
    """The last rank takes part in the first chunk only (a call of exactly its rows) and then stops: the
    others' second chunk times out and the rest give up at once, so the call ends within the timeout."""
    xs, residual, weight = make_inputs(world, 4 * CHUNK_ROWS + 96, 8192, torch.float32, seed=5)
    if rank == world - 1:
        comm.allreduce_rmsnorm(xs[rank][:CHUNK_ROWS], residual[:CHUNK_ROWS], weight)
        torch.cuda.synchronize()
        comm.check()
    else:
        start = time.monotonic()
        comm.allreduce_rmsnorm(xs[rank], residual, weight)
        torch.cuda.synchronize()
        assert time.monotonic() - start < TIMEOUT_S + 3, f"{time.monotonic() - start:.1f} s"
        with pytest.raises(PeerTimeoutError) as info:
            comm.check()
        assert info.value.ranks == (world - 1,)
    with make() as fresh:  # the process stays usable: a new communicator works
        out, ro = fresh.allreduce_rmsnorm(xs[rank], residual, weight)
        torch.cuda.synchronize()
        fresh.check()
        assert_rmsnorm_matches(xs, residual, weight, 1e-6, out, ro)


def _sequence(comm, rank, world, device):
    """reduce_scatter_rmsnorm rows = allreduce_rmsnorm rows, all_gather of them = the whole out; uneven
    shards, and 4096 rows of 8192 fp32 in chunks."""
    for m, dtype in ((1, torch.bfloat16), (7, torch.bfloat16), (100, torch.float16), (4096, torch.float32)):
        xs, residual, weight = make_inputs(world, m, 8192, dtype, seed=m)
        lo, hi = comm.shard_rows(m)
        out, ro = comm.reduce_scatter_rmsnorm(xs[rank], residual[lo:hi], weight)
        gathered = comm.all_gather(out, m)
        full_out, full_ro = comm.allreduce_rmsnorm(xs[rank], residual, weight)
        torch.cuda.synchronize()
        comm.check()
        assert_rmsnorm_matches(xs, residual, weight, 1e-6, full_out, full_ro)
        assert torch.equal(out, full_out[lo:hi]) and torch.equal(ro, full_ro[lo:hi]), f"m={m} rank {rank}"
        assert torch.equal(gathered, full_out), f"m={m} rank {rank}: all_gather"


def _quant(comm, rank, world, device):
    """Quantized outputs of the fused and sequence-parallel ops (FP8 static, per row, per group in fp32 and
    power-of-two scales, packed and MN-major; NVFP4 both scale layouts, MXFP4): each rank's values and scales
    are the reference quantization of its own T out."""
    from tests.gpu.test_fp4_gpu import expected as fp4_expected
    from tests.gpu.test_fp8_gpu import _bits, torch_quant
    from tests.gpu.test_ue8m0_gpu import check

    static = torch.tensor([0.05], device="cuda")
    for m, n, dtype in ((1, 2176, torch.bfloat16), (7, 7168, torch.float16), (130, 2176, torch.float32)):
        xs, residual, weight = make_inputs(world, m, n, dtype, seed=m)
        for path in ("1stage", "2stage"):
            out, ro = comm.allreduce_rmsnorm(xs[rank], residual, weight, path=path)
            for mode, kwargs in (("static", {"scale": static}), ("token", {}), ("group", {"group_size": 128})):
                q, ro8, scales = comm.allreduce_rmsnorm_fp8(xs[rank], residual, weight, path=path, **kwargs)
                ref_q, ref_s = torch_quant(out, mode, "e4m3fn", static, 128)
                torch.cuda.synchronize()
                comm.check()
                assert torch.equal(ro8, ro) and torch.equal(_bits(q), _bits(ref_q)), f"{path} {mode} m={m} rank {rank}"
                assert mode == "static" or torch.equal(scales.reshape(ref_s.shape), ref_s)
            for scales_format, mn_major in (("ue8m0", False), ("ue8m0_packed", True), ("ue8m0_packed", False)):
                q, _, scales = comm.allreduce_rmsnorm_fp8(xs[rank], residual, weight, path=path, group_size=128,
                                                          scales_format=scales_format, scales_mn_major=mn_major)
                torch.cuda.synchronize()
                comm.check()
                check(q, scales, out, 128, scales_format, mn_major)
            for fmt, swizzled in (("nvfp4", True), ("nvfp4", False), ("mxfp4", False), ("mxfp4_rceil", False),
                                  ("mxfp4_even", False)):
                if fmt.startswith("mxfp4") and n % 32:
                    continue
                g = torch.tensor([20.0], device="cuda") if fmt == "nvfp4" else None
                values, _, scales = comm.allreduce_rmsnorm_fp4(xs[rank], residual, weight, path=path, fp4_format=fmt,
                                                               global_scale=g, scales_swizzled=swizzled)
                torch.cuda.synchronize()
                comm.check()
                ref_values, ref_scales = fp4_expected(out, fmt, swizzled, g)
                assert torch.equal(values, ref_values) and torch.equal(scales.view(torch.uint8),
                                                                       ref_scales.view(torch.uint8)), (fmt, path, m)
        assert_rmsnorm_matches(xs, residual, weight, 1e-6, out, ro)
        lo, hi = comm.shard_rows(m)
        q, _, scales = comm.reduce_scatter_rmsnorm_fp8(xs[rank], residual[lo:hi], weight, group_size=128,
                                                       scales_format="ue8m0_packed", scales_mn_major=True)
        torch.cuda.synchronize()
        comm.check()
        check(q, scales, out[lo:hi], 128, "ue8m0_packed", True)


def _mismatch(comm, rank, world, device):
    m = 4 if rank == 0 else 8
    xs, residual, weight = make_inputs(world, m, 4096, torch.bfloat16, seed=m)
    start = time.monotonic()
    out, _ = comm.allreduce_rmsnorm(xs[rank], residual, weight, out=torch.full_like(residual, float("nan")))
    torch.cuda.synchronize()
    assert time.monotonic() - start < TIMEOUT_S, "the mismatch was found by the timeout, not the descriptors"
    with pytest.raises(MismatchError, match=r"m=4.*m=8|m=8.*m=4"):
        comm.check()
    assert torch.isnan(out).all(), f"rank {rank} wrote output for a mismatched call"


def _worker(rank, world, init_file, result_dir, what):
    import torch.distributed as dist

    gpus = torch.cuda.device_count()
    per_gpu = gpus >= world
    device = rank % gpus
    torch.cuda.set_device(device)
    if per_gpu:
        dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world,
                                device_id=torch.device("cuda", device))
        objects = dist.new_group(backend="gloo")
    else:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
        objects = dist.group.WORLD

    def make():
        return Communicator(objects, device=device, max_bytes=CHUNK_ROWS * 8192 * 4, device_group=dist.group.WORLD)
    try:
        with make() as comm:
            assert comm.fallback_reason is None, comm.fallback_reason  # the real probe passed
            if what == "paths":
                _paths_and_stress(comm, rank, world, device, per_gpu)
            elif what == "graphs":
                _graphs(comm, rank, world, device)
            elif what == "timeout":
                _timeout(comm, rank, world, device, make)
            elif what == "mismatch":
                _mismatch(comm, rank, world, device)
            elif what == "sequence":
                _sequence(comm, rank, world, device)
            elif what == "quant":
                _quant(comm, rank, world, device)
            elif what == "chunks":
                _chunks(comm, rank, world, device)
            elif what == "chunk_timeout":
                _chunk_timeout(comm, rank, world, device, make)
        open(os.path.join(result_dir, f"ok-{rank}"), "w").close()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("what", ["paths", "graphs", "timeout", "mismatch", "chunks", "chunk_timeout", "sequence",
                                  "quant"])
@pytest.mark.parametrize("world", [2, 3, 4, 5, 8], ids=lambda w: f"TP{w}")
def test_one_process_per_rank(tmp_path, monkeypatch, world, what):
    gpus = torch.cuda.device_count()
    if gpus < world and (world > 4 or what == "paths" and world > 2):
        pytest.skip(f"{gpus} GPU(s): TP{world} {what} runs with one GPU per rank (sharing one GPU, the "
                    "communicator tests cover it)")
    monkeypatch.setenv("FUSED_AR_TIMEOUT_S", str(TIMEOUT_S if what in ("timeout", "mismatch", "chunk_timeout") else 60))
    monkeypatch.setenv("FUSED_AR_PEER_PROBE", "1")
    spawn_ranks(_worker, world, tmp_path, what)

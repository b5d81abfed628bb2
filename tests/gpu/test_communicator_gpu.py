"""The communicator on one GPU: N ranks in one process (each its own memory and stream, all kernels in
flight together), every path and dtype against the rank-order reference; 200 calls back to back; N
processes sharing the GPU through real IPC; 50 create/close cycles without growth."""

from __future__ import annotations

import os

import pytest
import torch

from fused_ar import Communicator
from fused_ar.errors import InputError
from fused_ar.comm.report import describe_error
from tests.reference import allreduce_reference, assert_rmsnorm_matches, prime_allocator

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
MS = [1, 2, 3, 7, 16, 17, 31, 64, 127, 128, 1000, 4096]
NS = [512, 2880, 4096, 7168, 8192, 16384]
MAX_BYTES = 4096 * 16384 * 4


def emulated_group(ngpus: int, max_bytes: int):
    """The body of a group fixture: N ranks on GPU 0 with a stream each, closed after the module."""
    prime_allocator()
    comms = Communicator.local_group(ngpus, device=0, max_bytes=max_bytes)
    yield comms, [torch.cuda.Stream() for _ in comms]
    torch.cuda.synchronize()
    for c in comms:
        c.close()


@pytest.fixture(scope="module", params=[2, 3, 4, 5, 7, 8], ids=lambda n: f"N{n}")
def group(request):
    yield from emulated_group(request.param, MAX_BYTES)


def run_ranks(group, fn):
    """fn(rank, comm) on every rank, each on its own stream, all enqueued before one synchronize."""
    comms, streams = group
    results = []
    for rank, (comm, stream) in enumerate(zip(comms, streams)):
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            results.append(fn(rank, comm))
    torch.cuda.synchronize()
    for comm in comms:
        code = comm.error_code()
        assert code == 0, f"rank {comm.rank}: {describe_error(code)}"
    return results


def make_inputs(n_ranks, m, n, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    xs = [torch.randn(m, n, device="cuda", dtype=dtype, generator=g) for _ in range(n_ranks)]
    residual = torch.randn(m, n, device="cuda", dtype=dtype, generator=g)
    weight = torch.rand(n, device="cuda", dtype=dtype, generator=g) + 0.5
    return xs, residual, weight


def poisoned(t):
    return torch.full_like(t, float("nan"))


def check_fused(group, xs, residual, weight, path, eps=1e-6):
    # Outputs exist (poisoned) before the first rank launches: no allocation runs while peers spin.
    bufs = [(poisoned(residual), poisoned(residual)) for _ in xs]
    outs = run_ranks(group, lambda r, c: c.allreduce_rmsnorm(xs[r], residual, weight, eps, path=path,
                                                              out=bufs[r][0], residual_out=bufs[r][1]))
    for out, ro in outs:
        assert torch.equal(out, outs[0][0]) and torch.equal(ro, outs[0][1]), "ranks disagree"
    assert_rmsnorm_matches(xs, residual, weight, eps, outs[0][0], outs[0][1])


def check_plain(group, xs, path):
    bufs = [poisoned(x) for x in xs]
    outs = run_ranks(group, lambda r, c: c.allreduce(xs[r], path=path, out=bufs[r]))
    ref = allreduce_reference(xs)
    for out in outs:
        assert torch.equal(out, ref), f"all-reduce differs in {(out != ref).sum().item()} elements"


@pytest.mark.parametrize("path", ["1stage", "2stage"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", NS)
def test_fused_and_plain_against_reference(group, path, dtype, n):
    n_ranks = len(group[0])
    for m in MS:
        xs, residual, weight = make_inputs(n_ranks, m, n, dtype, seed=hash((n_ranks, m, n, str(dtype), path)) % 2**31)
        before = [x.clone() for x in xs]
        check_fused(group, xs, residual, weight, path)
        check_plain(group, xs, path)
        assert all(torch.equal(a, b) for a, b in zip(xs, before)), "an input was written"


@pytest.mark.parametrize("path", ["auto", "1stage", "2stage"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_200_calls_back_to_back(group, path, dtype):
    """No host synchronization between calls: a missing end barrier or a misordered flag shows here."""
    n_ranks, m, n, calls = len(group[0]), 33, 4096, 200
    back_to_back(group, [make_inputs(n_ranks, m, n, dtype, seed=1000 + i) for i in range(calls)], path)


def back_to_back(group, data, path):
    """allreduce_rmsnorm and allreduce of each (xs, residual, weight) in `data` on every rank, all enqueued
    before one synchronize, then every result against the reference and rank 0's."""
    comms, streams = group
    results = [[None] * len(data) for _ in comms]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    for i, (xs, residual, weight) in enumerate(data):
        for rank, (comm, stream) in enumerate(zip(comms, streams)):
            with torch.cuda.stream(stream):
                results[rank][i] = (comm.allreduce_rmsnorm(xs[rank], residual, weight, path=path),
                                    comm.allreduce(xs[rank], path=path))
    torch.cuda.synchronize()
    for i, (xs, residual, weight) in enumerate(data):
        (out, ro), ar = results[0][i]
        assert_rmsnorm_matches(xs, residual, weight, 1e-6, out, ro)
        assert torch.equal(ar, allreduce_reference(xs)), f"call {i}: all-reduce wrong"
        for rank in range(1, len(comms)):
            assert torch.equal(results[rank][i][0][0], out) and torch.equal(results[rank][i][1], ar)


@pytest.mark.parametrize("path", ["1stage", "2stage"])
def test_eager_input_copied_by_the_kernel(group, monkeypatch, path):
    """An eager call's contiguous x goes into the staging buffer inside the kernel (no host copy); strided x
    and out=x take the host copy. Calls of changing m run back to back (a block index owns other rows from
    one call to the next), with every result exact."""
    comms = group[0]
    runtime = type(comms[0]._runtime)
    host_copies = []
    for name in ("copy_async", "copy_rows"):
        real = getattr(runtime, name)
        monkeypatch.setattr(runtime, name, lambda self, *a, _real=real, _name=name: (host_copies.append(_name),
                                                                                       _real(self, *a))[1])
    n_ranks, n, dtype = len(comms), 4096, torch.bfloat16
    shapes = [1, 300, 7, 2048, 33, 1, 1000]
    back_to_back(group, [make_inputs(n_ranks, m, n, dtype, seed=7000 + i) for i, m in enumerate(shapes)], path)
    assert host_copies == [], host_copies
    # rows n + 64 apart: the host copies them packed; out over x: the host copy keeps peers off x
    xs, residual, weight = make_inputs(n_ranks, 40, n + 64, dtype, seed=7100)
    strided = [x[:, :n] for x in xs]
    outs = run_ranks(group, lambda r, c: c.allreduce_rmsnorm(strided[r], residual[:, :n], weight[:n], path=path))
    assert host_copies == ["copy_rows"] * n_ranks, host_copies
    assert_rmsnorm_matches(strided, residual[:, :n], weight[:n], 1e-6, *outs[0])
    ins = [x.clone() for x in xs]
    ref = allreduce_reference(xs)
    run_ranks(group, lambda r, c: c.allreduce(ins[r], path=path, out=ins[r]))
    assert host_copies == ["copy_rows"] * n_ranks + ["copy_async"] * n_ranks, host_copies
    assert all(torch.equal(x, ref) for x in ins)


def test_m_zero_and_errors(group):
    comms, _ = group
    x = torch.empty(0, 4096, device="cuda", dtype=torch.bfloat16)
    out, ro = comms[0].allreduce_rmsnorm(x, x.clone(), torch.ones(4096, device="cuda", dtype=torch.bfloat16))
    assert out.shape == (0, 4096)
    assert comms[0].allreduce(x).shape == (0, 4096)
    with pytest.raises(ValueError, match="path="):
        comms[0].allreduce(torch.ones(64, device="cuda"), path="3stage")
    # values the per-call plan key cannot hold: the full checks name them (an InputError, never a TypeError)
    x = torch.ones(4, 4096, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(InputError, match=r"path=\['auto'\]"):
        comms[0].allreduce(x, path=["auto"])
    with pytest.raises(InputError, match=r"path=\['auto'\]"):
        comms[0].allreduce_rmsnorm(x, x.clone(), None, path=["auto"])
    with pytest.raises(InputError, match=r"group_size=\[128\]"):
        comms[0].allreduce_rmsnorm_fp8(x, x.clone(), None, group_size=[128])


def test_create_close_50_times_without_growth():
    from fused_ar.backends import current_runtime

    rt = current_runtime()
    streams = [torch.cuda.Stream() for _ in range(2)]
    x = torch.randn(8, 1024, device="cuda")

    def cycle():
        comms = Communicator.local_group(2, 0, max_bytes=8 << 20)
        run_ranks((comms, streams), lambda r, c: c.allreduce(x))
        for c in comms:
            c.close()
            c.close()  # idempotent
        torch.cuda.empty_cache()  # torch's cached blocks are not ours: leave them out of the count

    cycle()  # warm the runtime, the kernels and torch's allocator
    free_before, _ = rt.mem_get_info(0)
    for _ in range(50):
        cycle()
    free_after, _ = rt.mem_get_info(0)
    assert free_before - free_after < 16 << 20, f"device memory grew by {(free_before - free_after) >> 20} MiB"


# -- N processes sharing the GPU through real IPC ------------------------------------------------------
def spawn_ranks(worker, world, tmp_path, *args):
    """Runs worker(rank, world, init_file, result_dir, *args) in `world` processes, each writing "ok-<rank>"
    when done. A failure names every rank's own error (its traceback, or the stack faulthandler wrote when
    a signal killed it), not only that of the first rank torch.multiprocessing noticed."""
    import torch.multiprocessing as mp

    try:
        mp.spawn(_recorded, args=(worker, world, str(tmp_path / "store"), str(tmp_path), args), nprocs=world,
                 join=True)
    except Exception as e:
        reports = "".join(f"\n--- {p.name}\n{p.read_text()}" for p in sorted(tmp_path.glob("report-*"))
                          if p.stat().st_size)
        raise AssertionError(f"{e}\nper-rank reports:{reports or ' none written'}") from e
    assert sorted(p.name for p in tmp_path.glob("ok-*")) == [f"ok-{r}" for r in range(world)]


def _recorded(rank, worker, world, init_file, result_dir, args):
    import faulthandler
    import traceback

    with open(os.path.join(result_dir, f"report-{rank}"), "w") as report:
        faulthandler.enable(file=report)
        try:
            worker(rank, world, init_file, result_dir, *args)
        except BaseException:
            traceback.print_exc(file=report)
            raise
        finally:
            faulthandler.disable()


def _mp_worker(rank, world, init_file, result_dir):
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        with Communicator(device=0, max_bytes=8 << 20) as comm:
            for m, n, dtype in [(1, 4096, torch.bfloat16), (17, 2880, torch.float16), (64, 8192, torch.float32)]:
                xs, residual, weight = make_inputs(world, m, n, dtype, seed=m * 7 + n)
                for path in ("1stage", "2stage", "auto"):
                    out, ro = comm.allreduce_rmsnorm(xs[rank], residual, weight, path=path)
                    ar = comm.allreduce(xs[rank], path=path)
                    torch.cuda.synchronize()
                    assert comm.error_code() == 0, f"rank {rank} timed out ({comm.error_code():#x})"
                    assert_rmsnorm_matches(xs, residual, weight, 1e-6, out, ro)
                    assert torch.equal(ar, allreduce_reference(xs)), f"{path} all-reduce wrong on rank {rank}"
        if world == 2:  # 50 create/close cycles with real IPC handles: no device memory or fd growth
            from fused_ar.backends import current_runtime

            rt = current_runtime()
            Communicator(device=0, max_bytes=1 << 20).close()
            torch.cuda.empty_cache()
            # Free memory is the GPU's, shared with the peer process: read it only where both ranks have
            # closed everything (a communicator of the peer's, still open, would count as ours).
            dist.barrier()
            free0, fds0 = rt.mem_get_info(0)[0], len(os.listdir("/proc/self/fd"))
            for _ in range(50):
                Communicator(device=0, max_bytes=4 << 20).close()
            dist.barrier()
            free1, fds1 = rt.mem_get_info(0)[0], len(os.listdir("/proc/self/fd"))
            assert free0 - free1 < 16 << 20 and fds1 <= fds0 + 2, (free0 - free1, fds0, fds1)
        open(os.path.join(result_dir, f"ok-{rank}"), "w").close()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3, 4])
def test_processes_sharing_the_gpu(tmp_path, world):
    spawn_ranks(_mp_worker, world, tmp_path)

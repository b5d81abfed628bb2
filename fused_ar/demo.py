"""`python -m fused_ar demo`: the fused op on the GPUs that exist, checked, with a latency table per path.

One GPU: N ranks in one process (Communicator.local_group), labelled a single-GPU emulation (all ranks
share one GPU's SMs and memory). Several GPUs: one process per GPU over a gloo group.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any

from . import env

PATHS = ("1stage", "2stage", "auto")
ITERS = 50


def _inputs(torch: Any, world: int, m: int, n: int, seed: int) -> tuple[list, Any, Any]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    xs = [torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(world)]
    return xs, torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=g), \
        torch.rand(n, device="cuda", dtype=torch.bfloat16, generator=g) + 0.5


def _check(torch: Any, xs: list, residual: Any, weight: Any, out: Any, ro: Any) -> None:
    acc = torch.zeros_like(residual, dtype=torch.float32)
    for x in xs:
        acc = acc + x.float()
    ref_ro = (acc.to(residual.dtype).float() + residual.float()).to(residual.dtype)
    if not torch.equal(ro, ref_ro):
        raise SystemExit("demo: residual_out differs from the rank-order reference")
    ref = ref_ro.double() * torch.rsqrt(ref_ro.double().square().mean(-1, keepdim=True) + 1e-6) * weight.double()
    if ((out.double() - ref).abs() > 2 * ref.abs() * 2.0**-8 + 1e-30).any():
        raise SystemExit("demo: out differs from the reference by more than 1 ulp")


def _emulated(torch: Any, world: int, ms: list[int], n: int) -> dict:
    from .comm.communicator import Communicator

    comms = Communicator.local_group(world, 0, max_bytes=max(ms) * n * 2)
    streams = [torch.cuda.Stream() for _ in comms]
    rows = {}
    try:
        for m in ms:
            xs, residual, weight = _inputs(torch, world, m, n, seed=m)
            for path in PATHS:
                def step():
                    res = []
                    for r, (c, s) in enumerate(zip(comms, streams)):
                        with torch.cuda.stream(s):
                            res.append(c.allreduce_rmsnorm(xs[r], residual, weight, path=path))
                    return res
                torch.cuda.synchronize()
                for s in streams:
                    s.wait_stream(torch.cuda.current_stream())
                out, ro = step()[0]
                torch.cuda.synchronize()
                _check(torch, xs, residual, weight, out, ro)
                # All ranks' calls in one CUDA graph, one branch per rank stream, so the device time is
                # measured rather than Python's launch rate (which paces eager emulated ranks).
                capture = torch.cuda.Stream()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=capture):
                    for _ in range(ITERS):
                        for s in streams:
                            s.wait_stream(capture)
                        step()
                        for s in streams:
                            capture.wait_stream(s)
                for c in comms:  # the captured calls read x in place: every rank learns its peers' x
                    c.register_graph_buffers()
                graph.replay()
                torch.cuda.synchronize()
                times = []
                for _ in range(5):
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    graph.replay()
                    b.record()
                    torch.cuda.synchronize()
                    times.append(a.elapsed_time(b) * 1e3 / ITERS)
                rows[(m, path)] = sorted(times)[len(times) // 2]
                for c in comms:
                    c.check()  # what a rank's kernels recorded (timeout, mismatch, ...), as its exception
    finally:
        torch.cuda.synchronize()
        for c in comms:
            c.close()
    return rows


def _worker(rank: int, world: int, init_file: str, ms: list[int], n: int, out_file: str) -> None:
    import json

    import torch
    import torch.distributed as dist

    from .comm.communicator import Communicator

    torch.cuda.set_device(rank)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    rows = {}
    with Communicator(device=rank, max_bytes=max(ms) * n * 2) as comm:
        for m in ms:
            xs, residual, weight = _inputs(torch, world, m, n, seed=m)
            for path in PATHS:
                out, ro = comm.allreduce_rmsnorm(xs[rank], residual, weight, path=path)
                torch.cuda.synchronize()
                _check(torch, xs, residual, weight, out, ro)
                graph = torch.cuda.CUDAGraph()
                with comm.capture(), torch.cuda.graph(graph):
                    for _ in range(ITERS):
                        comm.allreduce_rmsnorm(xs[rank], residual, weight, path=path)
                dist.barrier()
                graph.replay()
                torch.cuda.synchronize()
                dist.barrier()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                graph.replay()
                b.record()
                torch.cuda.synchronize()
                rows[f"{m},{path}"] = a.elapsed_time(b) * 1e3 / ITERS
    every: list = [None] * world
    dist.all_gather_object(every, rows)
    if rank == 0:
        with open(out_file, "w") as f:
            json.dump({k: max(r[k] for r in every) for k in rows}, f)
    dist.destroy_process_group()


def run_demo(args: argparse.Namespace) -> int:
    import json

    env.reserve_rank_queues()
    import torch

    from .device.validate import require_gpu
    from .jit.kernels import CROSS_GPU_NGPUS

    require_gpu("python -m fused_ar demo")
    gpus = torch.cuda.device_count()
    tables = {}
    if gpus >= 2:
        import torch.multiprocessing as mp

        world = min(gpus, max(CROSS_GPU_NGPUS))
        with tempfile.TemporaryDirectory() as tmp:
            out_file = os.path.join(tmp, "rows.json")
            mp.spawn(_worker, args=(world, os.path.join(tmp, "store"), args.m, args.n, out_file), nprocs=world)
            rows = json.load(open(out_file))
        tables[world] = {(int(k.split(",")[0]), k.split(",")[1]): v for k, v in rows.items()}
        label = f"{world} GPUs, one process each"
    else:
        for world in args.tp:
            tables[world] = _emulated(torch, world, args.m, args.n)
        label = f"single-GPU emulation: N ranks in one process on one {torch.cuda.get_device_name(0)}"
    print(f"fused_ar demo: allreduce_rmsnorm, bf16, n={args.n}; {label}; results checked against the "
          f"rank-order reference; latency per call in us ({ITERS} calls in a CUDA graph, median of 5 replays, max over ranks)")
    print("| N | m | " + " | ".join(PATHS) + " |")
    print("| ---: | ---: | " + " | ".join("---:" for _ in PATHS) + " |")
    for world, rows in tables.items():
        for m in args.m:
            print(f"| {world} | {m} | " + " | ".join(f"{rows[(m, p)]:.1f}" for p in PATHS) + " |")
    return 0

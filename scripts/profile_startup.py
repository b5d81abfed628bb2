"""Where a Communicator's construction spends its time after the first per boot: 2 processes sharing GPU 0
(gloo group), rank 0 constructs under cProfile; the top of the profile by cumulative and by own time, and
each CUDA driver call the constructions and closes make with its count and total time, on stdout:

    PYTHONPATH=. python3 scripts/profile_startup.py [--replays 3]

The first construction per boot runs the real peer probe; it is made once before the profiled ones.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _driver_timer(totals: dict[str, list[float]]) -> None:
    """Times every driver call of fused_ar's CUDA runtime by name (cProfile sees them all as one ctypes
    call)."""
    from fused_ar.backends.nvidia.runtime import CudaRuntime

    call = CudaRuntime._call

    def timed(self, name, *args, **kwargs):
        start = time.perf_counter()
        try:
            return call(self, name, *args, **kwargs)
        finally:
            totals.setdefault(name, []).append(time.perf_counter() - start)
    CudaRuntime._call = timed


def rank(i: int, store: str, replays: int) -> None:
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method="file://" + store, rank=i, world_size=2)
    import fused_ar

    fused_ar.Communicator(device=0, max_bytes=8 << 20).close()  # the probe's verdict is on disk after this
    totals: dict[str, list[float]] = {}
    if i == 0:
        _driver_timer(totals)
    for replay in range(replays):
        dist.barrier()
        profiler = cProfile.Profile()
        t0 = time.perf_counter()
        if i == 0:
            profiler.enable()
        comm = fused_ar.Communicator(device=0, max_bytes=8 << 20)
        if i == 0:
            profiler.disable()
        ms = (time.perf_counter() - t0) * 1e3
        dist.barrier()
        comm.close()
        if i != 0:
            continue
        print(f"== construction {replay}: {ms:.1f} ms")
        if replay == replays - 1:  # the last one's profile, by cumulative and by own time
            for key in ("cumulative", "tottime"):
                text = io.StringIO()
                pstats.Stats(profiler, stream=text).sort_stats(key).print_stats(28)
                print(text.getvalue().split("\n", 6)[-1], end="")
    if i == 0:
        print("== CUDA calls over all constructions (and closes): count, total ms")
        for name, times in sorted(totals.items(), key=lambda kv: -sum(kv[1])):
            print(f"{name:44s} {len(times):5d} {sum(times) * 1e3:9.2f}")
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replays", type=int, default=3)
    args = parser.parse_args()
    if args.replays < 1:
        parser.error(f"--replays {args.replays}: at least 1")
    if not torch.cuda.is_available():
        sys.exit(f"profile_startup.py needs a GPU; torch {torch.__version__} sees none")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(rank, args=(os.path.join(tmp, "store"), args.replays), nprocs=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

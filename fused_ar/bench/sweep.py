"""`python -m fused_ar bench`: every path and baseline over TP x hidden x dtype x m in one run, launched
across the GPUs that exist (one process per GPU), or on a single GPU as N ranks in one process (every
output labelled a single-GPU emulation). Each path is checked against the reference before it is timed;
the outputs, crossovers and thresholds come from fused_ar.bench.report.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from .. import env
from .._version import __version__
from ..errors import InputError
from ..comm.ipc import GRAPH_TABLES
from ..jit.spec import DType
from .group import Group
from .paths import BY_NAME, Needs
from .results import Point, Run

MIN_MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class Sweep:
    """What to measure: picklable, handed to every worker process."""

    tps: tuple[int, ...]
    ms: tuple[int, ...]
    hiddens: tuple[int, ...]
    dtypes: tuple[str, ...]
    paths: tuple[str, ...]
    calls: int
    replays: int
    command: str
    eps: float = 1e-6
    seed: int = 2026

    def points_per_tp(self) -> int:
        return len(self.ms) * len(self.hiddens) * len(self.dtypes) * len(self.paths)

    def check(self) -> None:
        if not 1 <= self.calls <= GRAPH_TABLES:
            raise InputError(f"--graph-calls {self.calls}: must be 1..{GRAPH_TABLES} (graph tables per communicator)")
        if self.replays < 1:
            raise InputError(f"--replays {self.replays}: must be at least 1")
        bad = [m for m in self.ms if m < 1] + [h for h in self.hiddens if h < 1]
        if bad:
            raise InputError(f"--m and --hidden take positive sizes, not {bad}")


# -- one process's part ---------------------------------------------------------------------------------
class Progress:
    """A bar on a terminal, else a line per point; only the leader reports."""

    def __init__(self, total: int, label: str, active: bool) -> None:
        self.active, self.done, self.total, self.bar = active, 0, total, None
        if active and sys.stderr.isatty():
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc=label, unit="point", file=sys.stderr)
            except ImportError:
                pass

    def step(self, text: str) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=False)
            self.bar.update(1)
        elif self.active:
            print(f"[{self.done}/{self.total}] {text}", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _agreed_check(group: Group, check: Any) -> None:
    """Runs `check` on every rank; if it fails on any, every rank raises (none waits for the others in a
    collective that will never come)."""
    from .steps import BenchError

    try:
        check()
        failure = None
    except BenchError as exc:
        failure = str(exc)
    failure = group.agree(failure)
    if failure is not None:
        raise BenchError(failure)


def measure(group: Group, sweep: Sweep, run: Run, case: Any, name: str) -> Optional[str]:
    """Times one path on one case (checked first); adds the point to `run` on the leader. Returns a
    reason when a baseline cannot run here (our own paths raise instead)."""
    import torch

    from . import steps, timing

    path = BY_NAME[name]
    group.open(max(MIN_MAX_BYTES, case.nbytes) if path.buffer_bytes is None else path.buffer_bytes)
    built: list[Any] = []
    reason = None
    try:
        built = [steps.build(path, case, i) for i in range(len(group.local))]
    except Exception as exc:
        if path.needs is Needs.IPC:
            raise
        reason = f"{type(exc).__name__}: {exc}"
    reason = group.agree(reason)
    try:
        if reason is not None:
            return reason
        for step in built:
            step.reset()
        case.poison()
        _agreed_check(group, lambda: steps.verify(path, case, group.each(lambda i, _: built[i].run())))
        graphs, last = timing.capture(group, sweep.calls, lambda i: built[i].run())
        case.poison()
        group.each(lambda i, _: graphs[i].replay())  # warm, and the graph's outputs checked
        if all(step.repeatable for step in built):
            _agreed_check(group, lambda: steps.verify(path, case, last))
        times = group.gather(timing.replay_times(group, graphs, sweep.calls, sweep.replays))
        if times is not None:
            run.add(Point(group.world, case.hidden, DType.parse(case.dtype).value, case.m, name, sweep.calls,
                          tuple(tuple(t) for t in times)))
        del graphs, last
        return None
    finally:
        torch.cuda.synchronize(group.device)
        for step in built:
            step.close()
        group.close()


def sweep_group(group: Group, sweep: Sweep, mode: str) -> Run:
    """Every (dtype, hidden, m, path) of the sweep on this group; the leader's Run holds the results."""
    import torch

    from ..reference import prime_allocator
    from .steps import Case, unavailable

    run = Run(sweep.command, modes={group.world: mode}, emulated={group.world: group.emulated})
    runnable = []
    for name in sweep.paths:
        reason = group.agree(unavailable(BY_NAME[name], group))
        if reason is None:
            runnable.append(name)
        else:
            run.skip(group.world, name, reason)
    progress = Progress(sweep.points_per_tp(), f"TP{group.world}", group.is_leader)
    prime_allocator(group.device)
    try:
        for dtype in sweep.dtypes:
            for hidden in sweep.hiddens:
                for m in sweep.ms:
                    case = Case(group, hidden, m, getattr(torch, DType.parse(dtype).torch_name), sweep.eps,
                                sweep.seed + m)
                    for name in sweep.paths:
                        if name in runnable:
                            reason = measure(group, sweep, run, case, name)
                            if reason is not None:
                                runnable.remove(name)
                                run.skip(group.world, name, f"failed at m={m} hidden={hidden}: {reason}")
                        point = run.find(group.world, hidden, DType.parse(dtype).value, m, name)
                        progress.step(f"TP{group.world} {dtype} hidden={hidden} m={m} {name}: "
                                      + (f"{point.best_us:.2f} us" if point else "skipped"))
                    del case
    finally:
        progress.close()
        group.close()
    return run


def _worker(rank: int, world: int, sweep: Sweep, init_file: str, result_file: str) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    try:
        objects = dist.new_group(backend="gloo")
        group = Group(world, rank, emulated=False, rank=rank, object_group=objects, device_group=dist.group.WORLD)
        run = sweep_group(group, sweep, f"{world} GPUs, one process each")
        if rank == 0:
            run.save(Path(result_file))
    finally:
        dist.destroy_process_group()


# -- the whole run --------------------------------------------------------------------------------------
def environment() -> dict[str, Any]:
    """What the numbers depend on, as read now: GPUs, driver, clocks, library versions, relevant env."""
    import torch

    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
        "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None), "fused_ar": __version__,
        "gpus": [torch.cuda.get_device_name(d) for d in range(torch.cuda.device_count())],
        "env": {k: v for k, v in os.environ.items()
                if k.startswith(("FUSED_AR_", "NCCL_", "RCCL_", "TORCH_SYMM_MEM", "NVSHMEM_", "CUDA_DEVICE_MAX"))},
    }
    try:
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as exc:
        info["nccl"] = f"not read: {exc}"
    query = ["nvidia-smi", "--query-gpu=index,name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,"
             "clocks.max.mem,power.draw,temperature.gpu,pstate", "--format=csv"]
    if getattr(torch.version, "hip", None):
        query = ["rocm-smi", "--showclocks", "--showdriverversion", "--csv"]
    try:
        info["clocks"] = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        info["clocks"] = f"not read: {exc}"
    return info


def plan(sweep: Sweep, gpus: int, one_process: bool) -> dict[int, Optional[bool]]:
    """Per TP: True (emulated on GPU 0), False (one process per GPU), None (cannot run here)."""
    return {tp: True if one_process or gpus == 1 else (False if gpus >= tp else None) for tp in sweep.tps}


def run_sweep(args: argparse.Namespace) -> int:
    env.reserve_rank_queues()
    import torch

    from ..device.launch import arch_of
    from . import report, timing

    sweep = Sweep(tuple(args.tp), tuple(args.m), tuple(args.hidden), tuple(d.value for d in args.dtype),
                  tuple(args.paths), args.graph_calls, args.replays,
                  "python -m fused_ar bench " + " ".join(shlex.quote(a) for a in args.argv))
    sweep.check()
    from ..device.validate import require_gpu

    require_gpu("python -m fused_ar bench")
    gpus = torch.cuda.device_count()
    modes = plan(sweep, gpus, args.one_process)
    if args.write_thresholds and not any(m is False for m in modes.values()):
        raise InputError("--write-thresholds needs one process per GPU: a single-GPU emulation does not measure "
                         f"N GPUs (this machine has {gpus} GPU(s), TPs {list(sweep.tps)})")
    run = Run(sweep.command, environment())
    copy_bw = timing.copy_bandwidth(0)
    peer_bw = timing.peer_bandwidth(0, 1) if gpus > 1 and not args.one_process else copy_bw
    run.environment.update(copy_bandwidth_GBps=copy_bw / 1e9, peer_bandwidth_GBps=peer_bw / 1e9)
    print(f"fused_ar bench: {gpus} GPU(s) ({', '.join(sorted(set(run.environment['gpus'])))}); copy bandwidth "
          f"{copy_bw / 1e9:.0f} GB/s" + (f", peer {peer_bw / 1e9:.0f} GB/s" if peer_bw is not copy_bw else ""),
          flush=True)
    for tp, emulated in modes.items():
        if emulated is None:
            run.modes[tp] = f"not run: {gpus} GPUs here, TP{tp} needs {tp} (or --one-process)"
            for name in sweep.paths:
                run.skip(tp, name, run.modes[tp])
            continue
        if emulated:
            group = Group(tp, 0, emulated=True)
            part = sweep_group(group, sweep, f"single-GPU emulation: {tp} ranks in one process on one "
                                             f"{torch.cuda.get_device_name(0)}")
        else:
            import torch.multiprocessing as mp

            with tempfile.TemporaryDirectory() as tmp:
                result = os.path.join(tmp, "run.json")
                mp.spawn(_worker, args=(tp, sweep, os.path.join(tmp, "store"), result), nprocs=tp)
                part = Run.load(Path(result))
        run.merge(part)
        for tp_, hidden, dtype in part.cases():
            for m in part.ms(tp_, hidden, dtype):
                nbytes = m * hidden * DType.parse(dtype).itemsize
                run.set_floor(tp_, hidden, dtype, m, timing.floor_us(tp_, nbytes, emulated, copy_bw, peer_bw))
    out = Path(args.out)
    files = report.write_all(run, out)
    found = report.crossovers(run)
    if args.write_thresholds:
        from ..comm.thresholds import write

        arch = arch_of(0)
        for tp, emulated in modes.items():
            if emulated is False:
                files.append(write(report.thresholds_for(run, arch, tp)))
            elif emulated:
                print(f"thresholds for TP{tp} not written: measured on a single-GPU emulation")
    print(report.summary(run, found, files))
    return 0

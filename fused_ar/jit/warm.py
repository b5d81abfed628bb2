"""Warming the cache ahead: a list of specs compiled through the default cache in worker processes.

Workers ignore Ctrl-C (the parent stops them at once) and exit when the parent dies (a watchdog on the
parent's pid). A worker that dies takes only its own kernel down: the unfinished kernels are retried
one worker at a time, which names the one that kills its worker. What to warm and how to report it
belong to the caller (fused_ar.cli).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
import warnings
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from .compiler import Compiler
from .spec import KernelSpec

_WATCH_PERIOD_S = 0.2


@dataclass(frozen=True)
class Result:
    """One spec's outcome in a warm run."""

    spec: KernelSpec
    status: str  # built | cached | failed
    seconds: float
    saved: bool = True
    error: str = ""


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(_WATCH_PERIOD_S)
    os._exit(1)  # orphaned: nobody waits for this kernel any more


def _worker_init(parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    warnings.simplefilter("ignore", RuntimeWarning)  # the parent states the cache's condition once
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True, name="fused_ar-watch-parent").start()


def target_cache(into: Optional[str]) -> Any:
    """The default cache, or the layer `into` (written shared: 0755 directories, 0644 files; nothing else
    read, so the layer gets every kernel)."""
    from .. import env
    from .cache import KernelCache, default_cache

    if into is None:
        return default_cache()
    return KernelCache(Path(into), env.lock_dir(), env.LOCK_TIMEOUT_S.get(), shared=True)


def warm_one(spec_dict: dict, into: Optional[str], compiler_for: Callable[[str], Compiler]) -> tuple[dict, str, float, bool, str]:
    """Worker: one spec through the default cache (or the layer `into`), built by `compiler_for(arch)` on a
    miss -> (spec, status, seconds, saved, error)."""
    start = time.perf_counter()
    try:
        spec = KernelSpec.from_dict(spec_dict)
        lookup = target_cache(into).get(spec, compiler_for(spec.arch))
        return spec_dict, lookup.status, lookup.seconds, lookup.saved, ""
    except Exception as exc:  # reported per kernel; the caller counts it as failed
        return spec_dict, "failed", time.perf_counter() - start, False, f"{type(exc).__name__}: {exc}"


def _stop(pool: ProcessPoolExecutor) -> None:
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        if process.is_alive():
            process.kill()
    pool.shutdown(wait=False, cancel_futures=True)


def warm(specs: Sequence[KernelSpec], jobs: int, on_result: Callable[[Result], None],
         compiler_for: Callable[[str], Compiler], work: Callable[..., tuple] = warm_one,
         into: Optional[str] = None) -> None:
    """Compiles `specs` with `jobs` workers, calling `on_result` once per spec as each finishes. On
    KeyboardInterrupt the workers are killed before it propagates. `compiler_for(arch)` gives the compiler
    (fused_ar.backends.compiler_for: the caller picks the backend); it and `work`, what a worker runs per
    spec (as `warm_one`), are module-level functions, which reach the workers by name."""
    pending, ctx = list(specs), multiprocessing.get_context("spawn")
    while pending:
        pool = ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_worker_init,
                                   initargs=(os.getpid(),))
        futures: dict[Future, KernelSpec] = {pool.submit(work, s.to_dict(), into, compiler_for): s for s in pending}
        finished: set[KernelSpec] = set()
        broken = False
        try:
            for future in as_completed(futures):
                try:
                    spec_dict, status, seconds, saved, error = future.result()
                except BrokenProcessPool:
                    broken = True
                    break
                finished.add(futures[future])
                on_result(Result(futures[future], status, seconds, saved, error))
        except BaseException:
            _stop(pool)
            raise
        if not broken:
            pool.shutdown(wait=True)
            return
        _stop(pool)
        for future, spec in futures.items():  # done before the pool broke
            if spec not in finished and future.done() and not future.cancelled() and future.exception() is None:
                spec_dict, status, seconds, saved, error = future.result()
                finished.add(spec)
                on_result(Result(spec, status, seconds, saved, error))
        pending = [s for s in pending if s not in finished]
        if jobs == 1 and pending:  # one worker takes kernels in order: the first unfinished one killed it
            on_result(Result(pending[0], "failed", 0.0, False, "the worker process compiling it died"))
            pending = pending[1:]
        jobs = 1

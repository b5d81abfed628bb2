"""`python -m fused_ar bench host`: the CPU cost of one eager call of each public op and each torch.ops
wrapper, with and without preallocated outputs, beside torch's single launch and torch's add + rms_norm,
measured in the same run.

Method: each call timed alone with perf_counter (the loop around it, the stream switches between ranks of a
local group and the synchronizations are outside the timing); 300 calls per run after 50 warm-up calls,
the GPU never waited on inside a run; the median over 7 runs of the mean per call. Communicator ops run on
a local group (N ranks in this process on GPU 0, each on its own stream), every rank calling each time;
the figure is per rank call. FP8 (float8_e4m3fn: a static scale; groups of 128 where n allows) and NVFP4
rows sit beside their bf16 counterparts. Each torch.ops row is followed by the same call into ops of the same
schemas whose kernels return at once (`dispatch_floor_ops`): the dispatcher's own cost, which no change of
ours can take off. `--profile` adds cProfile's top functions for the direct fused calls, the allocating call
and the torch.ops wrappers.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time
from typing import Any, Callable

from .results import publish

WARMUP = 50
CALLS = 300
RUNS = 7

# torch.ops namespace of the dispatch floor: each torch.ops.fused_ar op's schema with a kernel that returns at once.
FLOOR_LIBRARY = "fused_ar_dispatch_floor"
_floor_libraries: dict[str, Any] = {}  # dispatch key -> its Library (a namespace is defined once per process)


def dispatch_floor_ops(torch: Any, dispatch_key: str = "CUDA") -> Any:
    """torch.ops.fused_ar_dispatch_floor: the schemas of torch.ops.fused_ar (fused_ar.torch_ops.SCHEMAS), each
    with a kernel for `dispatch_key` that returns tensors made once, of the op's arity: a call shaped like
    ours costs there what the dispatcher itself costs (parsing the arguments against the schema, boxing
    them, calling a Python kernel and unboxing its result), the floor under our torch.ops rows."""
    from ..torch_ops import SCHEMAS

    if dispatch_key not in _floor_libraries:
        if _floor_libraries:
            raise ValueError(f"the dispatch floor is defined for {next(iter(_floor_libraries))} in this process")
        lib = torch.library.Library(FLOOR_LIBRARY, "DEF")
        device = "cuda" if dispatch_key == "CUDA" else "cpu"
        for name, schema in SCHEMAS.items():
            lib.define(schema)
            made = tuple(torch.empty(0, device=device) for _ in range(schema.rpartition("->")[2].count("Tensor")))
            result = None if not made else made[0] if len(made) == 1 else made
            lib.impl(name, lambda *args, result=result, **kwargs: result, dispatch_key)
        _floor_libraries[dispatch_key] = lib
    return getattr(torch.ops, FLOOR_LIBRARY)


def torch_op_calls(ns: Any, x: Any, residual: Any, weight: Any, eps: float, scale: Any, fp8_dtype: Any,
                   handle: int) -> dict[tuple[str, str], Callable[[], Any]]:
    """The torch.ops rows' calls into the namespace `ns` (torch.ops.fused_ar, or the dispatch floor's), by (op,
    what the row adds to its name); `handle` names the rank's communicator (unused by the local ops)."""
    return {
        ("add_rmsnorm", ""): lambda: ns.add_rmsnorm(x, residual, weight, eps),
        ("add_rmsnorm_fp8", ", static scale"): lambda: ns.add_rmsnorm_fp8(x, residual, weight, eps, scale=scale,
                                                                          fp8_dtype=fp8_dtype),
        ("allreduce_rmsnorm", ""): lambda: ns.allreduce_rmsnorm(x, residual, weight, eps, handle, "auto"),
        ("allreduce", ""): lambda: ns.allreduce(x, handle, "auto"),
        ("allreduce_rmsnorm_fp8", ", static scale"): lambda: ns.allreduce_rmsnorm_fp8(
            x, residual, weight, eps, handle, "auto", scale=scale, fp8_dtype=fp8_dtype),
    }


def torch_op_rows(torch: Any, floor: Any, local: bool) -> list[tuple[str, Any, tuple[str, str]]]:
    """(row name, namespace, torch_op_calls key) of each torch.ops row and, after it, its dispatch floor's:
    the local ops, or (`local` False) those that name a communicator."""
    rows = []
    for op, note in torch_op_calls(floor, None, None, None, 0.0, None, None, 0):
        if op.startswith("add_") == local:
            rows.append((f"`torch.ops.fused_ar.{op}`{note}", torch.ops.fused_ar, (op, note)))
            rows.append((f"`torch.ops` dispatch alone: `{op}`'s call{note}", floor, (op, note)))
    return rows


def _time_rank_calls(torch: Any, calls: list[Callable[[], Any]], streams: list[Any]) -> float:
    """Median over RUNS of the mean host microseconds of one call (one call per rank per step)."""
    def run(n: int) -> float:
        spent = 0.0
        for _ in range(n):
            for call, stream in zip(calls, streams):
                with torch.cuda.stream(stream):
                    start = time.perf_counter()
                    call()
                    spent += time.perf_counter() - start
        return spent / (n * len(calls)) * 1e6

    run(WARMUP)
    torch.cuda.synchronize()
    means = []
    for _ in range(RUNS):
        means.append(run(CALLS))
        torch.cuda.synchronize()
    return statistics.median(means)


def _profile(torch: Any, call: Callable[[], Any], streams: list[Any], calls: list[Callable[[], Any]],
             top: int = 12) -> str:
    prof = cProfile.Profile()
    for _ in range(WARMUP):
        for c, s in zip(calls, streams):
            with torch.cuda.stream(s):
                c()
    torch.cuda.synchronize()
    for _ in range(CALLS):
        for c, s in zip(calls, streams):
            with torch.cuda.stream(s):
                if c is call:
                    prof.enable()
                    c()
                    prof.disable()
                else:
                    c()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def bench_host(args: argparse.Namespace) -> int:
    import torch
    import torch.nn.functional as F

    import fused_ar.torch_ops  # noqa: F401  (defines torch.ops.fused_ar.*)

    from ..comm.communicator import Communicator
    from ..device.ops import add_rmsnorm, add_rmsnorm_fp4, add_rmsnorm_fp8
    from ..reference import prime_allocator
    from ..device.validate import require_gpu
    from .peers import NVFP4_GLOBAL_SCALE

    require_gpu("python -m fused_ar bench host")
    m, n, tp, eps = args.m[0], args.hidden[0], args.tp[0], 1e-6
    dtype = getattr(torch, args.dtype[0].torch_name)
    prime_allocator()
    g = torch.Generator(device="cuda").manual_seed(0)
    xs = [torch.randn(m, n, device="cuda", dtype=dtype, generator=g) for _ in range(tp)]
    residual = torch.randn(m, n, device="cuda", dtype=dtype, generator=g)
    weight = torch.rand(n, device="cuda", dtype=dtype, generator=g) + 0.5
    outs = [(torch.empty_like(residual), torch.empty_like(residual), torch.empty_like(residual)) for _ in range(tp)]
    scratch = torch.empty_like(residual)
    scale = torch.tensor([0.05], device="cuda", dtype=torch.float32)
    global_scale = torch.tensor([NVFP4_GLOBAL_SCALE], device="cuda", dtype=torch.float32)
    group = 128 if n % 128 == 0 else None
    fp8_dtype = torch.float8_e4m3fn
    q8 = [torch.empty((m, n), device="cuda", dtype=fp8_dtype) for _ in range(tp)]
    g8 = add_rmsnorm_fp8(xs[0], residual, weight, eps, group_size=group, fp8_dtype=fp8_dtype) if group else None
    q4 = add_rmsnorm_fp4(xs[0], residual, weight, eps, global_scale=global_scale) if n % 16 == 0 else None
    comms = Communicator.local_group(tp, 0, max_bytes=max(1 << 20, xs[0].numel() * xs[0].element_size()))
    streams = [torch.cuda.Stream() for _ in comms]
    one = [torch.cuda.current_stream()]
    rows: list[tuple[str, float]] = []
    profiles: dict[str, str] = {}
    try:
        local = {
            "torch `x.add_(0)` (one launch)": lambda: scratch.add_(0),
            "torch `add` + `F.rms_norm` (two launches)": lambda: F.rms_norm(xs[0] + residual, (n,), weight, eps),
            "`fused_ar.add_rmsnorm` (allocates outputs)": lambda: add_rmsnorm(xs[0], residual, weight, eps),
            "`fused_ar.add_rmsnorm(..., out=, residual_out=)`":
                lambda: add_rmsnorm(xs[0], residual, weight, eps, out=outs[0][0], residual_out=outs[0][1]),
            "`fused_ar.add_rmsnorm_fp8`, static scale (allocates outputs)":
                lambda: add_rmsnorm_fp8(xs[0], residual, weight, eps, scale=scale, fp8_dtype=fp8_dtype),
            "`fused_ar.add_rmsnorm_fp8`, static scale, out= given":
                lambda: add_rmsnorm_fp8(xs[0], residual, weight, eps, scale=scale, fp8_dtype=fp8_dtype, out=q8[0],
                                        residual_out=outs[0][1]),
        }
        # the torch.ops rows, each followed by the dispatcher's own cost of the same call (a kernel that returns
        # at once): what an op costs above the direct call, less that, is ours
        floor = dispatch_floor_ops(torch)
        for name, ns, key in torch_op_rows(torch, floor, local=True):
            local[name] = torch_op_calls(ns, xs[0], residual, weight, eps, scale, fp8_dtype, 0)[key]
        if g8 is not None:
            local[f"`fused_ar.add_rmsnorm_fp8`, groups of {group}, out= given"] = lambda: add_rmsnorm_fp8(
                xs[0], residual, weight, eps, group_size=group, fp8_dtype=fp8_dtype, out=g8[0],
                residual_out=outs[0][1], scales_out=g8[2])
        if q4 is not None:
            local["`fused_ar.add_rmsnorm_fp4` (NVFP4), out= given"] = lambda: add_rmsnorm_fp4(
                xs[0], residual, weight, eps, global_scale=global_scale, out=q4[0], residual_out=outs[0][1],
                scales_out=q4[2])
        for name, call in local.items():
            rows.append((name, _time_rank_calls(torch, [call], one)))
        per_rank: dict[str, Callable[[int, Any], Callable[[], Any]]] = {
            "`comm.allreduce_rmsnorm`, out= given, path 1stage": lambda r, c: lambda: c.allreduce_rmsnorm(
                xs[r], residual, weight, eps, path="1stage", out=outs[r][0], residual_out=outs[r][1]),
            "`comm.allreduce_rmsnorm`, out= given, path auto": lambda r, c: lambda: c.allreduce_rmsnorm(
                xs[r], residual, weight, eps, out=outs[r][0], residual_out=outs[r][1]),
            "`comm.allreduce_rmsnorm` (allocates outputs)": lambda r, c: lambda: c.allreduce_rmsnorm(
                xs[r], residual, weight, eps),
            "`comm.allreduce`, out= given": lambda r, c: lambda: c.allreduce(xs[r], out=outs[r][2]),
            "`comm.allreduce` (allocates)": lambda r, c: lambda: c.allreduce(xs[r]),
            "`comm.allreduce_rmsnorm_fp8`, static scale, out= given, path auto":
                lambda r, c: lambda: c.allreduce_rmsnorm_fp8(xs[r], residual, weight, eps, scale=scale,
                                                             fp8_dtype=fp8_dtype, out=q8[r], residual_out=outs[r][1]),
        }
        for name, ns, key in torch_op_rows(torch, floor, local=False):
            per_rank[name] = lambda r, c, ns=ns, key=key: torch_op_calls(
                ns, xs[r], residual, weight, eps, scale, fp8_dtype, c.handle)[key]
        for name, make in per_rank.items():
            calls = [make(r, c) for r, c in enumerate(comms)]
            rows.append((name, _time_rank_calls(torch, calls, streams)))
            for c in comms:
                c.check()
        if args.profile:
            call = local["`fused_ar.add_rmsnorm(..., out=, residual_out=)`"]
            profiles["add_rmsnorm, out= given"] = _profile(torch, call, one, [call])
            calls = [per_rank["`comm.allreduce_rmsnorm`, out= given, path auto"](r, c) for r, c in enumerate(comms)]
            profiles["comm.allreduce_rmsnorm, out= given (rank 0)"] = _profile(torch, calls[0], streams, calls)
            call = local["`fused_ar.add_rmsnorm` (allocates outputs)"]
            profiles["add_rmsnorm, allocating"] = _profile(torch, call, one, [call])
            call = local["`torch.ops.fused_ar.add_rmsnorm`"]
            profiles["torch.ops.fused_ar.add_rmsnorm"] = _profile(torch, call, one, [call])
            calls = [per_rank["`torch.ops.fused_ar.allreduce_rmsnorm`"](r, c) for r, c in enumerate(comms)]
            profiles["torch.ops.fused_ar.allreduce_rmsnorm (rank 0)"] = _profile(torch, calls[0], streams, calls)
    finally:
        torch.cuda.synchronize()
        for c in comms:
            c.close()
    return _report(torch, args, m, n, tp, dtype, rows, profiles)


def _report(torch: Any, args: argparse.Namespace, m: int, n: int, tp: int, dtype: Any,
            rows: list[tuple[str, float]], profiles: dict[str, str]) -> int:
    import platform

    gpu = torch.cuda.get_device_name(0)
    cpu = platform.processor() or platform.machine()
    lines = [f"# Host cost per eager call on {gpu}", "",
             f"CPU microseconds to enqueue one call, {str(dtype).removeprefix('torch.')} m={m} n={n}, communicator "
             f"ops per rank of a local group of {tp} (N ranks in one process on GPU 0, a stream each); each call "
             f"timed alone, {CALLS} calls per run after {WARMUP} warm-up calls, median of {RUNS} runs. torch "
             f"{torch.__version__}, Python {platform.python_version()}, {cpu}.", "",
             "| call | us per call |", "| --- | ---: |"]
    lines += [f"| {name} | {us:.1f} |" for name, us in rows]
    for title, text in profiles.items():
        lines += ["", f"## cProfile: {title} ({CALLS} calls, by own time)", "", "```", text.strip(), "```"]
    data = {"gpu": gpu, "torch": torch.__version__, "m": m, "n": n, "tp": tp, "dtype": str(dtype), "calls": CALLS,
            "runs": RUNS, "rows": [{"call": k, "us": v} for k, v in rows]}
    csv = "call,us_per_call\n" + "".join(f"\"{k}\",{v:.3f}\n" for k, v in rows)
    publish("\n".join(lines) + "\n", args.out, "host", data, **{"host.csv": csv})
    return 0


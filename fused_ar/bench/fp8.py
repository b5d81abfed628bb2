"""`python -m fused_ar bench fp8`: the fused all-reduce + RMSNorm + quantization (each FP8 scale kind, UE8M0-packed
group scales, NVFP4 and MXFP4) against our all-reduce + RMSNorm followed by torch's quantization (the package's
reference for the last three), and the all-reduce + RMSNorm with bf16 out alone, in the same run.

Method (docs/design.md section 7, on one GPU): N ranks in one process (a single-GPU emulation); per rank a
CUDA graph of K calls on the rank's own stream (the unfused variant: one graph of K rounds, every rank's
collective, then every rank's quantization); one timed pass replays the graphs between two events, median of
R passes, per call. Each variant is checked first: the fused values and scales bit-identical to torch's
quantization of the unfused out.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any, Callable

from .. import env
from ..comm.ipc import GRAPH_TABLES
from ..errors import InputError
from .peers import NVFP4_GLOBAL_SCALE, quantize
from .results import publish

# (mode, group or FP4 block); nvfp4 takes `scale` as its global scale, static as its FP8 scale.
MODES = (("static", None), ("token", None), ("group", 128), ("group_ue8m0", 128), ("nvfp4", 16), ("mxfp4", 32))
FP4_MODES = ("nvfp4", "mxfp4")


def _capture(torch: Any, streams: list, steps: list[Callable[[], Any]], calls: int) -> list:
    """Per rank, a graph of `calls` calls of its step, captured on its stream."""
    graphs = []
    for step, stream in zip(steps, streams):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            for _ in range(calls):
                step()
        graphs.append(g)
    return graphs


def _capture_joined(torch: Any, streams: list, phases: list[list[Callable[[], Any]]], calls: int) -> Any:
    """One graph of `calls` rounds: in each, every rank's first phase (the collective) on its stream, all
    together, then, once every rank's is done, every rank's second (torch's quantization). Ranks sharing a GPU
    cannot run a rank's quantization between its collectives: while the other ranks' blocks spin at the next
    barrier (spread over every SM), a kernel that needs an SM's whole register file never starts (a hang)."""
    main = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=main):
        for _ in range(calls):
            for phase in phases:
                for step, s in zip(phase, streams):
                    s.wait_stream(main)
                    with torch.cuda.stream(s):
                        step()
                for s in streams:
                    main.wait_stream(s)
    return g


def bench_fp8(args: argparse.Namespace) -> int:
    env.reserve_rank_queues()
    import torch

    from ..comm.communicator import Communicator
    from ..reference import prime_allocator
    from ..device.validate import require_gpu

    variants = 3  # fused, unfused, bf16: a graph each, every call of it a peer table of the communicator
    if variants * args.graph_calls > GRAPH_TABLES:
        raise InputError(f"--graph-calls {args.graph_calls}: bench fp8 captures {variants} graphs per output kind on one "
                         f"communicator, which holds {GRAPH_TABLES} graph-captured calls: at most "
                         f"{GRAPH_TABLES // variants}")
    require_gpu("python -m fused_ar bench fp8")
    prime_allocator()
    fp8, big = torch.float8_e4m3fn, 448.0
    rows = []
    for tp in args.tp:
        streams = [torch.cuda.Stream() for _ in range(tp)]
        for n in args.hidden:
            for m in args.m:
                xs = [torch.randn(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(tp)]
                residual = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
                weight = torch.rand(n, device="cuda", dtype=torch.bfloat16) + 0.5
                for mode, group in MODES:
                    scale = torch.tensor([NVFP4_GLOBAL_SCALE if mode == "nvfp4" else 0.05], device="cuda")
                    # a group per output kind: its graphs' peer tables are the communicator's for good
                    comms = Communicator.local_group(tp, 0, max_bytes=m * n * 4)
                    try:
                        row = _one(torch, comms, streams, xs, residual, weight, mode, group, scale, fp8, big, args)
                    finally:
                        torch.cuda.synchronize()
                        for c in comms:
                            c.close()
                    row.update(tp=tp, m=m, n=n, mode=mode)
                    rows.append(row)
                    print(f"TP{tp} n={n} m={m} {mode}: fused {row['fused_us']:.2f} us, unfused {row['unfused_us']:.2f} "
                          f"us ({row['unfused_us'] / row['fused_us']:.2f}x), bf16 out {row['bf16_us']:.2f} us", flush=True)
    return _report(torch, args, rows)


def _one(torch: Any, comms: list, streams: list, xs: list, residual: Any, weight: Any, mode: str, group: Any,
         scale: Any, fp8: Any, big: float, args: argparse.Namespace) -> dict:
    m, n = residual.shape
    static = scale if mode == "static" else None
    ref_q, ref_s = quantize(torch, residual, mode, big, fp8, scale, group)  # only the shapes and dtypes
    q = [(torch.empty_like(ref_q), torch.empty_like(residual),
          None if static is not None else torch.empty_like(ref_s)) for _ in comms]
    plain = [(torch.empty_like(residual), torch.empty_like(residual)) for _ in comms]

    def fused(r: int, c: Any) -> Callable[[], Any]:
        outs = dict(out=q[r][0], residual_out=q[r][1], scales_out=q[r][2])
        if mode in FP4_MODES:
            return lambda: c.allreduce_rmsnorm_fp4(xs[r], residual, weight, fp4_format=mode,
                                                   global_scale=scale if mode == "nvfp4" else None, **outs)
        return lambda: c.allreduce_rmsnorm_fp8(
            xs[r], residual, weight, scale=static, group_size=group if mode not in ("static", "token") else None,
            fp8_dtype=fp8, scales_format="ue8m0_packed" if mode == "group_ue8m0" else "fp32", **outs)

    def bf16(r: int, c: Any) -> Callable[[], Any]:
        return lambda: c.allreduce_rmsnorm(xs[r], residual, weight, out=plain[r][0], residual_out=plain[r][1])

    def quantized(r: int, c: Any) -> Callable[[], Any]:
        return lambda: quantize(torch, plain[r][0], mode, big, fp8, scale, group)

    results = {}
    # unfused: our all-reduce + RMSNorm, then torch's quantization of its out (every rank's collective first)
    for name, makes in (("fused", (fused,)), ("unfused", (bf16, quantized)), ("bf16", (bf16,))):
        phases = [[make(r, c) for r, c in enumerate(comms)] for make in makes]
        for s in streams:  # one eager call per rank first (plans, kernels), all ranks in flight together
            s.wait_stream(torch.cuda.current_stream())
        for phase in phases:
            # Every rank's collective in flight before any quantization: torch's quantization may allocate, and a
            # fresh allocation waits for the device, where a launched rank spins until the others arrive.
            for step, s in zip(phase, streams):
                with torch.cuda.stream(s):
                    step()
            torch.cuda.synchronize()
        if name == "fused":
            ref_q, ref_s = quantize(torch, _reference_out(torch, comms, streams, xs, residual, weight, plain), mode, big,
                                     fp8, scale, group)
            for r in range(len(comms)):  # every rank's
                assert _bytes(torch, q[r][0]).equal(_bytes(torch, ref_q)), f"{mode}: rank {r}'s values differ"
                if static is None:
                    assert _bytes(torch, q[r][2]).equal(_bytes(torch, ref_s)), f"{mode}: rank {r}'s scales differ"
        with _all_registered(comms):
            if len(phases) == 1:
                graphs, joined = _capture(torch, streams, phases[0], args.graph_calls), None
            else:
                graphs, joined = [], _capture_joined(torch, streams, phases, args.graph_calls)
        times = []
        for _ in range(args.replays):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for g, s in zip(graphs, streams):
                s.wait_event(start)
                with torch.cuda.stream(s):
                    g.replay()
            for s in streams:
                torch.cuda.current_stream().wait_stream(s)
            if joined is not None:
                joined.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / args.graph_calls)
        for c in comms:
            c.check()
        results[f"{name}_us"] = statistics.median(times)
    return results


def _bytes(torch: Any, t: Any) -> Any:
    """A tensor's bytes, so NaN scales compare equal to themselves."""
    return t.contiguous().view(torch.uint8)


def _reference_out(torch: Any, comms: list, streams: list, xs: list, residual: Any, weight: Any, plain: list) -> Any:
    for r, (c, s) in enumerate(zip(comms, streams)):
        with torch.cuda.stream(s):
            c.allreduce_rmsnorm(xs[r], residual, weight, out=plain[r][0], residual_out=plain[r][1])
    torch.cuda.synchronize()
    return plain[0][0]


class _all_registered:
    """Every rank's capture() around the captures: the captured calls' inputs are registered when it ends."""

    def __init__(self, comms: list) -> None:
        self.contexts = [c.capture() for c in comms]

    def __enter__(self) -> None:
        for ctx in self.contexts:
            ctx.__enter__()

    def __exit__(self, *exc: Any) -> None:
        for ctx in self.contexts:
            ctx.__exit__(*exc)


def _report(torch: Any, args: argparse.Namespace, rows: list[dict]) -> int:
    gpu = torch.cuda.get_device_name(0)
    lines = [f"# Fused all-reduce + RMSNorm + quantization on {gpu} (single-GPU emulation)", "",
             f"bf16 in; N ranks in one process, each a CUDA graph of {args.graph_calls} calls on its stream, every "
             f"rank's graph replayed between two events, median of {args.replays}, per call. fused: "
             "`allreduce_rmsnorm_fp8` (float8_e4m3fn; group_ue8m0: power-of-two scales packed as UE8M0 bytes) or "
             f"`allreduce_rmsnorm_fp4` (nvfp4: global scale {NVFP4_GLOBAL_SCALE:g}; mxfp4); unfused: `allreduce_rmsnorm` then torch's "
             "quantization (amax, scale, multiply, clamp, cast; the package's reference for group_ue8m0, nvfp4, "
             "mxfp4); bf16: `allreduce_rmsnorm` alone (bf16 out). Each fused result checked bit for bit, every "
             "rank, against the unfused one first.", "",
             "| TP | n | m | output | fused us | unfused us | speedup | bf16 us | fused / bf16 |",
             "| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['tp']} | {r['n']} | {r['m']} | {r['mode']} | {r['fused_us']:.2f} | {r['unfused_us']:.2f} | "
              f"{r['unfused_us'] / r['fused_us']:.2f}x | {r['bf16_us']:.2f} | {r['fused_us'] / r['bf16_us']:.2f} |"
              for r in rows]
    publish("\n".join(lines) + "\n", args.out, "fp8", {"gpu": gpu, "torch": torch.__version__, "rows": rows})
    return 0

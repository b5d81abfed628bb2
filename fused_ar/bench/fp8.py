"""`python -m fused_ar bench fp8`: the fused all-reduce + RMSNorm + FP8 quantization (each scale kind) against
our all-reduce + RMSNorm followed by torch's quantization, in the same run.

Method (docs/design.md section 7, on one GPU): N ranks in one process (a single-GPU emulation); per rank a
CUDA graph of K calls on the rank's own stream; one timed pass replays every rank's graph between two events,
median of R passes, per call. Each variant is checked first: the fused q and scales bit-identical to torch's
quantization of the unfused out.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any, Callable

from .peers import quantize
from .results import publish

MODES = (("static", None), ("token", None), ("group", 128))


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


def bench_fp8(args: argparse.Namespace) -> int:
    import torch

    from ..comm.communicator import Communicator
    from ..reference import prime_allocator
    from ..device.validate import require_gpu

    require_gpu("python -m fused_ar bench fp8")
    prime_allocator()
    fp8, big = torch.float8_e4m3fn, 448.0
    rows = []
    for tp in args.tp:
        comms = Communicator.local_group(tp, 0, max_bytes=max(args.m) * max(args.hidden) * 4)
        streams = [torch.cuda.Stream() for _ in comms]
        try:
            for n in args.hidden:
                for m in args.m:
                    xs = [torch.randn(m, n, device="cuda", dtype=torch.bfloat16) for _ in comms]
                    residual = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
                    weight = torch.rand(n, device="cuda", dtype=torch.bfloat16) + 0.5
                    scale = torch.tensor([0.05], device="cuda")
                    for mode, group in MODES:
                        row = _one(torch, comms, streams, xs, residual, weight, mode, group, scale, fp8, big, args)
                        row.update(tp=tp, m=m, n=n, mode=mode)
                        rows.append(row)
                        print(f"TP{tp} n={n} m={m} {mode}: fused {row['fused_us']:.2f} us, unfused {row['unfused_us']:.2f} "
                              f"us ({row['unfused_us'] / row['fused_us']:.2f}x)", flush=True)
        finally:
            torch.cuda.synchronize()
            for c in comms:
                c.close()
    return _report(torch, args, rows)


def _one(torch: Any, comms: list, streams: list, xs: list, residual: Any, weight: Any, mode: str, group: Any,
         scale: Any, fp8: Any, big: float, args: argparse.Namespace) -> dict:
    m, n = residual.shape
    static = scale if mode == "static" else None
    q = [(torch.empty(m, n, device="cuda", dtype=fp8), torch.empty_like(residual),
          None if static is not None else torch.empty(quantize(torch, residual, mode, big, fp8, scale, group)[1].shape,
                                                      device="cuda")) for _ in comms]
    plain = [(torch.empty_like(residual), torch.empty_like(residual)) for _ in comms]

    def fused(r: int, c: Any) -> Callable[[], Any]:
        return lambda: c.allreduce_rmsnorm_fp8(xs[r], residual, weight, scale=static, group_size=group, fp8_dtype=fp8,
                                               out=q[r][0], residual_out=q[r][1], scales_out=q[r][2])

    def unfused(r: int, c: Any) -> Callable[[], Any]:
        def step() -> Any:
            out, _ = c.allreduce_rmsnorm(xs[r], residual, weight, out=plain[r][0], residual_out=plain[r][1])
            return quantize(torch, out, mode, big, fp8, scale, group)
        return step

    results = {}
    for name, make in (("fused", fused), ("unfused", unfused)):
        steps = [make(r, c) for r, c in enumerate(comms)]
        for s in streams:  # one eager call per rank first (plans, kernels), all ranks in flight together
            s.wait_stream(torch.cuda.current_stream())
        outs = []
        for step, s in zip(steps, streams):
            with torch.cuda.stream(s):
                outs.append(step())
        torch.cuda.synchronize()
        if name == "fused":
            ref_q, ref_s = quantize(torch, _reference_out(torch, comms, streams, xs, residual, weight, plain), mode, big,
                                     fp8, scale, group)
            assert torch.equal(q[0][0].view(torch.uint8), ref_q.view(torch.uint8)), f"{mode}: q differs from torch's"
            if static is None:
                assert torch.equal(q[0][2], ref_s), f"{mode}: scales differ from torch's"
        with _all_registered(comms):
            graphs = _capture(torch, streams, steps, args.graph_calls)
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
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / args.graph_calls)
        for c in comms:
            c.check()
        results[f"{name}_us"] = statistics.median(times)
    return results


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
    lines = [f"# Fused all-reduce + RMSNorm + FP8 on {gpu} (single-GPU emulation)", "",
             f"bf16 in, float8_e4m3fn out; N ranks in one process, each a CUDA graph of {args.graph_calls} calls on its "
             f"stream, every rank's graph replayed between two events, median of {args.replays}, per call. fused: "
             "`allreduce_rmsnorm_fp8`; unfused: `allreduce_rmsnorm` then torch's quantization (amax, scale, multiply, "
             "clamp, cast). Each fused result checked bit for bit against the unfused one first.", "",
             "| TP | n | m | scales | fused us | unfused us | speedup |", "| ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
    lines += [f"| {r['tp']} | {r['n']} | {r['m']} | {r['mode']} | {r['fused_us']:.2f} | {r['unfused_us']:.2f} | "
              f"{r['unfused_us'] / r['fused_us']:.2f}x |" for r in rows]
    publish("\n".join(lines) + "\n", args.out, "fp8", {"gpu": gpu, "torch": torch.__version__, "rows": rows})
    return 0

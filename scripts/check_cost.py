"""What the timeout and mismatch checks cost on the common path: the fused op graph-replayed with the
checks compiled in (FA_CHECKS 1, what ships) and out (FA_CHECKS 0, only for this measurement), N ranks
on one GPU (single-GPU emulation), K calls per graph, the median over R replays of the slowest rank.

    PYTHONPATH=. python3 scripts/check_cost.py --ranks 8 --m 1 128 --out bench/results/check_cost_h200.md
"""

from __future__ import annotations

import argparse
import os
import statistics

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")

import torch  # noqa: E402

from fused_ar import Communicator, launch  # noqa: E402
from fused_ar.cache import default_cache  # noqa: E402
from fused_ar.compiler import compiler_for  # noqa: E402
from fused_ar.render import Source, render  # noqa: E402
from fused_ar.runtime import current_runtime  # noqa: E402
from fused_ar.spec import DType  # noqa: E402


def without_checks(spec, device):
    """Loads `spec` compiled with FA_CHECKS 0 in place of the shipped one (this process only)."""
    default_cache().get(spec)  # the shipped one first, so the memo key exists
    src = render(spec)
    kernel = compiler_for(spec.arch).compile(Source(spec, "#define FA_CHECKS 0\n" + src.text), spec.arch)
    launch._functions[(spec, device)] = current_runtime().load(kernel, spec.kernel_name, device)


def time_graphs(comms, streams, m, n, calls, replays):
    xs = [torch.randn(m, n, device="cuda", dtype=torch.bfloat16) for _ in comms]
    residual = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    weight = torch.rand(n, device="cuda", dtype=torch.bfloat16) + 0.5
    for c, s, x in zip(comms, streams, xs):  # warm
        with torch.cuda.stream(s):
            c.allreduce_rmsnorm(x, residual, weight)
    torch.cuda.synchronize()
    graphs = []
    for c, s, x in zip(comms, streams, xs):
        g = torch.cuda.CUDAGraph()
        with c.capture(), torch.cuda.graph(g, stream=s):
            for _ in range(calls):
                c.allreduce_rmsnorm(x, residual, weight)
        graphs.append(g)
    samples = []
    for _ in range(replays):
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in comms]
        torch.cuda.synchronize()
        for g, s, (a, b) in zip(graphs, streams, events):
            with torch.cuda.stream(s):
                a.record()
                g.replay()
                b.record()
        torch.cuda.synchronize()
        samples.append(max(a.elapsed_time(b) for a, b in events) * 1000 / calls)
    for c in comms:
        c.check()
    return statistics.median(samples)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--m", type=int, nargs="+", default=[1, 128])
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--replays", type=int, default=30)
    p.add_argument("--out")
    a = p.parse_args()
    results = {}
    for variant in ("checks", "no checks"):
        comms = Communicator.local_group(a.ranks, 0, max_bytes=max(a.m) * a.n * 2)
        streams = [torch.cuda.Stream() for _ in comms]
        if variant == "no checks":
            for m in a.m:  # the specs this run launches, swapped for their FA_CHECKS 0 builds
                x = torch.empty(m, a.n, device="cuda", dtype=torch.bfloat16)
                without_checks(comms[0]._fused_spec(DType.BF16, a.n, comms[0]._choose("auto", x, None)), 0)
        for m in a.m:
            results[(variant, m)] = time_graphs(comms, streams, m, a.n, a.calls, a.replays)
        torch.cuda.synchronize()
        for c in comms:
            c.close()
        launch._functions.clear()
    lines = [f"# Cost of the timeout + mismatch checks: allreduce_rmsnorm bf16 n={a.n}, N={a.ranks} ranks on one "
             f"{torch.cuda.get_device_name(0)} (single-GPU emulation), {a.calls} calls per graph, median of "
             f"{a.replays} replays, slowest rank", "",
             "| m | with checks (us) | without (us) | cost |", "| --- | --- | --- | --- |"]
    for m in a.m:
        w, wo = results[("checks", m)], results[("no checks", m)]
        lines.append(f"| {m} | {w:.2f} | {wo:.2f} | {100 * (w - wo) / wo:+.1f}% |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()

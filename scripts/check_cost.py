"""What the timeout and mismatch checks cost on the common path: the fused op graph-replayed with the
checks compiled in (FA_CHECKS 1, what ships), out (FA_CHECKS 0), and each half alone (VARIANTS; all but
the shipped one only for this measurement), N ranks on one GPU (single-GPU emulation), K calls per
graph, the slowest rank's time per call.

Every variant's graphs are captured on the same communicators and inputs, and the replays alternate
(variant order rotated each round), so clocks and memory placement weigh on all variants alike; the
table gives the median over R rounds and the spread (25th-75th percentile).

    PYTHONPATH=. python3 scripts/check_cost.py --ranks 8 --m 1 128 --out bench/results/check_cost_h200.md
"""

from __future__ import annotations

import argparse
import os
import statistics

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")

import torch  # noqa: E402

from fused_ar.device import launch  # noqa: E402
from fused_ar.bench import timing  # noqa: E402
from fused_ar.bench.group import Group  # noqa: E402
from fused_ar.backends import compiler_for  # noqa: E402
from fused_ar.jit.render import Source, render  # noqa: E402
from fused_ar.backends import current_runtime  # noqa: E402
from fused_ar.jit.spec import DType  # noqa: E402

# Each variant is the shipped source with these defines on top (kernels_src/fa_peers.h reads them).
VARIANTS = {
    "checks (shipped)": "",
    "timeout/error checks only": "#define FA_CHECK_DESC 0\n",
    "descriptor check only": "#define FA_CHECK_WAITS 0\n",
    "checks, every 1024 polls": "#define FA_CHECK_SPINS 1024\n",
    "no checks": "#define FA_CHECKS 0\n",
}


def load_variant(spec, device, defines):
    """The function of `spec` built with `defines` on top of its source (this process only)."""
    kernel = compiler_for(spec.arch).compile(Source(spec, defines + render(spec).text), spec.arch)
    return current_runtime().load(kernel, spec.kernel_name, device)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--m", type=int, nargs="+", default=[1, 128])
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--replays", type=int, default=30)
    p.add_argument("--out")
    a = p.parse_args()
    group = Group(a.ranks, 0, emulated=True)
    comms = group.open(max(a.m) * a.n * 2)
    rows = []
    for m in a.m:
        torch.manual_seed(m)
        xs = [torch.randn(m, a.n, device="cuda", dtype=torch.bfloat16) for _ in comms]
        residual = torch.randn(m, a.n, device="cuda", dtype=torch.bfloat16)
        weight = torch.rand(a.n, device="cuda", dtype=torch.bfloat16) + 0.5
        auto = comms[0]._choose("auto", xs[0], None, comms[0].size_rule(DType.BF16, a.n))
        spec = comms[0]._fused_spec(DType.BF16, a.n, auto)
        shipped = launch.function(spec, 0)

        def call(i):
            return comms[i].allreduce_rmsnorm(xs[i], residual, weight)
        graphs = {}
        for name, defines in VARIANTS.items():
            launch._functions[(spec, 0)] = load_variant(spec, 0, defines)  # captured into this variant's graphs
            group.each(lambda i, stream: call(i))  # warm
            graphs[name] = timing.capture(group, a.calls, call)[0]
        launch._functions[(spec, 0)] = shipped
        names = list(graphs)
        samples = {name: [] for name in names}
        for r in range(a.replays):
            for k in range(len(names)):
                name = names[(r + k) % len(names)]
                per_rank = timing.replay_times(group, graphs[name], a.calls, 1)
                samples[name].append(max(times[0] for times in per_rank))  # the slowest rank
        base = statistics.median(samples["no checks"])
        for name in names:
            q1, med, q3 = statistics.quantiles(samples[name], n=4)  # the middle cut is the median
            rows.append(f"| {m} | {spec.op.value} | {name} | {med:.2f} | {q1:.2f}-{q3:.2f} | "
                        f"{100 * (med - base) / base:+.1f}% |")
        del graphs
    group.close()
    lines = [f"# Cost of the timeout + mismatch checks: allreduce_rmsnorm bf16 n={a.n}, N={a.ranks} ranks on one "
             f"{torch.cuda.get_device_name(0)} (single-GPU emulation), {a.calls} calls per graph replay, "
             f"{a.replays} rounds of alternating replays, slowest rank", "",
             "| m | kernel | variant | median us/call | 25-75% | vs no checks |",
             "| ---: | --- | --- | ---: | --- | ---: |", *rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()

"""Issue 6, step 3: after `bench --write-thresholds`, is `auto` within 3% of the best forced path at every m?
Reads a bench results.json (a run with fused_auto, fused_1stage, fused_2stage and fallback) and prints a
table per (TP, hidden, dtype); exits 1 if any m misses.

    python scripts/auto_vs_best.py OUT/results.json [--tolerance 0.03] [--out auto_vs_best.md]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from fused_ar.bench.results import Run  # noqa: E402

FORCED = ("fused_1stage", "fused_2stage", "fallback")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("results")
    p.add_argument("--tolerance", type=float, default=0.03)
    p.add_argument("--out")
    a = p.parse_args()
    run = Run.load(a.results)
    lines, misses = [f"# auto vs the best forced path ({', '.join(FORCED)}), tolerance {a.tolerance:.0%}", "",
                     f"From `{run.command}`", ""], 0
    for tp, hidden, dtype in run.cases():
        lines += [f"## TP{tp} hidden {hidden} {dtype} ({run.modes.get(tp, '')})", "",
                  "| m | auto us | best forced | best us | auto / best |", "| ---: | ---: | --- | ---: | ---: |"]
        for m in run.ms(tp, hidden, dtype):
            auto = run.find(tp, hidden, dtype, m, "fused_auto")
            forced = [pt for name in FORCED if (pt := run.find(tp, hidden, dtype, m, name))]
            if auto is None or not forced:
                continue
            best = min(forced, key=lambda pt: pt.best_us)
            ratio = auto.best_us / best.best_us
            miss = ratio > 1 + a.tolerance
            misses += miss
            lines.append(f"| {m} | {auto.best_us:.2f} | {best.path} | {best.best_us:.2f} | {ratio:.3f}"
                         + (" MISS |" if miss else " |"))
        lines.append("")
    lines.append(f"{misses} point(s) over the tolerance")
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())

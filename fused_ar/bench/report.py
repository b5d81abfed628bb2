"""A benchmark run's outputs, from its results alone (fused_ar.bench.results): the Markdown tables per TP in
the seed's shape, CSV and JSON of every raw number, CDF plots, the crossover points and the thresholds
they imply, and a one-screen summary. Pure: no devices, no torch; matplotlib only for the plots.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from ..jit.spec import DType
from ..comm.thresholds import SizeRule, Thresholds
from .paths import BY_NAME, PAIRS
from .results import Run

ONE_STAGE, TWO_STAGE, FALLBACK = "fused_1stage", "fused_2stage", "fallback"


# -- crossovers ---------------------------------------------------------------------------------------
def first_winning_m(ms: Sequence[int], base: dict[int, float], candidate: dict[int, float]) -> Optional[int]:
    """The smallest m from which `candidate` is faster than `base` at every larger m measured (both
    measured); None if it is not faster at the largest. A single noisy win below a loss does not count."""
    both = [m for m in sorted(ms) if m in base and m in candidate]
    start = None
    for m in reversed(both):
        if candidate[m] < base[m]:
            start = m
        else:
            break
    return start


@dataclass(frozen=True)
class Crossover:
    tp: int
    hidden: int
    dtype: str
    ms: tuple[int, ...]
    two_stage_measured: bool
    two_stage_from_m: Optional[int]  # two-stage beats one-stage from here on; None: never in the sweep
    fallback_measured: bool
    fallback_from_m: Optional[int]  # the fallback beats both kernels from here on; None: never

    def rule(self, itemsize: int) -> SizeRule:
        """The thresholds these crossovers imply: one-stage up to the last m it won (0 if it never did; the
        largest m swept if it always did), the fallback from the first m it won from."""
        one_stage_max = None
        if self.two_stage_measured:
            if self.two_stage_from_m is None:
                last = self.ms[-1]
            else:
                earlier = [m for m in self.ms if m < self.two_stage_from_m]
                last = earlier[-1] if earlier else 0
            one_stage_max = last * self.hidden * itemsize
        fallback_min = None
        if self.fallback_measured and self.fallback_from_m is not None:
            fallback_min = self.fallback_from_m * self.hidden * itemsize
        return SizeRule(one_stage_max, fallback_min)


def crossovers(run: Run) -> list[Crossover]:
    found = []
    for tp, hidden, dtype in run.cases():
        ms = run.ms(tp, hidden, dtype)

        def times(path: str) -> dict[int, float]:
            return {m: p.best_us for m in ms if (p := run.find(tp, hidden, dtype, m, path)) is not None}

        one, two, fb = times(ONE_STAGE), times(TWO_STAGE), times(FALLBACK)
        kernels = {m: min(t for t in (one.get(m), two.get(m)) if t is not None) for m in ms if m in one or m in two}
        found.append(Crossover(tp, hidden, dtype, tuple(ms), bool(one) and bool(two), first_winning_m(ms, one, two),
                               bool(fb) and bool(kernels), first_winning_m(ms, kernels, fb)))
    return found


def thresholds_for(run: Run, arch: str, tp: int) -> Thresholds:
    """The thresholds file content for one TP of a run (fused_ar.comm.thresholds)."""
    rules = {Thresholds.key(c.dtype, c.hidden): c.rule(DType.parse(c.dtype).itemsize)
             for c in crossovers(run) if c.tp == tp}
    return Thresholds(arch, tp, rules, run.command)


# -- tables -------------------------------------------------------------------------------------------
def _us(value: Optional[float]) -> str:
    return f"{value:.2f}" if value is not None else "-"


def markdown(run: Run, tp: int) -> str:
    """The TP's tables: per (hidden, dtype), every path's time per m, then the pairs in the seed's shape."""
    calls = {p.calls for p in run.points if p.tp == tp}
    replays = {len(p.per_rank_us[0]) for p in run.points if p.tp == tp}
    lines = [f"# allreduce + add + RMSNorm, TP{tp}: {run.modes.get(tp, '')}", "",
             f"Command: `{run.command}`", "",
             f"Method: {'/'.join(map(str, sorted(calls)))} op calls captured in one CUDA graph, one replay timed with "
             f"events, {'/'.join(map(str, sorted(replays)))} replays; per rank the minimum, then the maximum across "
             "ranks; microseconds per call. floor: the fewest bytes over the measured bandwidth.", ""]
    if run.emulated.get(tp):
        lines += [f"**Single-GPU emulation**: all {tp} ranks run in one process on one GPU and share its SMs and "
                  "memory; a peer read is a local HBM read, not an NVLink transfer. Compare paths with each other, "
                  "not with multi-GPU numbers.", ""]
    paths = run.paths(tp)
    for ttp, hidden, dtype in run.cases():
        if ttp != tp:
            continue
        ms = run.ms(tp, hidden, dtype)
        lines += [f"## hidden {hidden}, {dtype}", "",
                  "| m | floor | " + " | ".join(paths) + " |", "| ---: | ---: | " + " | ".join("---:" for _ in paths) + " |"]
        for m in ms:
            cells = [_us(p.best_us if (p := run.find(tp, hidden, dtype, m, path)) else None) for path in paths]
            lines.append(f"| {m} | {_us(run.floor(tp, hidden, dtype, m))} | " + " | ".join(cells) + " |")
        pairs = [(b, c) for b, c in PAIRS if b in paths and c in paths]
        if pairs:
            lines += ["", "| m | " + " | ".join(f"{b} base_us | {c} opt_us | speedup" for b, c in pairs) + " |",
                      "| ---: | " + " | ".join("---: | ---: | ---:" for _ in pairs) + " |"]
            for m in ms:
                cells = []
                for b, c in pairs:
                    pb, pc = run.find(tp, hidden, dtype, m, b), run.find(tp, hidden, dtype, m, c)
                    speed = f"{pb.best_us / pc.best_us:.3f}x" if pb and pc else "-"
                    cells.append(f"{_us(pb.best_us if pb else None)} | {_us(pc.best_us if pc else None)} | {speed}")
                lines.append(f"| {m} | " + " | ".join(cells) + " |")
        lines.append("")
    skipped = [s for s in run.skips if s.tp == tp]
    if skipped:
        lines += ["Skipped:", ""] + [f"- `{s.path}`: {s.reason}" for s in skipped] + [""]
    lines += ["Paths:", ""] + [f"- `{p}`: {BY_NAME[p].what}" for p in paths] + [""]
    return "\n".join(lines)


SUMMARY_FIELDS = ("tp", "hidden", "dtype", "m", "path", "calls", "replays", "ranks", "best_us", "median_us",
                  "floor_us", "emulated")


def write_csv(run: Run, summary_path: Path, raw_path: Path) -> None:
    """One row per point (the statistics), and one per (point, rank, replay) (every raw time)."""
    with open(summary_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(SUMMARY_FIELDS)
        for p in run.points:
            w.writerow([p.tp, p.hidden, p.dtype, p.m, p.path, p.calls, len(p.per_rank_us[0]), len(p.per_rank_us),
                        f"{p.best_us:.4f}", f"{p.median_us:.4f}", _us(run.floor(p.tp, p.hidden, p.dtype, p.m)),
                        int(run.emulated.get(p.tp, False))])
    with open(raw_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(("tp", "hidden", "dtype", "m", "path", "rank", "replay", "us_per_call"))
        for p in run.points:
            for rank, times in enumerate(p.per_rank_us):
                for replay, t in enumerate(times):
                    w.writerow([p.tp, p.hidden, p.dtype, p.m, p.path, rank, replay, f"{t:.4f}"])


# -- plots --------------------------------------------------------------------------------------------
def cdf_plots(run: Run, out: Path) -> list[Path]:
    """One PNG per (TP, hidden, dtype): a panel per m, a curve per path of its per-replay latency (the
    slowest rank's); curves closer to the upper left are better."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for tp, hidden, dtype in run.cases():
        ms = run.ms(tp, hidden, dtype)
        cols = min(4, len(ms))
        rows = (len(ms) + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
        for ax, m in zip(axes.flat, ms):
            for path in run.paths(tp):
                point = run.find(tp, hidden, dtype, m, path)
                if point is None:
                    continue
                xs = sorted(point.per_replay_us)
                ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=path)
            ax.set_title(f"m={m}")
            ax.set_xlabel("us per call")
            ax.set_ylabel("fraction of replays")
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[len(ms):]:
            ax.axis("off")
        axes.flat[0].legend(fontsize=7)
        label = " (single-GPU emulation)" if run.emulated.get(tp) else ""
        fig.suptitle(f"TP{tp}, hidden {hidden}, {dtype}{label}: latency CDF per path (upper left is better)")
        fig.tight_layout()
        path = out / f"cdf_tp{tp}_h{hidden}_{dtype}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written


# -- summary ------------------------------------------------------------------------------------------
def summary(run: Run, found: Sequence[Crossover], files: Sequence[Path] = ()) -> str:
    """One screen: per TP how it ran, the headline speedup at a few m, the crossovers, the skips."""
    lines = ["fused_ar bench summary (us per call: per-rank minimum over replays, maximum over ranks)"]
    for tp in sorted(run.modes):
        paths = run.paths(tp)
        base = next(((b, c) for b, c in PAIRS if b in paths and c in paths), None)
        lines.append(f"TP{tp}: {run.modes[tp]}")
        for c in (c for c in found if c.tp == tp):
            parts = []
            if base is not None:
                for m in [m for m in (1, 16, 128, 1024) if m in c.ms]:
                    pb, pc = (run.find(tp, c.hidden, c.dtype, m, name) for name in base)
                    if pb and pc:
                        parts.append(f"m={m} {pc.best_us:.1f} vs {pb.best_us:.1f} ({pb.best_us / pc.best_us:.2f}x)")
            two = ("not measured" if not c.two_stage_measured else
                   f"from m={c.two_stage_from_m}" if c.two_stage_from_m is not None else "never (1stage wins to the end)")
            fb = ("not measured" if not c.fallback_measured else
                  f"from m={c.fallback_from_m}" if c.fallback_from_m is not None else "never")
            lines.append(f"  hidden {c.hidden} {c.dtype}: 2stage beats 1stage {two}; fallback beats the kernels {fb}")
            if parts:
                lines.append(f"    {base[1]} vs {base[0]}: " + "; ".join(parts))
        for s in (s for s in run.skips if s.tp == tp):
            lines.append(f"  skipped {s.path}: {s.reason}")
    if files:
        lines.append("wrote: " + ", ".join(str(f) for f in files))
    return "\n".join(lines)


def write_all(run: Run, out: Path) -> list[Path]:
    """Every output file of a run into `out`; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "results.json"]
    run.save(files[0])
    for tp in sorted(run.modes):
        path = out / f"tp{tp}.md"
        path.write_text(markdown(run, tp))
        files.append(path)
    files += [out / "summary.csv", out / "raw.csv"]
    write_csv(run, files[-2], files[-1])
    files += cdf_plots(run, out)
    return files

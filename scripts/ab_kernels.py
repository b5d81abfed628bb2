"""Kernel-source variants of the local add_rmsnorm family timed against each other in one process, on one GPU:

    git archive HEAD kernels_src | tar x -C /tmp/a      # the base: a directory holding kernels_src
    cp -r kernels_src /tmp/b/                            # the change under test
    python3 scripts/ab_kernels.py /tmp/a,/tmp/b --shapes 1x4096,256x8192 --modes bf16,static,group --out DIR

Each variant's kernels are rendered from its own kernels_src (they key the cache apart by their text) and
captured into a CUDA graph of CALLS in-place calls per shape and output kind; the replays of all variants'
graphs are taken in turn, rotating which goes first, and the median per call is reported with its ratio to
the first variant's. Before timing, one fresh call of each variant writes new outputs whose bytes are
compared with the first variant's: `diff` counts the differing bytes (a change must keep them 0). The same
base given twice measures the harness itself (bench/results/peers_h100/ab_kernels_2026-12-07.md: within
0.8%). Writes ab.txt and ab.json under --out.

Variants that differ beyond kernels_src (a kernel's parameter list, its launch policy: anything the Python
side of one checkout fixes) cannot share a process. With `--checkouts R` each variant is a whole checkout
(a directory holding fused_ar and kernels_src), timed in a process of its own with that checkout first on
PYTHONPATH, R rounds of one process per checkout taken in turn (rotating which goes first):

    git archive BASE | tar x -C /tmp/base                # an older commit, whole
    python3 scripts/ab_kernels.py /tmp/base,. --checkouts 3 --shapes 1x4096,1x8192 --modes bf16,group --out DIR

Each process hashes the outputs of its first fresh call (sha256 of their bytes); a shape and output kind
whose hashes differ from the first checkout's in any round is marked `bits differ`. Per checkout the median
of its processes' medians is reported, with each process's value (the noise between processes).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

import fused_ar
from fused_ar.bench.peers import NVFP4_GLOBAL_SCALE
from fused_ar.device import launch, ops
from fused_ar.jit import render

CALLS = 20
MODES = ("bf16", "static", "token", "group", "ue8m0", "nvfp4", "mxfp4")


def sources_of(root: Path) -> Path:
    """The kernels_src directory `root` is or holds."""
    src = root if (root / "fa_platform.h").is_file() else root / "kernels_src"
    if not (src / "fa_platform.h").is_file():
        raise SystemExit(f"ab_kernels.py: {root}: neither it nor its kernels_src holds the kernel sources")
    return src


def use_sources(src: Path) -> None:
    """Render from `src` from now on, and forget the plans and functions built from other sources."""
    render.kernels_src_dir = lambda: src
    ops._plans.clear()
    ops._by_pack.clear()
    launch._functions.clear()


def call(mode: str, x: Any, r: Any, w: Any, residual_out: Any, scale: Any, global_scale: Any) -> tuple:
    eps = 1e-6
    if mode == "bf16":
        return fused_ar.add_rmsnorm(x, r, w, eps, residual_out=residual_out)
    if mode == "static":
        return fused_ar.add_rmsnorm_fp8(x, r, w, eps, scale=scale, residual_out=residual_out)
    if mode == "token":
        return fused_ar.add_rmsnorm_fp8(x, r, w, eps, residual_out=residual_out)
    if mode in ("group", "ue8m0"):
        return fused_ar.add_rmsnorm_fp8(x, r, w, eps, group_size=128, residual_out=residual_out,
                                        scales_format="fp32" if mode == "group" else "ue8m0_packed")
    return fused_ar.add_rmsnorm_fp4(x, r, w, eps, fp4_format=mode, residual_out=residual_out,
                                    global_scale=global_scale if mode == "nvfp4" else None)


def as_bytes(outputs: tuple) -> list[Any]:
    return [t.reshape(-1).view(torch.uint8) for t in outputs]


def digest(outputs: list[Any]) -> str:
    """sha256 of the outputs' bytes, in order: what two processes compare."""
    h = hashlib.sha256()
    for t in outputs:
        h.update(t.cpu().numpy().tobytes())
    return h.hexdigest()


def is_checkout(root: Path) -> bool:
    return (root / "fused_ar" / "__init__.py").is_file() and (root / "kernels_src" / "fa_platform.h").is_file()


def summarize(names: list[str], rounds: dict[str, list[list[dict]]]) -> tuple[list[str], list[dict]]:
    """(lines, rows) from each checkout's processes' ab.json rows (one variant each): per shape and output
    kind the median of the processes' medians, its ratio to the first checkout's, each process's value, and
    whether every process wrote the first checkout's bits."""
    cases = {name: [{(r["m"], r["n"], r["mode"]): r for r in rows} for rows in rounds[name]] for name in names}
    lines, out = [], []
    for case in cases[names[0]][0]:
        us = {name: [next(iter(process[case]["us"].values())) for process in cases[name]] for name in names}
        hashes = {name: {next(iter(process[case]["sha256"].values())) for process in cases[name]} for name in names}
        same = {name: hashes[name] == hashes[names[0]] and len(hashes[name]) == 1 for name in names}
        med = {name: statistics.median(us[name]) for name in names}
        m, n, mode = case
        lines.append(f"{m}x{n} {mode:7s} " + " ".join(
            f"{name}={med[name]:.3f}({med[name] / med[names[0]]:.3f},{'same bits' if same[name] else 'bits differ'};"
            f" {', '.join(f'{t:.3f}' for t in us[name])})" for name in names))
        out.append({"m": m, "n": n, "mode": mode, "us": med, "us_per_process": us, "same_bits": same})
    return lines, out


def run_checkouts(roots: list[Path], names: list[str], args: argparse.Namespace) -> tuple[list[str], list[dict]]:
    """Each checkout's timing in processes of its own, args.checkouts rounds taken in turn."""
    rounds: dict[str, list[list[dict]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.checkouts):
            turn = rnd % len(roots)
            for i in list(range(turn, len(roots))) + list(range(turn)):
                out = Path(tmp) / f"{i}_{rnd}"
                path = os.pathsep.join([str(roots[i])] + [p for p in [os.environ.get("PYTHONPATH")] if p])
                cmd = [sys.executable, str(Path(__file__).resolve()), str(roots[i] / "kernels_src"), "--shapes",
                       args.shapes, "--modes", args.modes, "--replays", str(args.replays), "--out", str(out)]
                print(f"ab_kernels.py: round {rnd + 1} of {args.checkouts}: {roots[i]}", flush=True)
                done = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=path), cwd=roots[i])
                if done.returncode:
                    raise SystemExit(f"ab_kernels.py: the process of {roots[i]} (round {rnd + 1}) exited "
                                     f"{done.returncode}")
                rounds[names[i]].append(json.loads((out / "ab.json").read_text()))
    return summarize(names, rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", help="comma-separated directories, each a kernels_src or holding one")
    parser.add_argument("--shapes", default="1x4096,16x4096,1x8192,256x8192", help="m x n, comma-separated")
    parser.add_argument("--modes", default="bf16,static,group", help=f"comma-separated of {', '.join(MODES)}")
    parser.add_argument("--replays", type=int, default=31)
    parser.add_argument("--out", default=".")
    parser.add_argument("--checkouts", type=int, default=0, metavar="R",
                        help="variants are whole checkouts, each timed in its own processes, R rounds in turn")
    args = parser.parse_args()
    roots = [Path(v).resolve() if args.checkouts else Path(v) for v in args.variants.split(",")]
    sources = [sources_of(root) for root in roots]
    names = [root.resolve().name for root in roots]
    modes = args.modes.split(",")
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise SystemExit(f"ab_kernels.py: unknown modes {unknown}; known: {', '.join(MODES)}")
    if len(set(names)) != len(names):
        raise SystemExit(f"ab_kernels.py: the variant directories need distinct names, not {names}")
    try:
        shapes = [(int(m), int(n)) for m, n in (s.split("x") for s in args.shapes.split(","))]
    except ValueError:
        raise SystemExit(f"ab_kernels.py: --shapes takes m x n pairs such as 1x4096,256x8192, not {args.shapes!r}")
    if args.replays < 1:
        raise SystemExit(f"ab_kernels.py: --replays must be at least 1, not {args.replays}")
    if args.checkouts < 0:
        raise SystemExit(f"ab_kernels.py: --checkouts must be a number of rounds of at least 1, not {args.checkouts}")
    if args.checkouts:
        not_checkouts = [str(root) for root in roots if not is_checkout(root)]
        if not_checkouts:
            raise SystemExit(f"ab_kernels.py: --checkouts takes directories holding fused_ar and kernels_src; "
                             f"not such: {', '.join(not_checkouts)}")
        lines, rows = run_checkouts(roots, names, args)
        print("\n".join(lines), flush=True)
        write(Path(args.out), lines, rows)
        return
    print(f"ab_kernels.py: fused_ar from {Path(fused_ar.__file__).parent}", flush=True)
    if not torch.cuda.is_available():
        raise SystemExit(f"ab_kernels.py needs a GPU; torch {torch.__version__} sees none")
    dev = torch.device("cuda")
    scale = torch.tensor([0.02], device=dev)
    global_scale = torch.tensor([NVFP4_GLOBAL_SCALE], device=dev)
    lines, rows = [torch.cuda.get_device_name()], []
    for m, n in shapes:
        for mode in modes:
            gen = torch.Generator(device=dev).manual_seed(m * 7 + n)
            x, r = (torch.randn(m, n, device=dev, dtype=torch.bfloat16, generator=gen) for _ in range(2))
            w = torch.randn(n, device=dev, dtype=torch.bfloat16, generator=gen)
            ref, graphs, diffs, hashes, keep = None, {}, {}, {}, []
            for name, src in zip(names, sources):
                use_sources(src)
                got = as_bytes(call(mode, x, r, w, torch.empty_like(r), scale, global_scale))
                ref = got if ref is None else ref
                hashes[name] = digest(got)
                diffs[name] = sum(int((a != b).sum()) if a.numel() == b.numel() else max(a.numel(), b.numel())
                                  for a, b in zip(ref, got))
                xs, rs = x.clone(), r.clone()  # in place, as a serving step runs it
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    for _ in range(3):  # plans built and kernels loaded before the capture
                        call(mode, xs, rs, w, rs, scale, global_scale)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=stream):
                    for _ in range(CALLS):
                        call(mode, xs, rs, w, rs, scale, global_scale)
                graphs[name] = graph
                keep.append((xs, rs))
            times: dict[str, list[float]] = {name: [] for name in names}
            for rep in range(args.replays):
                turn = rep % len(names)
                for name in names[turn:] + names[:turn]:
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    graphs[name].replay()
                    end.record()
                    torch.cuda.synchronize()
                    times[name].append(start.elapsed_time(end) * 1e3 / CALLS)
            med = {name: statistics.median(ts) for name, ts in times.items()}
            line = f"{m}x{n} {mode:7s} " + " ".join(
                f"{name}={med[name]:.3f}({med[name] / med[names[0]]:.3f},diff={diffs[name]})" for name in names)
            print(line, flush=True)
            lines.append(line)
            rows.append({"m": m, "n": n, "mode": mode, "us": med, "diff_bytes": diffs, "sha256": hashes})
    write(Path(args.out), lines, rows)


def write(out: Path, lines: list[str], rows: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "ab.txt").write_text("\n".join(lines) + "\n")
    (out / "ab.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()

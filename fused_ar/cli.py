"""The command line: `python -m fused_ar source | warm | cache | info | demo | bench`.

Commands parse their arguments and call library functions; none of them holds kernel, cache or launch
logic of its own. Warming runs in parallel worker processes and works on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Optional, Sequence

from ._version import __version__
from .errors import FusedArError
from .spec import DEFAULT_PACK, DType, KernelSpec, Op


def _csv(kind):
    def parse(text: str) -> list:
        try:
            return [kind(part) for part in text.split(",") if part]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse


def _paths(text: str) -> list[str]:
    from .bench.paths import parse_paths

    try:
        return parse_paths(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _default_arch() -> Optional[str]:
    """The arch of GPU 0 when one is visible, else None (then --arch is required)."""
    try:
        import torch

        if torch.cuda.is_available():
            from .runtime import device_arch

            return device_arch(0)
    except Exception:
        pass
    return None


def _archs(args: argparse.Namespace) -> list[str]:
    if args.arch:
        return args.arch
    arch = _default_arch()
    if arch is None:
        raise FusedArError("no GPU visible: name the target with --arch (e.g. --arch sm_90 or --arch gfx942)")
    return [arch]


# -- source -------------------------------------------------------------------------------------------
def cmd_source(args: argparse.Namespace) -> int:
    from .render import render

    arch = _archs(args)[0]
    spec = KernelSpec(Op(args.op), args.dtype, arch, args.pack, args.ngpus, args.block)
    sys.stdout.write(render(spec).text)
    return 0


# -- warm ---------------------------------------------------------------------------------------------
def _warm_one(spec_dict: dict) -> tuple[dict, str, float, str]:
    """Worker: compile one spec through the default cache. Returns (spec, status, seconds, error)."""
    from .cache import default_cache

    spec = KernelSpec.from_dict(spec_dict)
    start = time.perf_counter()
    try:
        lookup = default_cache().get(spec)
        return spec_dict, lookup.status, lookup.seconds, ""
    except Exception as exc:  # reported per kernel; the summary counts it as failed
        return spec_dict, "failed", time.perf_counter() - start, f"{type(exc).__name__}: {exc}"


def cmd_warm(args: argparse.Namespace) -> int:
    from .cache import cache_key, default_cache
    from .compiler import compiler_for
    from .kernels import warm_matrix
    from .render import render

    archs = _archs(args)
    for arch in archs:  # fail fast, with the reason, before any worker starts
        compiler_for(arch).identity()
    specs = warm_matrix(archs, args.dtype, args.ngpus)
    cache = default_cache()
    if args.dry_run:
        for spec in specs:
            compiler = compiler_for(spec.arch)
            key = cache_key(render(spec).text, compiler.options(spec.arch), spec.arch, compiler.identity())
            state = "cached" if cache.read(key) is not None else "to build"
            print(f"{state:9s} {spec.kernel_name} ({spec.arch})")
        print(f"warm --dry-run: {len(specs)} kernels for {','.join(archs)} in {cache.root}")
        return 0

    jobs = max(1, min(args.jobs or os.cpu_count() or 1, len(specs) or 1))
    counts = {"built": 0, "cached": 0, "failed": 0}
    start = time.perf_counter()
    bar = None
    if sys.stderr.isatty():
        try:
            from tqdm import tqdm

            bar = tqdm(total=len(specs), unit="kernel", desc="warm", file=sys.stderr)
        except ImportError:
            bar = None
    import multiprocessing

    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_warm_one, s.to_dict()) for s in specs]
        for done, future in enumerate(as_completed(futures), 1):
            spec_dict, status, seconds, error = future.result()
            counts[status] += 1
            name = KernelSpec.from_dict(spec_dict).kernel_name
            line = f"[{done}/{len(specs)}] {status:6s} {seconds:6.2f}s {name} ({spec_dict['arch']})"
            if bar is not None:
                bar.update(1)
                if error:
                    bar.write(f"{line}: {error}")
            else:
                print(line + (f": {error}" if error else ""), flush=True)
    if bar is not None:
        bar.close()
    print(f"warm: {len(specs)} kernels for {','.join(archs)}: {counts['built']} compiled, {counts['cached']} "
          f"already cached, {counts['failed']} failed in {time.perf_counter() - start:.1f} s (-j {jobs}); "
          f"cache {cache.root}")
    return 1 if counts["failed"] else 0


# -- cache / info ---------------------------------------------------------------------------------------
def cmd_cache(args: argparse.Namespace) -> int:
    from .cache import default_cache

    cache = default_cache()
    if args.action == "clear":
        print(f"removed {cache.clear()} entries from {cache.root}")
        return 0
    if args.action == "verify":
        good, bad = cache.verify()
        for key in bad:
            print(f"corrupt or partial: {key}")
        print(f"verified {good} entries in {cache.root}; {len(bad)} bad (they are rebuilt on next use)")
        return 1 if bad else 0
    entries = list(cache.entries())
    size = sum(e.meta.get("size", 0) for e in entries)
    print(f"cache directory: {cache.root} ({cache.state()})")
    print(f"lock directory:  {cache.lock_root}")
    print(f"entries:         {len(entries)} ({size / 1024:.0f} KiB of code objects)")
    by_arch: dict[str, int] = {}
    for e in entries:
        arch = e.meta.get("arch", "?")
        by_arch[arch] = by_arch.get(arch, 0) + 1
    for arch, n in sorted(by_arch.items()):
        print(f"  {arch}: {n}")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from .compiler import compiler_for

    print(f"fused_ar {__version__}")
    try:
        import torch

        build = f"ROCm {torch.version.hip}" if getattr(torch.version, "hip", None) else f"CUDA {torch.version.cuda}"
        print(f"torch {torch.__version__} ({build})")
        if torch.cuda.is_available():
            from .runtime import device_arch

            for d in range(torch.cuda.device_count()):
                print(f"  device {d}: {torch.cuda.get_device_name(d)} arch {device_arch(d)}")
        else:
            print("  no GPU visible")
    except ImportError:
        print("torch not installed")
    for arch, what in (("sm_90", "NVRTC (CUDA)"), ("gfx942", "hiprtc (ROCm)")):
        try:
            print(f"{what}: {compiler_for(arch).identity()}")
        except FusedArError as exc:
            print(f"{what}: unavailable ({exc})")
    return cmd_cache(argparse.Namespace(action="info"))


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(args)


def cmd_bench(args: argparse.Namespace) -> int:
    if args.what == "add_rmsnorm":
        from .bench.add_rmsnorm import bench_add_rmsnorm

        if len(args.dtype) != 1:
            raise FusedArError(f"bench add_rmsnorm takes one --dtype, not {[d.value for d in args.dtype]}")
        return bench_add_rmsnorm(argparse.Namespace(
            dtype=args.dtype[0], hidden=args.hidden or [4096, 8192], out=args.out, sweep_blocks=args.sweep_blocks,
            m=args.m or [1, 4, 16, 64, 256, 1024, 4096, 16384]))
    from .bench.paths import DEFAULT_PATHS
    from .bench.sweep import run_sweep

    args.paths = args.paths or list(DEFAULT_PATHS)
    args.hidden = args.hidden or list(BENCH_HIDDEN)
    args.m = args.m or list(BENCH_M)
    args.out = args.out or "fused_ar_bench"
    return run_sweep(args)


BENCH_M = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
BENCH_HIDDEN = (4096, 7168, 8192)


def _sizes(text: str) -> list[int]:
    """'1,2,4', '1..1024' (doubling), '64..512:64' (a step), or a mix: sorted, without repeats."""
    sizes: set[int] = set()
    try:
        for part in (p.strip() for p in text.split(",") if p.strip()):
            if ".." not in part:
                sizes.add(int(part))
                continue
            low, _, rest = part.partition("..")
            high, _, step = rest.partition(":")
            a, b = int(low), int(high)
            if a < 1 or b < a or (step and int(step) < 1):
                raise ValueError(f"{part!r}: a range is LOW..HIGH or LOW..HIGH:STEP with 1 <= LOW <= HIGH")
            value = a
            while value <= b:
                sizes.add(value)
                value = value + int(step) if step else value * 2
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not sizes:
        raise argparse.ArgumentTypeError(f"{text!r} names no size")
    return sorted(sizes)


# -- parser -------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fused_ar", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"fused_ar {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("source", help="print the rendered source of one kernel")
    p.add_argument("op", choices=[o.value for o in Op])
    p.add_argument("--dtype", type=DType.parse, default=DType.BF16)
    p.add_argument("--arch", type=_csv(str), help="target arch (default: GPU 0's)")
    p.add_argument("--pack", type=int, default=DEFAULT_PACK)
    p.add_argument("--ngpus", type=int, default=1)
    p.add_argument("--block", type=int, default=256)
    p.set_defaults(func=cmd_source)

    p = sub.add_parser("warm", help="compile the kernel matrix ahead of time into the cache")
    p.add_argument("--arch", type=_csv(str), help="comma-separated archs, e.g. sm_90,gfx942 (default: GPU 0's)")
    p.add_argument("--dtype", type=_csv(DType.parse), default=list(DType))
    p.add_argument("--ngpus", type=_csv(int), default=[1, 2, 4, 8])
    p.add_argument("-j", "--jobs", type=int, default=0, help="worker processes (default: all cores)")
    p.add_argument("--dry-run", action="store_true", help="list the kernels and whether each is cached")
    p.set_defaults(func=cmd_warm)

    p = sub.add_parser("cache", help="inspect or maintain the kernel cache")
    p.add_argument("action", choices=["info", "clear", "verify"])
    p.set_defaults(func=cmd_cache)

    p = sub.add_parser("info", help="platform, devices, compilers and cache")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("demo", help="run the fused op on the GPUs here (one GPU: N ranks emulated), checked and timed")
    p.add_argument("--tp", type=_csv(int), default=[2, 4, 8], help="group sizes to emulate on one GPU")
    p.add_argument("--m", type=_csv(int), default=[1, 16, 128, 1024])
    p.add_argument("--n", type=int, default=8192)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("bench", help="benchmarks on the GPU: the fused all-reduce suite, or the local add_rmsnorm")
    p.add_argument("what", nargs="?", choices=["allreduce_rmsnorm", "add_rmsnorm"], default="allreduce_rmsnorm")
    p.add_argument("--tp", type=_csv(int), default=[2, 4, 8], help="group sizes (default 2,4,8)")
    p.add_argument("--m", type=_sizes, default=None,
                   help=f"rows: a list and/or ranges, e.g. 1,2,4 or 1..1024 (doubling) or 64..512:64 (default "
                        f"{','.join(map(str, BENCH_M))})")
    p.add_argument("--hidden", type=_csv(int), default=None, help="default 4096,7168,8192")
    p.add_argument("--dtype", type=_csv(DType.parse), default=[DType.BF16])
    p.add_argument("--paths", type=_paths, default=None, help="comma-separated (default: all)")
    p.add_argument("--graph-calls", type=int, default=2000, help="op calls captured per graph (default 2000)")
    p.add_argument("--replays", type=int, default=80, help="timed replays per path and shape (default 80)")
    p.add_argument("--out", default=None, help="output directory (default ./fused_ar_bench)")
    p.add_argument("--write-thresholds", action="store_true",
                   help="store the measured crossovers in the cache directory for the communicator's auto path")
    p.add_argument("--one-process", action="store_true", help="emulate every TP on GPU 0 even with several GPUs")
    p.add_argument("--sweep-blocks", action="store_true", help="add_rmsnorm: also time every block size")
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv[argv.index(args.command) + 1:] if args.command in argv else []
    try:
        return args.func(args)
    except FusedArError as exc:
        print(f"fused_ar: error: {exc}", file=sys.stderr)
        return 2

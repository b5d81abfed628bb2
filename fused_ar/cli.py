"""The command line: `python -m fused_ar source | warm | cache | info | demo | bench` (also `fused-ar`).

Every argument and every environment variable is checked before any work, with the library's own rules
(fused_ar.jit.spec, fused_ar.env): a bad value ends in one line, `fused_ar: error: ...`, and exit status 2.
Commands call library functions; none holds kernel, cache or launch logic of its own.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, NoReturn, Optional, Sequence

from ._version import __version__
from .errors import FusedArError
from .jit.spec import (ADD_RMSNORM_BLOCKS, BLOCK_SIZES, DEFAULT_PACK, PACK_SIZES, SUPPORTED_NGPUS, DType,
                       KernelSpec, Op, platform_of_arch)
from .jit.kernels import CROSS_GPU_NGPUS

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
# A size list is expanded in memory: more than this many sizes is a typo, not a benchmark.
MAX_SIZES = 4096


def _shown(value: Any) -> str:
    """A default as a user types it: lists comma-joined, enums by value."""
    if isinstance(value, (list, tuple)):
        return ",".join(_shown(v) for v in value)
    return str(getattr(value, "value", value))


class _HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, written as it would be typed (unless the help says it)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        return f"{text} (default: {_shown(action.default)})"


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: `fused_ar: error: <what> <value>: <rule>`, exit 2."""

    def error(self, message: str) -> NoReturn:
        ours = re.fullmatch(r"argument [^:]+: (\S+ '.*': .*)", message, re.S)
        fail(ours.group(1) if ours else message.replace("argument ", "", 1))


def fail(message: str) -> NoReturn:
    print(f"fused_ar: error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


class _Bad(ValueError):
    """A value that breaks a rule; `value` is the offending item (one element of a list)."""

    def __init__(self, value: str, rule: str) -> None:
        super().__init__(rule)
        self.value = value


def _rule(exc: Exception) -> str:
    """The rule part of a library error ("unknown arch 'x': expected ..." -> "expected ...")."""
    text = str(exc)
    return text.split(": ", 1)[1] if text.startswith(("unknown ", "unsupported ")) and ": " in text else text


def _type(what: str, parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type whose error reads `<what> <value>: <rule>`."""
    def checked(text: str) -> Any:
        try:
            return parse(text)
        except _Bad as exc:
            raise argparse.ArgumentTypeError(f"{what} {exc.value!r}: {exc}") from None
        except (ValueError, FusedArError) as exc:
            raise argparse.ArgumentTypeError(f"{what} {text!r}: {_rule(exc)}") from None
    checked.__name__ = what
    return checked


def _one_of(allowed: Sequence[int]) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not (text.isascii() and text.isdigit()) or int(text) not in allowed:
            raise ValueError(f"must be one of {', '.join(map(str, allowed))}")
        return int(text)
    return parse


def _at_least_one(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise ValueError("must be a whole number >= 1")
    return int(text)


def _jobs(text: str) -> int:
    """Worker processes: 1 up to this machine's CPU count (more only queue behind each other)."""
    most = os.cpu_count() or 1
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= most:
        raise ValueError(f"must be a whole number from 1 to {most} (this machine's CPUs)")
    return int(text)


def _arch(text: str) -> str:
    platform_of_arch(text)
    return text


def _list(parse: Callable[[str], Any]) -> Callable[[str], list]:
    """Comma-separated values, each through `parse`; at least one, no repeats."""
    def parse_all(text: str) -> list:
        items = text.split(",")  # taken as typed: 'sm_90 ' is not sm_90
        if not text.strip() or any(not item for item in items):
            raise ValueError("a comma-separated list with no empty item")
        values = []
        for item in items:
            try:
                values.append(parse(item))
            except (ValueError, FusedArError) as exc:
                raise _Bad(item, _rule(exc)) from None
        return list(dict.fromkeys(values))
    return parse_all


def _directory(text: str) -> Path:
    if not text or "\x00" in text:
        raise ValueError("a directory path")
    return Path(text).expanduser().absolute()


def _dtype(text: str) -> DType:
    return DType.parse(text)


def _sizes(text: str) -> list[int]:
    """'1,2,4', '1..1024' (doubling), '64..512:64' (a step), or a mix: sorted, without repeats."""
    sizes: set[int] = set()
    for part in (p.strip(" ") for p in text.split(",")):
        if not part:
            raise ValueError("a list of sizes and ranges with no empty item")
        if ".." not in part:
            sizes.add(_at_least_one(part))
            continue
        low, _, rest = part.partition("..")
        high, _, step = rest.partition(":")
        a, b = _at_least_one(low), _at_least_one(high)
        s = _at_least_one(step) if step else 0
        if b < a:
            raise ValueError("a range is LOW..HIGH or LOW..HIGH:STEP with 1 <= LOW <= HIGH")
        count = (b - a) // s + 1 if s else (b // a).bit_length()
        if len(sizes) + count > MAX_SIZES:
            raise ValueError(f"names more than {MAX_SIZES} sizes")
        value = a
        while value <= b:
            sizes.add(value)
            value = value + s if s else value * 2
    return sorted(sizes)


def _peers(text: str) -> tuple[str, ...]:
    from .bench.peers import parse_peers

    return parse_peers(text)


def _paths(text: str) -> list[str]:
    from .bench.paths import parse_paths

    return parse_paths(text)


def check_environment() -> list[tuple[str, str, str]]:
    """(name, raw value, problem or "") of every variable fused_ar reads."""
    from . import env

    rows = []
    for var in env.VARIABLES:
        raw = os.environ.get(var.name, "")
        try:
            var.get()
            problem = ""
        except FusedArError as exc:
            problem = str(exc)
        rows.append((var.name, raw, problem))
    return rows


def _default_arch() -> Optional[str]:
    """The arch of GPU 0 when one is visible, else None (then --arch is required)."""
    try:
        import torch

        if torch.cuda.is_available():
            from .backends import device_arch

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


def _usable_archs(archs: Sequence[str]) -> tuple[list[str], list[str]]:
    """(archs a compiler here can build, one line per arch it cannot: why)."""
    from .backends import compiler_for

    usable, refused = [], []
    for arch in archs:
        try:
            compiler_for(arch).check_arch(arch)
            usable.append(arch)
        except FusedArError as exc:
            refused.append(f"{arch}: {exc}")
    return usable, refused


# -- source -------------------------------------------------------------------------------------------
def cmd_source(args: argparse.Namespace) -> int:
    from .jit.kernels import kernel_def
    from .jit.render import render

    arch = _archs(args)[0]
    op = Op(args.op)
    if args.ngpus not in kernel_def(op).ngpus:
        fail(f"ngpus {args.ngpus}: {op.value} takes {', '.join(map(str, kernel_def(op).ngpus))}")
    try:
        spec = KernelSpec(op, args.dtype, arch, args.pack, args.ngpus, args.block)
    except ValueError as exc:
        fail(str(exc))
    sys.stdout.write(render(spec).text)
    return 0


# -- warm ---------------------------------------------------------------------------------------------
def _same_error(error: str, spec: KernelSpec) -> str:
    """An error with what names its kernel taken out, so one repeated for every kernel is seen as one."""
    return error.replace(str(spec), "<spec>").replace(spec.kernel_name, "<kernel>").splitlines()[0][:300]


def cmd_warm(args: argparse.Namespace) -> int:
    from .jit.cache import cache_key, write_manifest
    from .backends import compiler_for
    from .jit.kernels import warm_matrix
    from .jit.render import render
    from .jit.warm import Result, target_cache, warm

    archs, refused = _usable_archs(_archs(args))
    if not archs:
        fail("; ".join(refused))
    for line in refused:
        print(f"warm: skipping {line}", file=sys.stderr)
    specs = warm_matrix(archs, args.dtype, args.ngpus, variants=args.variants, fp8=args.fp8)
    into = str(args.into) if args.into else None
    cache = target_cache(into)
    if args.dry_run:
        for spec in specs:
            compiler = compiler_for(spec.arch)
            key = cache_key(render(spec).text, compiler.options(spec.arch), spec.arch, compiler.identity())
            state = "cached" if cache.read(key, spec) is not None else "to build"
            print(f"{state:9s} {spec.kernel_name} ({spec.arch})")
        print(f"warm --dry-run: {len(specs)} kernels for {','.join(archs) or 'no arch'} in {cache.root}")
        return 1 if refused else 0

    # before any worker starts: an untrusted directory raises here, one that cannot take entries ends here
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # said below, in one line
        state = cache.state()
    if state != "disk":
        fail(f"{'into' if into else 'cache directory'} {str(cache.root)!r}: {cache.dir.condition()}; nothing is "
             f"compiled (name a directory this user can write{'' if into else ' with ' + _CACHE_VAR})")
    jobs = max(1, min(args.jobs or os.cpu_count() or 1, len(specs) or 1))
    counts = {"built": 0, "cached": 0, "failed": 0, "unsaved": 0}
    seen_errors: dict[str, str] = {}
    bar = _progress(len(specs))
    start = time.perf_counter()

    def report(result: Result) -> None:
        counts[result.status] += 1
        counts["unsaved"] += result.status == "built" and not result.saved
        line = f"[{sum(counts[k] for k in ('built', 'cached', 'failed'))}/{len(specs)}] {result.status:6s} " \
               f"{result.seconds:6.2f}s {result.spec.kernel_name} ({result.spec.arch})"
        if result.error:
            same = _same_error(result.error, result.spec)
            first = seen_errors.setdefault(same, result.spec.kernel_name)
            line += f": {result.error}" if first == result.spec.kernel_name else f": the same error as {first}"
        if bar is not None:
            bar.update(1)
            if result.error:
                bar.write(line)
        else:
            print(line, flush=True)

    try:
        warm(specs, jobs, report, compiler_for, into=into)
    except KeyboardInterrupt:
        if bar is not None:
            bar.close()
        print(f"warm: interrupted; {counts['built']} compiled, {counts['cached']} already cached, "
              f"{len(specs) - counts['built'] - counts['cached'] - counts['failed']} not done", file=sys.stderr)
        return EXIT_INTERRUPTED
    if bar is not None:
        bar.close()
    saved = counts["built"] - counts["unsaved"]
    print(f"warm: {len(specs)} kernels for {','.join(archs) or 'no arch'}: {counts['built']} compiled "
          f"({saved} saved), {counts['cached']} already cached, {counts['failed']} failed in "
          f"{time.perf_counter() - start:.1f} s (-j {jobs}); {'layer' if into else 'cache'} {cache.root}")
    if into and cache.state() == "disk":
        write_manifest(cache.root, {arch: compiler_for(arch).identity() for arch in archs},
                       sum(1 for e in cache.entries() if e.meta is not None))
        print(f"warm: layer {cache.root} ready: FUSED_AR_CACHE_PATH={cache.root} lets any user read it")
    return 1 if counts["failed"] or counts["unsaved"] or refused else 0




def _progress(total: int) -> Any:
    if not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm

        return tqdm(total=total, unit="kernel", desc="warm", file=sys.stderr)
    except ImportError:
        return None


# -- cache / info ---------------------------------------------------------------------------------------
def cmd_cache(args: argparse.Namespace) -> int:
    from .jit import trust
    from .jit.cache import STATE_DIRS, default_cache

    if args.dir is not None:
        return _cache_layer(args)
    cache = default_cache()
    if args.action == "clear":
        removed, left = cache.clear()
        for line in left:
            print(f"cache clear: could not remove {line}", file=sys.stderr)
        print(f"removed {removed} entries from {cache.root}" + (f"; {len(left)} could not be removed" if left else ""))
        return 1 if left else 0
    if args.action == "verify":
        good, bad = cache.verify()
        for entry in bad:
            print(f"bad entry {entry.key}: {entry.problem}")
        print(f"verified {good} entries in {cache.root}; {len(bad)} bad (they are rebuilt on next use)")
        return 1 if bad else 0
    entries = [e for e in cache.entries() if e.meta is not None]
    size = sum(e.meta["size"] for e in entries)
    print(f"cache directory: {cache.root} ({cache.dir.condition()})")
    for name in STATE_DIRS:
        found = trust.condition(cache.root / name)
        print(f"  {name + ':':14s} {'missing: made when first needed' if found == 'missing' else found}")
    lock = trust.condition(cache.lock_root)
    print(f"lock directory:  {cache.lock_root} ({'missing: made at the first build' if lock == 'missing' else lock})")
    print(f"entries:         {len(entries)} ({size / 1024:.0f} KiB of code objects)")
    by_arch: dict[str, int] = {}
    for e in entries:
        by_arch[e.meta["arch"]] = by_arch.get(e.meta["arch"], 0) + 1
    for arch, n in sorted(by_arch.items()):
        print(f"  {arch}: {n}")
    return 0


def _cache_layer(args: argparse.Namespace) -> int:
    """`cache verify DIR` / `cache info DIR`: a read-only layer, read as its users read it."""
    from .jit.cache import CacheDir, layer_owners, read_manifest

    if args.action == "clear":
        fail(f"dir {str(args.dir)!r}: `cache clear` clears only the writable cache (FUSED_AR_CACHE_DIR); "
             "a layer is rebuilt with `warm --into`")
    layer = CacheDir(args.dir, owners=layer_owners(), writable=False)
    if layer.state(create=False) == "absent":
        fail(f"dir {str(args.dir)!r}: no such directory")
    manifest = read_manifest(layer.root)
    built = (f"built by fused_ar {manifest['version']} with {', '.join(f'{a}: {c}' for a, c in manifest['compilers'].items())}"
             if manifest else "no manifest (not made by `warm --into`?)")
    entries = list(layer.entries())
    bad = [e for e in entries if e.meta is None or e.problem]
    print(f"layer {layer.root}: {len(entries) - len(bad)} good entries, {len(bad)} bad; {built}")
    for entry in bad:
        print(f"bad entry {entry.key}: {entry.problem}")
    return 1 if bad or (args.action == "verify" and manifest is None) else 0


def _layers_report() -> None:
    """Which layer serves the warm matrix of each arch, and why a layer would miss, before any request."""
    from .jit.cache import coverage, default_cache, read_manifest, why_layer_misses
    from .backends import compiler_for
    from .jit.kernels import warm_matrix

    cache = default_cache()
    if not cache.configured_layers:
        print("cache layers:    none (FUSED_AR_CACHE_PATH unset)")
        return
    gpu_arch = _default_arch()
    for layer in cache.configured_layers:
        condition = layer.condition()
        if not condition.startswith("ok"):
            print(f"cache layer:     {layer.root} ({condition}; not used)")
            continue
        manifest = read_manifest(layer.root)
        archs = [gpu_arch] if gpu_arch else sorted(manifest["compilers"]) if manifest else []
        print(f"cache layer:     {layer.root}" + (f" (fused_ar {manifest['version']})" if manifest else ""))
        for arch in archs:
            try:
                identity = compiler_for(arch).identity()
                found = coverage(cache, warm_matrix([arch], list(DType), SUPPORTED_NGPUS), compiler_for)
            except FusedArError as exc:
                print(f"  {arch}: cannot check here ({str(exc).splitlines()[0]})")
                continue
            served = sum(1 for _, where in found if where == str(layer.root))
            missing = sum(1 for _, where in found if not where)
            line = f"  {arch}: serves {served} of {len(found)} kernels"
            if missing:
                line += f"; {missing} would be compiled at first use: {why_layer_misses(manifest, arch, identity)}"
            print(line)


def cmd_info(args: argparse.Namespace) -> int:
    from .backends import compiler_for

    print(f"fused_ar {__version__}")
    try:
        import torch

        build = f"ROCm {torch.version.hip}" if getattr(torch.version, "hip", None) else f"CUDA {torch.version.cuda}"
        print(f"torch {torch.__version__} ({build})")
        if torch.cuda.is_available():
            from .backends import device_arch

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
    print("environment:")
    invalid = 0
    for name, raw, problem in check_environment():
        invalid += bool(problem)
        shown = f"{name}={raw}" if raw else f"{name} unset"
        print(f"  {shown}: {'INVALID: ' + problem if problem else 'ok'}")
    status = cmd_cache(argparse.Namespace(action="info", dir=None))
    if not invalid:
        _layers_report()
    return 1 if invalid else status


def cmd_probe(args: argparse.Namespace) -> int:
    from .comm.probe import probe_command

    return probe_command(args.gpus)


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(args)


# Options of one benchmark only: given to another, they would be silently ignored.
_BENCH_ONLY = {"sweep_blocks": "add_rmsnorm", "variants": "add_rmsnorm", "fp8": "add_rmsnorm", "peers": "add_rmsnorm",
               "profile": "host", "paths": "allreduce_rmsnorm", "write_thresholds": "allreduce_rmsnorm",
               "one_process": "allreduce_rmsnorm"}


def cmd_bench(args: argparse.Namespace) -> int:
    for option, what in _BENCH_ONLY.items():
        if getattr(args, option) not in (None, False) and args.what != what:  # given (--peers none is ())
            fail(f"--{option.replace('_', '-')} with bench {args.what}: only bench {what} takes it")
    if args.write_thresholds and args.one_process:
        fail("--write-thresholds with --one-process: thresholds come from one process per GPU; an emulation "
             "on one GPU does not measure N GPUs")
    if args.what == "fp8":
        from .bench.fp8 import bench_fp8

        args.m, args.hidden = args.m or [1, 16, 128, 1024], args.hidden or [4096, 8192]
        return bench_fp8(args)
    if args.what == "startup":
        from .bench.startup import bench_startup

        args.replays = min(args.replays, 9)
        return bench_startup(args)
    if args.what == "host":
        from .bench.host import bench_host

        if len(args.dtype) != 1:
            fail(f"dtype {','.join(d.value for d in args.dtype)}: bench host takes one")
        args.m, args.hidden = args.m or [8], args.hidden or [8192]
        return bench_host(args)
    if args.what == "add_rmsnorm":
        from .bench.add_rmsnorm import bench_add_rmsnorm
        from .bench.peers import PEER_KINDS

        if len(args.dtype) != 1:
            fail(f"dtype {','.join(d.value for d in args.dtype)}: bench add_rmsnorm takes one")
        return bench_add_rmsnorm(argparse.Namespace(
            dtype=args.dtype[0], hidden=args.hidden or [4096, 8192], out=args.out, sweep_blocks=args.sweep_blocks,
            variants=args.variants, fp8=args.fp8, peers=tuple(PEER_KINDS) if args.peers is None else args.peers,
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


# -- parser -------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    fmt = _HelpFormatter
    parser = _Parser(prog="python -m fused_ar", description=__doc__.splitlines()[0], formatter_class=fmt)
    parser.add_argument("--version", action="version", version=f"fused_ar {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    dtypes = _type("dtype", _list(_dtype))
    all_dtypes = [d.value for d in DType]

    p = sub.add_parser("source", help="print the rendered source of one kernel", formatter_class=fmt,
                       description="Print the self-contained source text one kernel compiles from.")
    p.add_argument("op", choices=[o.value for o in Op], help="the kernel")
    p.add_argument("--dtype", type=_type("dtype", _dtype), default=DType.BF16, help="element type: " + ", ".join(all_dtypes))
    p.add_argument("--arch", type=_type("arch", _list(_arch)), help="target arch, e.g. sm_90 or gfx942 (default: GPU 0's)")
    p.add_argument("--pack", type=_type("pack", _one_of(PACK_SIZES)), default=DEFAULT_PACK, help="bytes per thread access")
    p.add_argument("--ngpus", type=_type("ngpus", _one_of(SUPPORTED_NGPUS)), default=1, help="group size (1: add_rmsnorm)")
    p.add_argument("--block", type=_type("block", _one_of(ADD_RMSNORM_BLOCKS)), default=256,
                   help=f"threads per block: {', '.join(map(str, BLOCK_SIZES))} (add_rmsnorm also any multiple of 64 "
                   "up to 512)")
    p.set_defaults(func=cmd_source)

    p = sub.add_parser("warm", help="compile the kernel matrix ahead of time into the cache", formatter_class=fmt,
                       description="Compile every kernel of the matrix (ops x dtypes x group sizes x block sizes) "
                                   "for the given archs into the disk cache; no GPU needed.")
    p.add_argument("--arch", type=_type("arch", _list(_arch)),
                   help="comma-separated archs, e.g. sm_90,gfx942 (default: GPU 0's; required without a GPU)")
    p.add_argument("--dtype", type=dtypes, default=list(DType), help="comma-separated element types (default: all)")
    p.add_argument("--ngpus", type=_type("ngpus", _list(_one_of(SUPPORTED_NGPUS))), default=list(SUPPORTED_NGPUS),
                   help="comma-separated group sizes (1: the local add_rmsnorm)")
    p.add_argument("-j", "--jobs", type=_type("jobs", _jobs), default=None,
                   help="worker processes (default: all cores)")
    p.add_argument("--dry-run", action="store_true", help="list the kernels and whether each is cached")
    p.add_argument("--variants", action="store_true",
                   help="also the RMSNorm variants (fp32 or no weight, no residual, in place, unaligned rows), which "
                        "otherwise compile on first use")
    p.add_argument("--fp8", action="store_true",
                   help="also the FP8-output kernels (static, per-token and per-group scales; E4M3FN and E4M3FNUZ)")
    p.add_argument("--into", type=_type("into", _directory), default=None,
                   help="build a read-only cache layer in this directory (readable by every user; serve it with "
                        "FUSED_AR_CACHE_PATH) instead of filling the writable cache")
    p.set_defaults(func=cmd_warm)

    p = sub.add_parser("cache", help="inspect or maintain the kernel cache", formatter_class=fmt,
                       description="info: where the cache is and what it holds; verify: check every entry "
                                   "(exit 1 if any is bad); clear: remove every entry and build lock. With DIR: "
                                   "the read-only layer there, as its users read it.")
    p.add_argument("action", choices=["info", "clear", "verify"], help="what to do")
    p.add_argument("dir", nargs="?", type=_type("dir", _directory), default=None,
                   help="a cache layer made by `warm --into` (info and verify only)")
    p.set_defaults(func=cmd_cache)

    p = sub.add_parser("info", help="platform, devices, compilers, environment and cache", formatter_class=fmt,
                       description="Print this machine's torch build and GPUs, each compiler's identity (what the "
                                   "cache keys on), every environment variable fused_ar reads and whether its value "
                                   "is valid, and every directory fused_ar uses (cache, state, locks, layers) with "
                                   "its state. Exit 1 when a variable is invalid.")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("probe", help="check IPC peer access among GPUs for real (once per boot; remembered)",
                       formatter_class=fmt,
                       description="Export a buffer per GPU, let a child process load and store every one from "
                                   "every GPU through IPC with our kernel, and check the bytes. Exit 0: peer access "
                                   "works; 1: it does not. The verdict is remembered under the cache directory.")
    p.add_argument("gpus", nargs="*", help="GPU indices or cuda:N (default: 0)")
    p.set_defaults(func=cmd_probe)

    p = sub.add_parser("demo", help="run the fused op on the GPUs here (one GPU: N ranks emulated), checked and timed",
                       formatter_class=fmt,
                       description="Run the fused all-reduce + residual add + RMSNorm over every group size and m "
                                   "given, check each result against the torch reference and print a latency "
                                   "table. With fewer GPUs than a group, its ranks run in one process on GPU 0.")
    p.add_argument("--tp", type=_type("tp", _list(_one_of(CROSS_GPU_NGPUS))), default=[2, 4, 8],
                   help="group sizes to emulate on one GPU")
    p.add_argument("--m", type=_type("m", _sizes), default=[1, 16, 128, 1024], help="rows (tokens)")
    p.add_argument("--n", type=_type("n", _at_least_one), default=8192, help="hidden size")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("bench", help="benchmarks on the GPU: the fused all-reduce suite, the local add_rmsnorm, "
                                     "or the host cost of eager calls", formatter_class=fmt,
                       description="Time fused_ar against its baselines on the GPUs here, each result checked "
                                   "first, by the field's method (CUDA-graph replays, minimum per rank, maximum "
                                   "across ranks): the all-reduce suite (one process per GPU, or N ranks emulated "
                                   "on one), the local add_rmsnorm, the host cost of eager calls, or quantized output.")
    p.add_argument("what", nargs="?", choices=["allreduce_rmsnorm", "add_rmsnorm", "host", "fp8", "startup"],
                   default="allreduce_rmsnorm",
                   help="which suite (host: CPU us per eager call, at the first --m (default 8), --hidden "
                        "(default 8192), --tp and --dtype; fp8: the fused FP8, UE8M0, NVFP4 and MXFP4 outputs against "
                        "torch's quantization after ours and the bf16 output, at --tp, --m (default 1,16,128,1024), --hidden (default 4096,8192); startup: "
                        "first calls in fresh processes against torch's, --replays processes each (at most 9))")
    p.add_argument("--tp", type=_type("tp", _list(_one_of(CROSS_GPU_NGPUS))), default=[2, 4, 8], help="group sizes")
    p.add_argument("--m", type=_type("m", _sizes), default=None,
                   help=f"rows: a list and/or ranges, e.g. 1,2,4 or 1..1024 (doubling) or 64..512:64 (default "
                        f"{','.join(map(str, BENCH_M))})")
    p.add_argument("--hidden", type=_type("hidden", _list(_at_least_one)), default=None,
                   help=f"hidden sizes (default {','.join(map(str, BENCH_HIDDEN))})")
    p.add_argument("--dtype", type=dtypes, default=[DType.BF16], help="element types")
    p.add_argument("--paths", type=_type("paths", _paths), default=None, help="comma-separated paths (default: all)")
    p.add_argument("--graph-calls", type=_type("graph-calls", _at_least_one), default=2000, help="op calls captured per graph")
    p.add_argument("--replays", type=_type("replays", _at_least_one), default=80, help="timed replays per path and shape")
    p.add_argument("--out", default=None, help="output directory (default ./fused_ar_bench)")
    p.add_argument("--write-thresholds", action="store_true",
                   help="store the measured crossovers in the cache directory for the communicator's auto path")
    p.add_argument("--one-process", action="store_true", help="emulate every TP on GPU 0 even with several GPUs")
    p.add_argument("--sweep-blocks", action="store_true", help="add_rmsnorm: also time every block size")
    p.add_argument("--variants", action="store_true",
                   help="add_rmsnorm: also time strided rows, an fp32 weight and in place against contiguous")
    p.add_argument("--fp8", action="store_true",
                   help="add_rmsnorm: also FP8 output (static, per-row and per-group scales) against the peers")
    from .bench.peers import PEER_KINDS  # a small module (no torch): the help lists the peers from their table

    p.add_argument("--peers", type=_type("peers", _peers), default=None,
                   help=f"add_rmsnorm: the peers timed beside ours, comma-separated from {', '.join(PEER_KINDS)}; "
                        "all (default) or none")
    p.add_argument("--profile", action="store_true", help="host: add cProfile's top functions of the fused calls")
    p.set_defaults(func=cmd_bench)
    return parser


_PACKAGE_DIR = str(Path(__file__).resolve().parent)
_CACHE_VAR = "FUSED_AR_CACHE_DIR"


def _one_line_warning(message: Any, category: Any, filename: str, lineno: int, file: Any = None,
                      line: Optional[str] = None) -> None:
    """fused_ar's own warnings in one labelled line; other libraries' as Python shows them, unlabelled."""
    if str(Path(filename).resolve()).startswith(_PACKAGE_DIR) or str(message).startswith("fused_ar"):
        print(f"fused_ar: warning: {str(message).removeprefix('fused_ar: ')}", file=sys.stderr)
    else:
        (file or sys.stderr).write(warnings.formatwarning(message, category, filename, lineno, line))


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    warnings.showwarning = _one_line_warning
    args = build_parser().parse_args(argv)
    args.argv = argv[argv.index(args.command) + 1:] if args.command in argv else []
    if args.command != "info":
        bad = [problem for _, _, problem in check_environment() if problem]
        if bad:
            fail(bad[0] + (f" (and {len(bad) - 1} more: see `python -m fused_ar info`)" if len(bad) > 1 else ""))
    try:
        return args.func(args)
    except FusedArError as exc:
        print(f"fused_ar: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"fused_ar: {args.command} interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED

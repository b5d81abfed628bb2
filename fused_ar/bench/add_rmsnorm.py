"""`python -m fused_ar bench add_rmsnorm`: the local kernel against every peer importable here (bench/peers.py:
FlashInfer, Liger, torch.compile, torch eager), in T and with `--fp8` FP8 output, in the same run.

Method (docs/design.md section 7): the floor first (bytes over the device copy bandwidth, measured here),
then each kernel, in place as the engines call them, captured K times into one CUDA graph; the replays of
all kernels of a shape taken in turn, timed with events, median per call; fresh random inputs; each
kernel's first call checked against a float64 reference (its max error is a column). Also the compile cost
(cold / cached).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from .peers import NVFP4_GLOBAL_SCALE, PEER_KINDS, Peer, fp8_peers, selected, t_peers
from .results import publish

CALLS_PER_GRAPH = 20
REPLAYS = 25


def _graph(torch: Any, fn: Callable[[], Any]) -> Any:
    """A CUDA graph of CALLS_PER_GRAPH calls of `fn` (warmed up on a side stream first), replayed once."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS_PER_GRAPH):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def _replay_us(torch: Any, graph: Any) -> float:
    """One replay's device time, per call."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    graph.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3 / CALLS_PER_GRAPH


def _graph_time_us(torch: Any, fn: Callable[[], Any]) -> float:
    """Median per-call device time of `fn` over REPLAYS replays of a graph of CALLS_PER_GRAPH calls."""
    graph = _graph(torch, fn)
    return statistics.median(_replay_us(torch, graph) for _ in range(REPLAYS))


def _interleaved_us(torch: Any, fns: dict[str, Callable[[], Any]]) -> dict[str, float]:
    """Median per-call time of each of `fns`, their replays taken in turn: a ratio between two of them is not
    skewed by the clock or cache state of the moment each would otherwise have been timed alone."""
    graphs = {name: _graph(torch, fn) for name, fn in fns.items()}
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(REPLAYS):
        for name, graph in graphs.items():
            times[name].append(_replay_us(torch, graph))
    return {name: statistics.median(t) for name, t in times.items()}


def _compile_cost(dtype: Any) -> dict[str, float]:
    """Seconds from nothing to a launchable function: cold (empty cache dir) and from the disk cache."""
    from ..jit.cache import KernelCache, default_cache
    from ..jit.kernels import add_rmsnorm_kernel
    from ..device.launch import spec_for
    from ..backends import compiler_for, current_runtime
    from ..jit.spec import DType, Op

    block, short_rows = add_rmsnorm_kernel(512)
    spec = spec_for(Op.ADD_RMSNORM, DType.parse(dtype), 0, block, short_rows=short_rows)
    base = default_cache()
    with tempfile.TemporaryDirectory() as tmp:
        cold = KernelCache(Path(tmp), base.lock_root, base.lock_timeout_s)
        t0 = time.perf_counter()
        lookup = cold.get(spec, compiler_for(spec.arch))
        current_runtime().load(lookup.kernel, spec.kernel_name, 0)
        cold_s = time.perf_counter() - t0
        warm_times = []
        for _ in range(5):
            fresh = KernelCache(Path(tmp), base.lock_root, base.lock_timeout_s)  # no in-memory copy
            t0 = time.perf_counter()
            lookup = fresh.get(spec, compiler_for(spec.arch))
            current_runtime().load(lookup.kernel, spec.kernel_name, 0)
            warm_times.append(time.perf_counter() - t0)
            assert lookup.status == "cached"
    return {"cold_s": cold_s, "cached_s": statistics.median(warm_times)}


def _block_sweep(torch: Any, dtype: Any, eps: float, hidden: list[int]) -> list[tuple[int, int, int, float]]:
    """Every power-of-two block, and the one the policy picks, at a few m: the data behind the policy in
    kernels.add_rmsnorm_block."""
    from ..jit.kernels import add_rmsnorm_block, add_rmsnorm_short_rows
    from ..device.launch import launch, named_args, spec_for
    from ..device.ops import MAX_GRID_BLOCKS
    from ..jit.spec import BLOCK_SIZES, DType, Op

    results = []
    for n in hidden:
        for m in (1, 64, 1024, 4096, 16384):
            x, r = (torch.randn(m, n, device="cuda", dtype=dtype) for _ in range(2))
            w = torch.randn(n, device="cuda", dtype=dtype)
            out, ro = torch.empty_like(x), torch.empty_like(x)
            packs = n * x.element_size() // 16
            for block in sorted(set(BLOCK_SIZES) | {add_rmsnorm_block(packs)}):
                short = add_rmsnorm_short_rows(packs, block)
                spec = spec_for(Op.ADD_RMSNORM, DType.parse(dtype), 0, block, short_rows=short)
                # the quantizing parameters (scales and their layout) stay 0: T output
                args = named_args(spec, out=out.data_ptr(), residual_out=ro.data_ptr(), x=x.data_ptr(),
                                  residual=r.data_ptr(), weight=w.data_ptr(), rows=m, cols=n, eps=eps,
                                  weight_offset=0.0, x_stride=n, residual_stride=n, out_stride=n,
                                  residual_out_stride=n)
                out.fill_(float("nan"))
                launch(spec, 0, min(m, MAX_GRID_BLOCKS), args)
                assert not torch.isnan(out).any(), f"block {block} left outputs unwritten"
                t = _graph_time_us(torch, lambda: launch(spec, 0, min(m, MAX_GRID_BLOCKS), args))
                results.append((m, n, block, t))
                print(f"sweep m={m:6d} n={n:5d} block {block:5d}: {t:8.2f} us", flush=True)
    return results


def sweep_table(sweep: list[tuple[int, int, int, float]], itemsize: int) -> list[str]:
    """The block sweep's (m, n, block, us) as a table, the policy's block marked; a block between the powers of
    two is swept only where the policy picks it, so its other cells stay empty."""
    from ..jit.kernels import add_rmsnorm_block

    blocks = sorted({b for _, _, b, _ in sweep})
    lines = ["Block-size sweep (us per call; the policy `kernels.add_rmsnorm_block` picks *):", "",
             "| m | n | " + " | ".join(f"block {b}" for b in blocks) + " |",
             "| ---: | ---: | " + " | ".join("---:" for _ in blocks) + " |"]
    for m, n in sorted({(m, n) for m, n, _, _ in sweep}, key=lambda t: (t[1], t[0])):
        cells = {b: t for mm, nn, b, t in sweep if (mm, nn) == (m, n)}
        picked = add_rmsnorm_block(n * itemsize // 16)
        lines.append(f"| {m} | {n} | " + " | ".join(
            "" if b not in cells else f"{cells[b]:.2f}{'*' if b == picked else ''}" for b in blocks) + " |")
    return lines


# Each variant against the contiguous call of the same shape and dtype: (name, x and residual are views of rows
# 2n wide, fp32 weight, out=x and residual_out=residual). The bar: at most VARIANT_BAR over contiguous at m >= 1024.
VARIANTS = (("strided", True, False, False), ("fp32 weight", False, True, False), ("in place", False, False, True),
            ("strided, fp32 weight, in place", True, True, True))
VARIANT_BAR = 1.03
VARIANT_MIN_M = 1024


def _variant_rows(torch: Any, dtype: Any, eps: float, hidden: list[int], ms: list[int]) -> list[dict[str, Any]]:
    """Per (m, n): the contiguous call's time and each variant's. Each variant computes on the same values (an
    fp32 copy of w is the same weight), so its first call must give the contiguous call's bits."""
    from ..device.ops import add_rmsnorm

    rows = []
    for n in hidden:
        for m in ms:
            wide = [torch.randn(m, 2 * n, device="cuda", dtype=dtype) for _ in range(2)]
            w = torch.randn(n, device="cuda", dtype=dtype)
            x, r = (t[:, :n].contiguous() for t in wide)
            out, ro = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
            calls = {"contiguous": lambda: add_rmsnorm(x, r, w, eps, out=out, residual_out=ro)}
            calls["contiguous"]()
            for name, strided, fp32_weight, in_place in VARIANTS:
                xs, rs = (t.clone()[:, :n] for t in wide) if strided else (x.clone(), r.clone())
                weight = w.float() if fp32_weight else w
                o, q = (xs, rs) if in_place else (torch.full_like(out, float("nan")), torch.full_like(ro, float("nan")))

                def call(xs=xs, rs=rs, weight=weight, o=o, q=q):
                    add_rmsnorm(xs, rs, weight, eps, out=o, residual_out=q)

                call()
                if not (torch.equal(q, ro) and torch.equal(o, out)):
                    raise AssertionError(f"{name}: outputs differ from the contiguous call's at m={m} n={n}")
                calls[name] = call  # in place, later calls run on their own outputs: the same work on other values
            row = {"m": m, "n": n, **{f"{name}_us": t for name, t in _interleaved_us(torch, calls).items()}}
            rows.append(row)
            print(f"variants m={m:6d} n={n:5d} contiguous {row['contiguous_us']:8.2f} us  " + "  ".join(
                f"{name} {row[name + '_us'] / row['contiguous_us']:.3f}x" for name, *_ in VARIANTS), flush=True)
    return rows


@contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def _ours(torch: Any, fp8: Optional[tuple]) -> list[Peer]:
    """Our kernel in place, as the peers run (and with PDL forced off where the device has it)."""
    from .. import env
    from ..backends import current_runtime
    from ..device.launch import arch_of
    from ..device.ops import add_rmsnorm, add_rmsnorm_fp4, add_rmsnorm_fp8

    if fp8 is None:
        def run(x: Any, r: Any, w: Any, eps: float) -> tuple:
            return add_rmsnorm(x, r, w, eps, out=x, residual_out=r)
    else:
        mode, group, scale, dtype, _ = fp8
        made: dict = {}

        def run(x: Any, r: Any, w: Any, eps: float) -> tuple:
            if mode in ("nvfp4", "mxfp4"):
                kind = {"fp4_format": mode, "global_scale": scale if mode == "nvfp4" else None}
                if x.shape not in made:  # outputs made once, as a server's graphs have them
                    made[x.shape] = add_rmsnorm_fp4(x.clone(), r.clone(), w, eps, **kind)
                q, _, scales = made[x.shape]
                return add_rmsnorm_fp4(x, r, w, eps, out=q, residual_out=r, scales_out=scales, **kind)
            kind = {"scale": scale if mode == "static" else None, "group_size": group, "fp8_dtype": dtype,
                    "scales_format": "ue8m0_packed" if mode == "group_ue8m0" else "fp32"}
            if x.shape not in made:
                made[x.shape] = add_rmsnorm_fp8(x.clone(), r.clone(), w, eps, **kind)
            q, _, scales = made[x.shape]
            return add_rmsnorm_fp8(x, r, w, eps, out=q, residual_out=r, scales_out=None if mode == "static" else scales,
                                   **kind)
    ours = [Peer(OURS, lambda: run)]
    if current_runtime().supports_pdl(arch_of(torch.cuda.current_device())):
        def no_pdl(x: Any, r: Any, w: Any, eps: float) -> tuple:
            with _env(env.PDL.name, "0"):  # part of the plan key: this call's plan launches without PDL
                return run(x, r, w, eps)
        ours.append(Peer(f"{OURS}, PDL off", lambda: no_pdl))
    return ours


OURS = "fused_ar"


def _reference(torch: Any, x: Any, r: Any, w: Any, eps: float) -> Any:
    """The float64 add + RMSNorm of the inputs (no rounding between the add and the norm)."""
    s = x.double() + r.double()
    return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * w.double()


def _peer_rows(torch: Any, m: int, n: int, dtype: Any, eps: float, entries: list[Peer], nbytes: int,
               fp8: Optional[tuple]) -> list[dict[str, Any]]:
    """Per entry at (m, n): time (interleaved replays), effective bandwidth and max error against float64 (FP8:
    of q times its scale); an entry that is missing or fails is a row that says why."""
    x0, r0 = (torch.randn(m, n, device="cuda", dtype=dtype) for _ in range(2))
    w = torch.rand(n, device="cuda", dtype=dtype) + 0.5
    ref = _reference(torch, x0, r0, w, eps)
    rows: dict[str, dict[str, Any]] = {}
    calls: dict[str, Callable[[], Any]] = {}
    for peer in entries:
        row = rows[peer.name] = {"m": m, "n": n, "impl": peer.name, "note": peer.missing or peer.note}
        if peer.make is None:
            continue
        try:
            run = peer.make()
            got = run(x0.clone(), r0.clone(), w, eps)
            torch.cuda.synchronize()
            if fp8 is None:
                row["max_err"] = (got[0].double() - ref).abs().max().item()
            else:
                row["max_err"] = (dequantize(torch, got[0], got[2], fp8) - ref).abs().max().item()
            xt, rt = x0.clone(), r0.clone()
            calls[peer.name] = lambda run=run, xt=xt, rt=rt: run(xt, rt, w, eps)
        except Exception as e:  # a peer's failure is its row's, not the run's
            row["note"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    times = _interleaved_us(torch, calls)
    ours = times.get(OURS)
    for name, t in times.items():
        rows[name].update(us=t, TBps=nbytes / (t * 1e-6) / 1e12, vs_ours=t / ours if ours else None)
    return list(rows.values())


def dequantize(torch: Any, q: Any, scales: Any, fp8: tuple) -> Any:
    """q times its scales, float64, for the max error of a quantized output (`fp8`: the mode's tuple)."""
    from ..reference import e2m1_values, unpack_fp4

    mode, group, scale = fp8[:3]
    n = q.shape[-1] * (2 if mode in ("nvfp4", "mxfp4") else 1)
    if mode in ("group_ue8m0", "mxfp4"):  # exponent bytes (packed four to an int32 for UE8M0)
        exps = scales.contiguous().view(torch.uint8)[..., :n // group].double()
        s = torch.pow(2.0, exps - 127)
    elif mode == "nvfp4":
        s = scales.double() / scale.double()
    else:
        s = scales.double()
    s = s.reshape(()) if s.numel() == 1 else s.repeat_interleave(n // s.shape[-1], dim=-1)
    values = e2m1_values(unpack_fp4(q)).double() if mode in ("nvfp4", "mxfp4") else q.double()
    return values * s


def _peer_table(rows: list[dict[str, Any]], copy_bw: float, floors: dict) -> list[str]:
    lines = ["| m x n | kernel | us | time / ours | TB/s | max error | note |",
             "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for (m, n), floor in floors.items():
        lines.append(f"| {m} x {n} | copy floor | {floor:.2f} | | {copy_bw / 1e12:.2f} | | bytes / copy bandwidth |")
        for r in (r for r in rows if (r["m"], r["n"]) == (m, n)):
            if "us" not in r:
                lines.append(f"| {m} x {n} | {r['impl']} | | | | | {r['note']} |")
                continue
            lines.append(f"| {m} x {n} | {r['impl']} | {r['us']:.2f} | {r['vs_ours']:.2f} | {r['TBps']:.2f} | "
                         f"{r['max_err']:.4g} | {r['note']} |")
    return lines


FP8_MODES = (("static", None), ("token", None), ("group", 128))
# With --fp8 also: power-of-two group scales packed as UE8M0, NVFP4 and MXFP4 (ours against torch's unfused
# pipeline: FlashInfer's FP4 quantization lives in another module than its norm).
LOW_BIT_MODES = (("group_ue8m0", 128), ("nvfp4", 16), ("mxfp4", 32))
MODE_TITLES = {"static": "FP8 output (float8_e4m3fn), static scales", "token": "FP8 output (float8_e4m3fn), token scales",
               "group": "FP8 output (float8_e4m3fn), group scales",
               "group_ue8m0": "FP8 output, per-128 power-of-two scales packed as UE8M0 bytes (int32)",
               "nvfp4": f"NVFP4 output (E2M1 two a byte, E4M3 scales per 16, row-major; global scale {NVFP4_GLOBAL_SCALE:g})",
               "mxfp4": "MXFP4 output (E2M1 two a byte, UE8M0 scales per 32)"}


def _out_bytes(mode: str, m: int, n: int, group: Optional[int]) -> int:
    """Bytes a quantized call writes beyond residual_out: the values and the scales."""
    if mode in ("nvfp4", "mxfp4"):
        return m * n // 2 + m * n // group
    if mode in ("static", "token"):
        scales = 0 if mode == "static" else 4 * m
    else:
        scales = 4 * m * (-(-(n // group) // 4) if mode == "group_ue8m0" else n // group)
    return m * n + scales


def report(args: argparse.Namespace, meta: dict[str, Any], rows: list[dict[str, Any]], floors: dict,
           fp8_rows: list[dict[str, Any]], fp8_floors: dict, sweep: list[tuple[int, int, int, float]],
           variants: list[dict[str, Any]], pending: int = 0) -> tuple[str, dict[str, Any]]:
    """(markdown, data) of a bench add_rmsnorm run; `meta`: gpu, torch, copy_bw (B/s), cost (compile_cost's) and
    peers. `pending`: shapes not timed yet, said at the top (a partial table, written as the run goes)."""
    peers, copy_bw, cost = meta["peers"], meta["copy_bw"], meta["cost"]
    lines = [f"# add_rmsnorm on {meta['gpu']}, {args.dtype.value}",
             "",
             f"Command: `python -m fused_ar bench add_rmsnorm --dtype {args.dtype.value} --hidden "
             f"{','.join(map(str, args.hidden))} --m {','.join(map(str, args.m))}"
             f"{' --fp8' if args.fp8 else ''}{' --sweep-blocks' if args.sweep_blocks else ''}"
             f"{' --variants' if args.variants else ''}"
             f"{'' if peers == tuple(PEER_KINDS) else ' --peers ' + (','.join(peers) or 'none')}`",
             f"torch {meta['torch']}; device copy bandwidth (read + write) {copy_bw / 1e9:.0f} GB/s; every "
             f"kernel in place, a graph of {CALLS_PER_GRAPH} calls each, the {REPLAYS} replays of a shape's kernels "
             "taken in turn, median per call. time / ours: over 1, ours is faster. Max error: of out against "
             "the float64 add + RMSNorm of the inputs.",
             f"Compile cost: cold {cost['cold_s'] * 1e3:.0f} ms, from the disk cache {cost['cached_s'] * 1e3:.2f} ms "
             "(render + key + read + verify + load, to a launchable function).",
             ""]
    if pending:
        lines += [f"Incomplete: {pending} more shapes (and any sweep or variants asked for) were still to be timed "
                  "when this was written; the run rewrites it after each shape and at its end.", ""]
    lines += [""] + _peer_table(rows, copy_bw, floors)
    for mode, _ in FP8_MODES + LOW_BIT_MODES if args.fp8 else ():
        mode_rows = [r for r in fp8_rows if r["mode"] == mode]
        if not mode_rows:
            continue
        lines += ["", f"{MODE_TITLES[mode]}; max error: of the values times their scales against the float64 "
                  "reference:", ""]
        lines += _peer_table(mode_rows, copy_bw, {(m, n): t for (md, m, n), t in fp8_floors.items() if md == mode})
    if sweep:
        lines += [""] + sweep_table(sweep, args.dtype.itemsize)
    if variants:
        names = [name for name, *_ in VARIANTS]
        lines += ["", f"Variants against the contiguous call (time ratio; the bar: at most {VARIANT_BAR:.2f} at "
                  f"m >= {VARIANT_MIN_M}; strided: x and residual are views of rows 2n wide):", "",
                  "| m | n | contiguous us | " + " | ".join(names) + " |",
                  "| ---: | ---: | ---: | " + " | ".join("---:" for _ in names) + " |"]
        for v in variants:
            lines.append(f"| {v['m']} | {v['n']} | {v['contiguous_us']:.2f} | " + " | ".join(
                f"{v[name + '_us'] / v['contiguous_us']:.3f}{'' if v[name + '_us'] <= VARIANT_BAR * v['contiguous_us'] else ' (over)'}"
                for name in names) + " |")
    data = {"gpu": meta["gpu"], "torch": meta["torch"], "copy_bw_Bps": copy_bw, "compile_cost": cost, "rows": rows,
            "fp8_rows": fp8_rows, "complete": not pending, "pending_shapes": pending,
            "block_sweep": [{"m": m, "n": n, "block": b, "us": t} for m, n, b, t in sweep], "variants": variants}
    return "\n".join(lines) + "\n", data


def bench_add_rmsnorm(args: argparse.Namespace) -> int:
    import torch

    from ..device.validate import require_gpu
    from .timing import copy_bandwidth

    require_gpu("python -m fused_ar bench add_rmsnorm")
    dtype = getattr(torch, args.dtype.torch_name)
    eps = 1e-6
    copy_bw = copy_bandwidth(torch.cuda.current_device())
    cost = _compile_cost(dtype)
    for knob in ("recompile_limit", "cache_size_limit"):  # one specialization per shape
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 1024)
    rows, fp8_rows, floors, fp8_floors = [], [], {}, {}
    size = args.dtype.itemsize
    peers = getattr(args, "peers", tuple(PEER_KINDS))
    modes = FP8_MODES + LOW_BIT_MODES if args.fp8 else ()
    shapes = len(args.hidden) * len(args.m) + sum(
        len(args.m) * sum(1 for n in args.hidden if group is None or n % group == 0) for _, group in modes)
    meta = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "copy_bw": copy_bw, "cost": cost,
            "peers": peers}

    def progress() -> None:
        """The table so far into --out after each shape: a run stopped by a time limit leaves what it timed."""
        if args.out:
            done = len(floors) + len(fp8_floors)
            text, data = report(args, meta, rows, floors, fp8_rows, fp8_floors, [], [], pending=shapes - done)
            publish(text, args.out, "add_rmsnorm", data, echo=False)

    entries = _ours(torch, None) + selected(t_peers(torch), peers)
    for n in args.hidden:
        for m in args.m:
            nbytes = (4 * m * n + n) * size  # x, residual read; out, residual_out written; the weight
            floors[(m, n)] = nbytes / copy_bw * 1e6
            got = _peer_rows(torch, m, n, dtype, eps, entries, nbytes, None)
            rows += got
            print(f"m={m:6d} n={n:5d} " + "  ".join(f"{r['impl']} {r['us']:.2f}" for r in got if "us" in r), flush=True)
            progress()
    if args.fp8:
        fmt, big = torch.float8_e4m3fn, 448.0
        for mode, group in modes:
            scale = torch.tensor([NVFP4_GLOBAL_SCALE if mode == "nvfp4" else 0.05], device="cuda")
            fp8 = (mode, group, scale, fmt, big)
            entries = _ours(torch, fp8) + selected(fp8_peers(torch, mode, group, scale, fmt, big), peers)
            for n in (n for n in args.hidden if group is None or n % group == 0):
                for m in args.m:
                    nbytes = (3 * m * n + n) * size + _out_bytes(mode, m, n, group)
                    fp8_floors[(mode, m, n)] = nbytes / copy_bw * 1e6
                    got = _peer_rows(torch, m, n, dtype, eps, entries, nbytes, fp8)
                    fp8_rows += [{**r, "mode": mode} for r in got]
                    print(f"fp8 {mode} m={m:6d} n={n:5d} " + "  ".join(
                        f"{r['impl']} {r['us']:.2f}" for r in got if "us" in r), flush=True)
                    progress()

    sweep = _block_sweep(torch, dtype, eps, args.hidden) if args.sweep_blocks else []
    variant_ms = [m for m in args.m if m >= VARIANT_MIN_M] or [VARIANT_MIN_M]
    variants = _variant_rows(torch, dtype, eps, args.hidden, variant_ms) if args.variants else []
    text, data = report(args, meta, rows, floors, fp8_rows, fp8_floors, sweep, variants)
    publish(text, args.out, "add_rmsnorm", data)
    return 0

"""`python -m fused_ar bench add_rmsnorm`: the local kernel against torch eager and torch.compile.

Method (docs/design.md section 7): the floor first (device copy bandwidth, measured here),
then each variant captured K times into one CUDA graph, replays timed with events, median per call;
fresh random inputs, outputs poisoned and checked before timing. Also the compile cost (cold / cached).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

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
    """Every block size at a few m: the data behind the policy in kernels.add_rmsnorm_block."""
    from ..jit.kernels import add_rmsnorm_short_rows, kernel_def
    from ..device.launch import launch, spec_for
    from ..device.ops import MAX_GRID_BLOCKS
    from ..jit.spec import BLOCK_SIZES, DType, Op

    results = []
    for n in hidden:
        for m in (1, 64, 1024, 4096, 16384):
            x, r = (torch.randn(m, n, device="cuda", dtype=dtype) for _ in range(2))
            w = torch.randn(n, device="cuda", dtype=dtype)
            out, ro = torch.empty_like(x), torch.empty_like(x)
            for block in BLOCK_SIZES:
                short = add_rmsnorm_short_rows(n * x.element_size() // 16, block)
                spec = spec_for(Op.ADD_RMSNORM, DType.parse(dtype), 0, block, short_rows=short)
                values = {"out": out.data_ptr(), "residual_out": ro.data_ptr(), "x": x.data_ptr(),
                          "residual": r.data_ptr(), "weight": w.data_ptr(), "rows": m, "cols": n, "eps": eps,
                          "weight_offset": 0.0, "x_stride": n, "residual_stride": n, "out_stride": n,
                          "residual_out_stride": n, "scales": 0, "group": 0, "scales_stride": 0}
                args = tuple(values[name] for name, _ in kernel_def(Op.ADD_RMSNORM).params)
                out.fill_(float("nan"))
                launch(spec, 0, min(m, MAX_GRID_BLOCKS), args)
                assert not torch.isnan(out).any(), f"block {block} left outputs unwritten"
                t = _graph_time_us(torch, lambda: launch(spec, 0, min(m, MAX_GRID_BLOCKS), args))
                results.append((m, n, block, t))
                print(f"sweep m={m:6d} n={n:5d} block {block:5d}: {t:8.2f} us", flush=True)
    return results


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


def bench_add_rmsnorm(args: argparse.Namespace) -> int:
    import torch
    import torch.nn.functional as F

    from ..jit.kernels import add_rmsnorm_block
    from ..device.ops import add_rmsnorm
    from .timing import copy_bandwidth

    from ..device.validate import require_gpu

    require_gpu("python -m fused_ar bench add_rmsnorm")
    dtype = getattr(torch, args.dtype.torch_name)
    eps = 1e-6
    copy_bw = copy_bandwidth(torch.cuda.current_device())
    cost = _compile_cost(dtype)

    def unfused(x, r, w):
        ro = x + r
        return F.rms_norm(ro, (ro.shape[-1],), w, eps), ro

    # one specialization per shape, as a serving engine with captured graphs would have
    for knob in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 1024)
    compiled = torch.compile(unfused, dynamic=False)
    rows = []
    for n in args.hidden:
        for m in args.m:
            x, r = (torch.randn(m, n, device="cuda", dtype=dtype) for _ in range(2))
            w = torch.randn(n, device="cuda", dtype=dtype)
            out = torch.full_like(x, float("nan"))
            ro = torch.full_like(x, float("nan"))
            add_rmsnorm(x, r, w, eps, out=out, residual_out=ro)
            ref_out, ref_ro = unfused(x.float(), r.float(), w.float())
            assert torch.equal(ro, (x.float() + r.float()).to(dtype)), f"residual_out wrong at m={m} n={n}"
            assert not torch.isnan(out).any(), f"out not fully written at m={m} n={n}"
            ours = _graph_time_us(torch, lambda: add_rmsnorm(x, r, w, eps, out=out, residual_out=ro))
            eager = _graph_time_us(torch, lambda: unfused(x, r, w))
            comp = _graph_time_us(torch, lambda: compiled(x, r, w))
            nbytes = (4 * m * n + n) * x.element_size()
            bw = nbytes / (ours * 1e-6)
            rows.append({"m": m, "n": n, "ours_us": ours, "eager_us": eager, "compile_us": comp,
                         "ours_GBps": bw / 1e9, "pct_copy_bw": 100 * bw / copy_bw, "floor_us": nbytes / copy_bw * 1e6})
            print(f"m={m:6d} n={n:5d} ours {ours:8.2f} us  eager {eager:8.2f}  compile {comp:8.2f}  "
                  f"{bw / 1e9:7.0f} GB/s ({100 * bw / copy_bw:5.1f}% of copy)", flush=True)

    sweep = _block_sweep(torch, dtype, eps, args.hidden) if args.sweep_blocks else []
    variant_ms = [m for m in args.m if m >= VARIANT_MIN_M] or [VARIANT_MIN_M]
    variants = _variant_rows(torch, dtype, eps, args.hidden, variant_ms) if args.variants else []

    gpu = torch.cuda.get_device_name(0)
    lines = [f"# add_rmsnorm on {gpu}, {args.dtype.value}",
             "",
             f"Command: `python -m fused_ar bench add_rmsnorm --dtype {args.dtype.value} --hidden "
             f"{','.join(map(str, args.hidden))} --m {','.join(map(str, args.m))}"
             f"{' --sweep-blocks' if args.sweep_blocks else ''}{' --variants' if args.variants else ''}`",
             f"torch {torch.__version__}; device copy bandwidth (read + write) {copy_bw / 1e9:.0f} GB/s; "
             f"graph of {CALLS_PER_GRAPH} calls, median of {REPLAYS} replays, per call.",
             f"Compile cost: cold {cost['cold_s'] * 1e3:.0f} ms, from the disk cache {cost['cached_s'] * 1e3:.2f} ms "
             "(render + key + read + verify + load, to a launchable function).",
             "",
             "| m | n | floor us | ours us | eager us | compile us | ours GB/s | % copy BW | vs eager | vs compile |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['m']} | {r['n']} | {r['floor_us']:.2f} | {r['ours_us']:.2f} | {r['eager_us']:.2f} | "
                     f"{r['compile_us']:.2f} | {r['ours_GBps']:.0f} | {r['pct_copy_bw']:.1f} | "
                     f"{r['eager_us'] / r['ours_us']:.2f}x | {r['compile_us'] / r['ours_us']:.2f}x |")
    if sweep:
        blocks = sorted({b for _, _, b, _ in sweep})
        lines += ["", "Block-size sweep (us per call; the policy `kernels.add_rmsnorm_block` picks *):", "",
                  "| m | n | " + " | ".join(f"block {b}" for b in blocks) + " |",
                  "| ---: | ---: | " + " | ".join("---:" for _ in blocks) + " |"]
        for m, n in sorted({(m, n) for m, n, _, _ in sweep}, key=lambda t: (t[1], t[0])):
            cells = {b: t for mm, nn, b, t in sweep if (mm, nn) == (m, n)}
            picked = add_rmsnorm_block(n * x.element_size() // 16)
            lines.append(f"| {m} | {n} | " + " | ".join(f"{cells[b]:.2f}{'*' if b == picked else ''}" for b in blocks)
                         + " |")
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
    publish("\n".join(lines) + "\n", args.out, "add_rmsnorm", {
        "gpu": gpu, "torch": torch.__version__, "copy_bw_Bps": copy_bw, "compile_cost": cost, "rows": rows,
        "block_sweep": [{"m": m, "n": n, "block": b, "us": t} for m, n, b, t in sweep], "variants": variants})
    return 0

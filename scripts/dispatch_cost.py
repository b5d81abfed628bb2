"""What torch's dispatcher itself costs a Python-implemented op, beside fused_ar's torch.ops wrappers and
their direct calls (CPU us per eager call, bf16 8 x 8192, median of 7 runs of 3000 calls), on a GPU:

    PYTHONPATH=. python3 scripts/dispatch_cost.py

Ops defined here with torch.library.Library as fused_ar's are: one returning its inputs (for the CUDA key,
and for the Autograd key, which skips autograd's fallback), one allocating two outputs with empty_like.
bench/results/host_h100.md holds a run.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable

import torch


def _median_us(fn: Callable[[], Any], n: int = 3000) -> float:
    for _ in range(300):
        fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return sorted(runs)[3]


def main() -> int:
    if not torch.cuda.is_available():
        sys.exit(f"dispatch_cost.py needs a GPU; torch {torch.__version__} sees none")
    import fused_ar.torch_ops  # noqa: F401  (defines torch.ops.fused_ar.*)
    from fused_ar.device.ops import add_rmsnorm

    def same(x, r, w, eps, off=0.0):
        return x, r

    def alloc(x, r, w, eps, off=0.0):
        return torch.empty_like(x), torch.empty_like(r)

    lib = torch.library.Library("dispatch_cost", "DEF")
    for name in ("f", "g", "h"):
        lib.define(f"{name}(Tensor x, Tensor? r, Tensor? w, float eps, float off=0.0) -> (Tensor, Tensor)")
    lib.impl("f", same, "CUDA")
    lib.impl("g", same, "Autograd")
    lib.impl("g", same, "CUDA")
    lib.impl("h", alloc, "CUDA")
    ops = torch.ops.dispatch_cost
    x = torch.randn(8, 8192, device="cuda", dtype=torch.bfloat16)
    r = torch.randn_like(x)
    w = torch.ones(8192, device="cuda", dtype=torch.bfloat16)
    out, ro = torch.empty_like(x), torch.empty_like(x)
    cases = {
        "python call": lambda: same(x, r, w, 1e-6),
        "torch.ops returning inputs (CUDA key)": lambda: ops.f(x, r, w, 1e-6),
        "torch.ops returning inputs (Autograd key)": lambda: ops.g(x, r, w, 1e-6),
        "python empty_like x2": lambda: alloc(x, r, w, 1e-6),
        "torch.ops empty_like x2": lambda: ops.h(x, r, w, 1e-6),
        "add_rmsnorm out=": lambda: add_rmsnorm(x, r, w, 1e-6, out=out, residual_out=ro),
        "add_rmsnorm allocating": lambda: add_rmsnorm(x, r, w, 1e-6),
        "torch.ops.fused_ar.add_rmsnorm": lambda: torch.ops.fused_ar.add_rmsnorm(x, r, w, 1e-6),
        "torch.ops.fused_ar.add_rmsnorm.default": lambda: torch.ops.fused_ar.add_rmsnorm.default(x, r, w, 1e-6),
        "torch.ops.fused_ar.add_rmsnorm_ (in place)": lambda: torch.ops.fused_ar.add_rmsnorm_(x, r, w, 1e-6),
        "add_rmsnorm in place direct": lambda: add_rmsnorm(x, r, w, 1e-6, out=x, residual_out=r),
        "torch add_": lambda: x.add_(0),
    }
    for name, fn in cases.items():
        print(f"{name:45s} {_median_us(fn):7.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())

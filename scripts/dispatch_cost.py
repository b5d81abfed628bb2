"""What torch's dispatcher itself costs a Python-implemented op, beside fused_ar's torch.ops wrappers and
their direct calls (CPU us per eager call, bf16 8 x 8192, median of 7 runs of 3000 calls), on a GPU:

    PYTHONPATH=. python3 scripts/dispatch_cost.py

Ops defined here with torch.library.Library as fused_ar's are: one returning its inputs (for the CUDA key,
and for the Autograd key, which skips autograd's fallback), one allocating two outputs with empty_like.
bench/results/host_h100.md holds a run.
"""

import sys
import time

import torch

import fused_ar.torch_ops  # noqa: F401  (defines torch.ops.fused_ar.*)

if not torch.cuda.is_available():
    sys.exit(f"dispatch_cost.py needs a GPU; torch {torch.__version__} sees none")
from fused_ar.device.ops import add_rmsnorm
lib = torch.library.Library("dispatch_cost", "DEF")
lib.define("f(Tensor x, Tensor? r, Tensor? w, float eps, float off=0.0) -> (Tensor, Tensor)")
lib.define("g(Tensor x, Tensor? r, Tensor? w, float eps, float off=0.0) -> (Tensor, Tensor)")
lib.define("h(Tensor x, Tensor? r, Tensor? w, float eps, float off=0.0) -> (Tensor, Tensor)")
def impl(x, r, w, eps, off=0.0):
    return x, r
def alloc(x, r, w, eps, off=0.0):
    return torch.empty_like(x), torch.empty_like(r)
lib.impl("f", impl, "CUDA")
lib.impl("g", impl, "Autograd"); lib.impl("g", impl, "CUDA")
lib.impl("h", alloc, "CUDA")
x = torch.randn(8, 8192, device="cuda", dtype=torch.bfloat16); r = torch.randn_like(x); w = torch.ones(8192, device="cuda", dtype=torch.bfloat16)
def t(fn, n=3000):
    for _ in range(300): fn()
    torch.cuda.synchronize()
    res = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(n): fn()
        res.append((time.perf_counter()-t0)/n*1e6)
        torch.cuda.synchronize()
    res.sort(); return res[3]
f, g, h = torch.ops.dispatch_cost.f, torch.ops.dispatch_cost.g, torch.ops.dispatch_cost.h
out, ro = torch.empty_like(x), torch.empty_like(x)
for name, fn in [("python call", lambda: impl(x, r, w, 1e-6)),
                 ("torch.ops returning inputs (CUDA key)", lambda: f(x, r, w, 1e-6)),
                 ("torch.ops returning inputs (Autograd key)", lambda: g(x, r, w, 1e-6)),
                 ("python empty_like x2", lambda: alloc(x, r, w, 1e-6)),
                 ("torch.ops empty_like x2", lambda: h(x, r, w, 1e-6)),
                 ("add_rmsnorm out=", lambda: add_rmsnorm(x, r, w, 1e-6, out=out, residual_out=ro)),
                 ("add_rmsnorm allocating", lambda: add_rmsnorm(x, r, w, 1e-6)),
                 ("torch.ops.fused_ar.add_rmsnorm", lambda: torch.ops.fused_ar.add_rmsnorm(x, r, w, 1e-6)),
                 ("torch.ops.fused_ar.add_rmsnorm.default", lambda: torch.ops.fused_ar.add_rmsnorm.default(x, r, w, 1e-6)),
                 ("torch.ops.fused_ar.add_rmsnorm_ (in place)", lambda: torch.ops.fused_ar.add_rmsnorm_(x, r, w, 1e-6)),
                 ("add_rmsnorm in place direct", lambda: add_rmsnorm(x, r, w, 1e-6, out=x, residual_out=r)),
                 ("torch add_", lambda: x.add_(0))]:
    print(f"{name:45s} {t(fn):7.2f} us")

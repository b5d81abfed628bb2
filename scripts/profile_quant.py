"""Each add_rmsnorm output kind (bf16, FP8 static and per group, NVFP4, MXFP4; FlashInfer's static FP8 and
bf16 kernels and Liger's bf16 kernel where importable) called three times on m x n bf16 rows, for a profiler
to read:

    ncu --clock-control none --section InstructionStats --section WarpStateStats python3 scripts/profile_quant.py 1

(bench/results/quant_h100/profile_m1.md). Takes m (default 1) and n (default 8192); a third argument, a
comma-separated list of kinds, runs only those.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import torch

import fused_ar


def calls(m: int, n: int = 8192) -> dict[str, Callable[[], Any]]:
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    r = torch.randn_like(x)
    w = torch.rand(n, device="cuda", dtype=torch.bfloat16) + 0.5
    global_scale, static = torch.tensor([20.0], device="cuda"), torch.tensor([0.05], device="cuda")
    kinds: dict[str, Callable[[], Any]] = {
        "bf16": lambda: fused_ar.add_rmsnorm(x, r, w, 1e-6),
        "static": lambda: fused_ar.add_rmsnorm_fp8(x, r, w, 1e-6, scale=static),
        "group": lambda: fused_ar.add_rmsnorm_fp8(x, r, w, 1e-6, group_size=128),
        "nvfp4": lambda: fused_ar.add_rmsnorm_fp4(x, r, w, 1e-6, fp4_format="nvfp4", global_scale=global_scale),
        "mxfp4": lambda: fused_ar.add_rmsnorm_fp4(x, r, w, 1e-6, fp4_format="mxfp4"),
    }
    try:
        import flashinfer.norm as fi
    except ImportError as e:  # a peer is optional
        print("FlashInfer not installed:", e)
        return kinds
    q = torch.empty(m, n, device="cuda", dtype=torch.float8_e4m3fn)
    kinds["flashinfer static"] = lambda: fi.fused_add_rmsnorm_quant(q, x, r, w, static, 1e-6, enable_pdl=False)
    kinds["flashinfer bf16"] = lambda: fi.fused_add_rmsnorm(x, r, w, 1e-6, enable_pdl=False)
    try:
        from liger_kernel.ops.fused_add_rms_norm import fused_add_rms_norm_forward
    except ImportError as e:
        print("Liger not installed:", e)
        return kinds
    kinds["liger bf16"] = lambda: fused_add_rms_norm_forward(x, r, w, 1e-6, 0.0, "llama")
    return kinds


def main() -> None:
    m = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
    only = set(sys.argv[3].split(",")) if len(sys.argv) > 3 else None
    for name, call in calls(m, n).items():
        if only is not None and name not in only:
            continue
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        print("done", name, flush=True)


if __name__ == "__main__":
    main()

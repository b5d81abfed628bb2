"""Each add_rmsnorm output kind (bf16, FP8 static and per group, NVFP4, MXFP4; FlashInfer's static FP8,
per-group FP8 and bf16 kernels and Liger's bf16 kernel where importable) called three times on m x n bf16
rows, for a profiler to read:

    ncu --clock-control none --section InstructionStats --section WarpStateStats python3 scripts/profile_quant.py 1

(bench/results/quant_h100/profile_m1.md). Takes m (default 1) and n (default 8192); a third argument, a
comma-separated list of kinds (bf16, static, group, nvfp4, mxfp4, flashinfer static, flashinfer group,
flashinfer bf16, liger bf16), runs only those.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

import torch

import fused_ar
from fused_ar.bench.peers import NVFP4_GLOBAL_SCALE


def calls(m: int, n: int = 8192) -> dict[str, Callable[[], Any]]:
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    r = torch.randn_like(x)
    w = torch.rand(n, device="cuda", dtype=torch.bfloat16) + 0.5
    global_scale, static = torch.tensor([NVFP4_GLOBAL_SCALE], device="cuda"), torch.tensor([0.05], device="cuda")
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
    # its kernel covers a row with whole warps of 8-element packs (16 over 8192 columns) and refuses other n;
    # its scales are column-major, rows padded to 4 (the layout it writes)
    if n <= 16384 and n % (32 * (8 if n <= 8192 else 16)) == 0:
        block_scales = torch.empty(n // 128, -(-m // 4) * 4, device="cuda")
        normed = torch.empty_like(x)
        kinds["flashinfer group"] = lambda: fi.fused_add_rmsnorm_fp8_block_quant(q, block_scales, normed, x, r, w, 1e-6,
                                                                                enable_pdl=False)
    kinds["flashinfer bf16"] = lambda: fi.fused_add_rmsnorm(x, r, w, 1e-6, enable_pdl=False)
    try:
        from liger_kernel.ops.fused_add_rms_norm import fused_add_rms_norm_forward
    except ImportError as e:
        print("Liger not installed:", e)
        return kinds
    kinds["liger bf16"] = lambda: fused_add_rms_norm_forward(x, r, w, 1e-6, 0.0, "llama")
    return kinds


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a whole number >= 1")
    return int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("m", type=_positive, nargs="?", default=1)
    parser.add_argument("n", type=_positive, nargs="?", default=8192)
    parser.add_argument("kinds", nargs="?", default=None, help="comma-separated kinds to run (default: all)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit(f"profile_quant.py needs a GPU; torch {torch.__version__} sees none")
    kinds = calls(args.m, args.n)
    only = kinds.keys() if args.kinds is None else args.kinds.split(",")
    unknown = [k for k in only if k not in kinds]
    if unknown:
        sys.exit(f"profile_quant.py: unknown or unavailable kinds {unknown}; here: {', '.join(kinds)}")
    for name in only:
        call = kinds[name]
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        print("done", name, flush=True)


if __name__ == "__main__":
    main()

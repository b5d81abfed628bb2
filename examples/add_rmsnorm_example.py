"""A decoder layer's residual add + RMSNorm through fused_ar.add_rmsnorm, checked against torch.

Run on a machine with a GPU: `python examples/add_rmsnorm_example.py [--m 16] [--n 8192]`.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

import fused_ar


def _whole(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a whole number >= 1")
    return int(text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--m", type=_whole, default=16, help="tokens (rows), >= 1")
    p.add_argument("--n", type=_whole, default=8192, help="hidden size, >= 1")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = p.parse_args()  # checked before a GPU is looked for
    fused_ar.require_gpu("examples/add_rmsnorm_example.py")
    dtype = getattr(torch, args.dtype)

    x = torch.randn(args.m, args.n, device="cuda", dtype=dtype)  # e.g. the attention output
    residual = torch.randn_like(x)
    weight = torch.rand(args.n, device="cuda", dtype=dtype) + 0.5

    t0 = time.perf_counter()
    out, residual_out = fused_ar.add_rmsnorm(x, residual, weight, eps=1e-6)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0

    ref_ro = (x.float() + residual.float()).to(dtype)
    ref_out = F.rms_norm(ref_ro.float(), (args.n,), weight.float(), 1e-6).to(dtype)
    exact = torch.equal(residual_out, ref_ro)
    err = ((out.float() - ref_out.float()).norm() / ref_out.float().norm()).item()
    print(f"add_rmsnorm m={args.m} n={args.n} {args.dtype}: first call {first * 1e3:.1f} ms "
          f"(compile or cache load included); residual_out bit-exact: {exact}; out rel. error {err:.2e}")
    if not exact or err > 1e-2:
        raise SystemExit("mismatch against the torch reference")


if __name__ == "__main__":
    try:
        main()
    except fused_ar.FusedArError as exc:
        raise SystemExit(f"add_rmsnorm_example: {exc}") from None

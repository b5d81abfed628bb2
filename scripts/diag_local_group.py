"""Diagnosis of emulated-rank barrier timeouts: runs the communicator test's call sequence for one (N, n,
dtype, path) with per-call host timings, and on a timeout dumps every rank's signal buffer (which peer
arrived at which block with which flag, and the epochs), so a missing launch, a host call that blocked
while peers spun, or an epoch mismatch can be told apart.

    PYTHONPATH=. FUSED_AR_TIMEOUT_S=2 python3 scripts/diag_local_group.py --ranks 4 --n 512
"""

from __future__ import annotations

import argparse
import struct
import sys
import time

import torch

from fused_ar import Communicator
from fused_ar.kernels import MAX_BLOCKS, MAX_RANKS, SIGNAL_BYTES
from fused_ar.report import describe_error

MS = [1, 2, 3, 7, 16, 17, 31, 64, 127, 128, 1000, 4096]


def dump(comms, blocks: int) -> None:
    for c in comms:
        words = struct.unpack(f"<{SIGNAL_BYTES // 4}I", c._runtime.read_bytes(c._mem.signal, SIGNAL_BYTES, c.device))
        flags = words[: 3 * MAX_BLOCKS * MAX_RANKS]
        epoch = words[3 * MAX_BLOCKS * MAX_RANKS: 3 * MAX_BLOCKS * MAX_RANKS + MAX_BLOCKS]
        print(f"rank {c.rank}: error={describe_error(words[-1])} epoch[0:{blocks}]={list(epoch[:blocks])}")
        for phase in range(3):
            rows = [flags[(phase * MAX_BLOCKS + b) * MAX_RANKS:(phase * MAX_BLOCKS + b) * MAX_RANKS + len(comms)]
                    for b in range(blocks)]
            print(f"  phase {phase} arrived flags per block: {rows}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--path", default="1stage")
    ap.add_argument("--max-bytes", type=int, default=4096 * 16384 * 4)
    ap.add_argument("--plain", type=int, default=1, help="also run the plain all-reduce after each fused call")
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    a = ap.parse_args()
    dtype = getattr(torch, a.dtype)
    comms = Communicator.local_group(a.ranks, 0, max_bytes=a.max_bytes)
    streams = [torch.cuda.Stream() for _ in comms]
    for m in map(int, a.ms.split(",")):
        xs = [torch.randn(m, a.n, device="cuda", dtype=dtype) for _ in comms]
        res = torch.randn(m, a.n, device="cuda", dtype=dtype)
        w = torch.rand(a.n, device="cuda", dtype=dtype) + 0.5
        outs = [(torch.full_like(res, float("nan")), torch.full_like(res, float("nan"))) for _ in comms]
        ars = [torch.full_like(res, float("nan")) for _ in comms]
        torch.cuda.synchronize()
        for kind in ("fused", "plain")[: 1 + a.plain]:
            host = []
            for r, (c, s) in enumerate(zip(comms, streams)):
                s.wait_stream(torch.cuda.current_stream())
                t0 = time.perf_counter()
                with torch.cuda.stream(s):
                    if kind == "fused":
                        c.allreduce_rmsnorm(xs[r], res, w, path=a.path, out=outs[r][0], residual_out=outs[r][1])
                    else:
                        c.allreduce(xs[r], path=a.path, out=ars[r])
                host.append(round((time.perf_counter() - t0) * 1e6))
            t0 = time.perf_counter()
            torch.cuda.synchronize()
            wait = time.perf_counter() - t0
            codes = [c.error_code() for c in comms]
            print(f"m={m} {kind}: host us per rank {host}, sync {wait * 1e3:.1f} ms, errors "
                  f"{[describe_error(x) if x else 0 for x in codes]}", flush=True)
            if any(codes):
                dump(comms, min(m, MAX_BLOCKS))
                return 1
    print("all ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

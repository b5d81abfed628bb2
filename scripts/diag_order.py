"""Diagnosis: rank 0 enqueues two calls before rank 1 enqueues its first (a local group of 2). Dumps the
signal words and reports between the steps, for three second-call variants."""
import os
import struct
import time

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
import torch  # noqa: E402

from fused_ar import Communicator  # noqa: E402
from fused_ar.kernels import DESC_WORDS, MAX_BLOCKS, MAX_RANKS, SIGNAL_BYTES  # noqa: E402
from fused_ar.report import Report, describe_call  # noqa: E402


def dump(comms, label):
    print(f"--- {label}")
    for c in comms:
        raw = c._runtime.read_bytes(c._mem.signal, SIGNAL_BYTES, 0)
        w = struct.unpack(f"{SIGNAL_BYTES // 4}I", raw)
        F = lambda ph, b, r: w[(ph * MAX_BLOCKS + b) * MAX_RANKS + r]
        doff = 3 * MAX_BLOCKS * MAX_RANKS
        D = lambda b, r: tuple(w[doff + (b * MAX_RANKS + r) * DESC_WORDS + i] for i in range(DESC_WORDS))
        eoff = doff + MAX_BLOCKS * MAX_RANKS * DESC_WORDS
        rep = Report.read(c._mem.report_host)
        print(f"rank {c.rank}: start[b0]={[F(0,0,r) for r in range(2)]} end[b0]={[F(2,0,r) for r in range(2)]} "
              f"start[b1]={[F(0,1,r) for r in range(2)]} epoch={w[eoff:eoff+2]} error={w[eoff+MAX_BLOCKS]:#x} "
              f"desc[b0]={[describe_call(D(0,r)) for r in range(2)]} report={rep.error:#x} "
              f"mine={describe_call(rep.mine)} theirs={describe_call(rep.theirs)}")


for second in ("allreduce", "rmsnorm", "none"):
    print(f"===== second call on rank 0: {second}")
    comms = Communicator.local_group(2, 0, max_bytes=8 << 20)
    streams = [torch.cuda.Stream() for _ in comms]
    xs = [torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16) for _ in comms]
    res = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(4096, device="cuda", dtype=torch.bfloat16)
    outs = [(torch.empty_like(res), torch.empty_like(res), torch.empty_like(res)) for _ in comms]
    torch.cuda.synchronize()
    for r in (0, 1):
        with torch.cuda.stream(streams[r]):
            comms[r].allreduce_rmsnorm(xs[r], res, w, out=outs[r][0], residual_out=outs[r][1])
            time.sleep(0.2)
            dump(comms, f"rank {r} call 1 enqueued")
            try:
                if second == "allreduce":
                    comms[r].allreduce(xs[r], out=outs[r][2])
                elif second == "rmsnorm":
                    comms[r].allreduce_rmsnorm(xs[r], res, w, out=outs[r][0], residual_out=outs[r][1])
            except Exception as exc:
                print(f"rank {r} second call raised: {type(exc).__name__}: {exc}")
            time.sleep(0.2)
            dump(comms, f"rank {r} call 2 enqueued")
    torch.cuda.synchronize()
    dump(comms, "synchronized")
    for c in comms:
        c.close()

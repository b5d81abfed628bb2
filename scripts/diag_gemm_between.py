"""Diagnosis: in a local group of 4, k ranks' fused calls spin while another stream runs a GEMM (or an
elementwise op). Reports the host time of that launch and whether the kernel completes while they spin."""
import os
import time

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
import torch  # noqa: E402

from fused_ar import Communicator  # noqa: E402
from fused_ar.reference import prime_allocator  # noqa: E402

print("CUDA_MODULE_LOADING", os.environ.get("CUDA_MODULE_LOADING"), flush=True)
m, n, ffn_shard = int(os.environ.get("DIAG_M", 64)), 4096, 1024
prime_allocator(0)
w1 = torch.randn(n, ffn_shard, device="cuda", dtype=torch.bfloat16)
x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
ops = {"gemm": lambda: x @ w1, "relu": lambda: torch.relu(x), "gemm_fp32": lambda: x.float() @ w1.float()}
side = torch.cuda.Stream()
with torch.cuda.stream(side):
    for op in ops.values():
        op()
torch.cuda.synchronize()
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    x @ w1
    torch.cuda.synchronize()
print("gemm kernels:", sorted({e.key for e in prof.key_averages()}), flush=True)
for what in ("relu", "gemm", "gemm_fp32"):
    for k in (1, 2, 3):
        comms = Communicator.local_group(4, 0, max_bytes=m * n * 2)
        streams = [torch.cuda.Stream() for _ in comms]
        xs = [torch.randn(m, n, device="cuda", dtype=torch.bfloat16) for _ in comms]
        res = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        wn = torch.ones(n, device="cuda", dtype=torch.bfloat16)
        outs = [(torch.empty_like(res), torch.empty_like(res)) for _ in comms]
        torch.cuda.synchronize()
        for r in range(k):
            with torch.cuda.stream(streams[r]):
                comms[r].allreduce_rmsnorm(xs[r], res, wn, out=outs[r][0], residual_out=outs[r][1])
        time.sleep(0.05)
        t0 = time.perf_counter()
        with torch.cuda.stream(side):
            ops[what]()
            ev = torch.cuda.Event()
            ev.record()
        t_launch = time.perf_counter() - t0
        done_after = None
        while time.perf_counter() - t0 < 3:
            if ev.query():
                done_after = time.perf_counter() - t0
                break
            time.sleep(0.001)
        for r in range(k, 4):
            with torch.cuda.stream(streams[r]):
                comms[r].allreduce_rmsnorm(xs[r], res, wn, out=outs[r][0], residual_out=outs[r][1])
        torch.cuda.synchronize()
        errs = []
        for c in comms:
            try:
                c.check()
            except Exception as e:  # noqa: BLE001
                errs.append(type(e).__name__)
            c.close()
        print(f"{what} m={m} with {k} rank(s) spinning: launch {t_launch * 1e3:.2f} ms, completed "
              f"{'after %.2f ms' % (done_after * 1e3) if done_after is not None else 'NOT within 3 s'}; errors {errs}",
              flush=True)

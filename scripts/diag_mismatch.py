import os, torch
os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS","32")
from fused_ar import Communicator
from fused_ar.report import Report, describe_call
for trial in range(4):
    comms = Communicator.local_group(2, 0, max_bytes=8<<20)
    streams=[torch.cuda.Stream() for _ in comms]
    xs=[torch.randn(1,4096,device="cuda",dtype=torch.bfloat16) for _ in comms]
    res=torch.randn(1,4096,device="cuda",dtype=torch.bfloat16); w=torch.ones(4096,device="cuda",dtype=torch.bfloat16)
    outs=[(torch.empty_like(res),torch.empty_like(res),torch.empty_like(res)) for _ in comms]
    torch.cuda.synchronize()
    for r,(c,s) in enumerate(zip(comms,streams)):
        with torch.cuda.stream(s):
            c.allreduce_rmsnorm(xs[r],res,w,out=outs[r][0],residual_out=outs[r][1])
            if trial % 2 == 0: c.allreduce(xs[r], out=outs[r][2])
    torch.cuda.synchronize()
    for c in comms:
        rep=Report.read(c._mem.report_host)
        print(trial, c.rank, hex(rep.error), describe_call(rep.mine), describe_call(rep.theirs))
    for c in comms: c.close()

"""A toy tensor-parallel decoder step on N ranks: a column-parallel matmul, ReLU, a row-parallel matmul whose
partial sums the fused op all-reduces, adds to the residual and normalizes. Runs eager, graph-captured
(one CUDA graph per batch size, replayed with new inputs) and torch.compile'd (fullgraph, the op as
torch.ops.fused_ar.allreduce_rmsnorm, captured into a graph too), and checks every result against a
single-process reference (docs/design.md section 1: residual_out bit-exact, out within 1 ulp).

    python examples/tp_decode.py --tp 4                 # one process per GPU where there are 4 GPUs,
                                                        # else all ranks in this process on GPU 0
    torchrun --nproc-per-node 4 examples/tp_decode.py   # one process per GPU, launched by torchrun

ReLU keeps the partial sums identical in eager and compiled code (Inductor may fuse a smooth activation
with different rounding), so every mode can be checked bit for bit.

With all ranks in one process on one GPU, every rank's matmuls are enqueued before any rank's fused op
(each mode runs, captures or compiles the step as two parts: matmuls, then the fused op). A kernel
launched while some ranks' fused blocks already spin for the others may never get the SMs it needs (the
H200's cuBLAS GEMMs at m=64 launch clusters of 8 blocks, which no GPC can place beside the spinning
blocks), and the spinning ranks would wait for it until FUSED_AR_TIMEOUT_S. With one rank per GPU the
step is one function, one graph, one compiled graph.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")  # one hardware queue per emulated rank

import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import fused_ar  # noqa: E402
from fused_ar import Communicator  # noqa: E402
from fused_ar.reference import add_rmsnorm_reference, prime_allocator, ulp_distance  # noqa: E402

MODES = ("eager", "graph", "compiled")
EPS = 1e-6


def weights(tp: int, hidden: int, ffn: int, dtype: torch.dtype, device: str):
    g = torch.Generator(device=device).manual_seed(1234)
    w1 = torch.randn(hidden, ffn, device=device, dtype=dtype, generator=g) / hidden ** 0.5
    w2 = torch.randn(ffn, hidden, device=device, dtype=dtype, generator=g) / ffn ** 0.5
    norm = torch.rand(hidden, device=device, dtype=dtype, generator=g) + 0.5
    shard = ffn // tp  # rank r: columns of w1 and rows of w2 in [r * shard, (r + 1) * shard)
    return [(w1[:, r * shard:(r + 1) * shard].contiguous(), w2[r * shard:(r + 1) * shard].contiguous())
            for r in range(tp)], norm


def mlp(x, w1, w2):
    return torch.relu(x @ w1) @ w2


def fused(partial, residual, norm, comm: int):
    return torch.ops.fused_ar.allreduce_rmsnorm(partial, residual, norm, EPS, comm, "auto")


def layer(x, residual, w1, w2, norm, comm: int):
    return fused(mlp(x, w1, w2), residual, norm, comm)


def reference(x, residual, shards, norm):
    partials = [mlp(x, w1, w2) for w1, w2 in shards]
    _, ro, out = add_rmsnorm_reference(partials, residual, norm, EPS)
    return out, ro


def check(mode: str, m: int, got, want) -> None:
    (out, ro), (ref_out, ref_ro) = got, want
    if not torch.equal(ro, ref_ro):
        raise SystemExit(f"{mode} m={m}: residual_out differs from the reference in {(ro != ref_ro).sum().item()} "
                         "elements")
    worst = ulp_distance(out, ref_out).max().item()
    if worst > 1:
        raise SystemExit(f"{mode} m={m}: out is {worst} ulp from the reference")


class Ranks:
    """The ranks this process drives: all of them (one GPU, one stream each) or its own (one per GPU)."""

    def __init__(self, comms: list[Communicator]) -> None:
        self.comms = comms
        self.streams = [torch.cuda.Stream(device=c.device) for c in comms]

    def run(self, fn):
        """fn(i, comm) for every local rank, each on its stream, all enqueued before one synchronize."""
        results = []
        for i, (comm, stream) in enumerate(zip(self.comms, self.streams)):
            stream.wait_stream(torch.cuda.current_stream(comm.device))
            with torch.cuda.stream(stream):
                results.append(fn(i, comm))
        torch.cuda.synchronize()
        for comm in self.comms:
            comm.check()
        return results


def say(line: str) -> None:
    print("  " + line, flush=True)


def run(comms: list[Communicator], tp: int, ms: list[int], hidden: int, ffn: int, modes: list[str],
        report=say) -> None:
    """Every mode in `modes`, checked; `report` gets a line for each mode as it finishes."""
    device = f"cuda:{comms[0].device}"
    dtype = torch.bfloat16
    shards, norm = weights(tp, hidden, ffn, dtype, device)
    ranks = Ranks(comms)
    mine = [shards[c.rank] for c in comms]
    # Nothing between two ranks' launches may wait for the GPU (see Communicator.local_group): cached
    # allocator memory, and each stream's cuBLAS workspace made before the first fused call.
    prime_allocator(comms[0].device)
    for (w1, w2), stream in zip(mine, ranks.streams):
        with torch.cuda.stream(stream):
            torch.relu(torch.zeros(max(ms), hidden, device=device, dtype=dtype) @ w1) @ w2
    torch.cuda.synchronize()
    g = torch.Generator(device=device).manual_seed(99)

    def fresh(m):
        return (torch.randn(m, hidden, device=device, dtype=dtype, generator=g),
                torch.randn(m, hidden, device=device, dtype=dtype, generator=g))

    def parts(mode: str):
        """The step as functions (rank, comm, a, b) -> (a, b): (x, residual) in, (out, residual_out) out;
        all ranks finish part k before any starts part k + 1."""
        wrap = (lambda f: torch.compile(f, fullgraph=True, dynamic=False)) if mode == "compiled" else (lambda f: f)
        if len(comms) == 1:
            whole = wrap(layer)
            return [lambda i, c, x, residual: whole(x, residual, *mine[i], norm, c.handle)]
        matmuls, fused_op = wrap(mlp), wrap(fused)
        return [lambda i, c, x, residual: (matmuls(x, *mine[i]), residual),
                lambda i, c, partial, residual: fused_op(partial, residual, norm, c.handle)]

    def run_parts(steps, inputs):
        for step in steps:
            inputs = ranks.run(lambda i, c: step(i, c, *inputs[i]))
        return inputs

    if "eager" in modes:
        steps = parts("eager")
        for m in ms:
            x, residual = fresh(m)
            for result in run_parts(steps, [(x, residual)] * len(comms)):
                check("eager", m, result, reference(x, residual, shards, norm))
        report(f"eager: m={ms} checked on {len(comms)} local rank(s)")

    for mode in [mo for mo in ("graph", "compiled") if mo in modes]:
        steps = parts(mode)
        graphs = {}
        for m in ms:
            x, residual = fresh(m)
            run_parts(steps, [(x, residual)] * len(comms))  # warm: compile, load, plan
            static = [fresh(m) for _ in comms]
            outs, gs = [], []
            for i, (comm, stream) in enumerate(zip(comms, ranks.streams)):
                state, rank_graphs = static[i], []
                with comm.capture():  # one registration per rank, for all its graphs
                    for step in steps:
                        graph = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(graph, stream=stream):
                            state = step(i, comm, *state)
                        rank_graphs.append(graph)
                outs.append(state)
                gs.append(rank_graphs)
            graphs[m] = (static, outs, gs)
        for replay in range(3):  # every graph, new data each time, in capture order and back
            for m in (ms if replay % 2 == 0 else ms[::-1]):
                static, outs, gs = graphs[m]
                x, residual = fresh(m)
                for i in range(len(comms)):
                    static[i][0].copy_(x)
                    static[i][1].copy_(residual)
                    outs[i][0].fill_(float("nan"))
                torch.cuda.synchronize()
                for k in range(len(steps)):
                    ranks.run(lambda i, c: gs[i][k].replay())
                for i in range(len(comms)):
                    check(mode, m, outs[i], reference(x, residual, shards, norm))
        how = f" as {len(steps)} parts (matmuls, fused op)" if len(steps) > 1 else ""
        report(f"{mode}: {len(ms)} graphs (m={ms}) captured{how}, replayed 3 times with new inputs, checked")


def _whole(low: int, multiple: int = 1):
    """An argparse type: a whole number >= low, a multiple of `multiple`."""
    def parse(text: str) -> int:
        if not (text.isascii() and text.isdigit()) or int(text) < low or int(text) % multiple:
            rule = f"a whole number >= {low}" + (f", a multiple of {multiple}" if multiple > 1 else "")
            raise argparse.ArgumentTypeError(f"{text!r}: must be {rule}")
        return int(text)
    return parse


def _tp(text: str) -> int:
    if text not in ("2", "4", "6", "8"):
        raise argparse.ArgumentTypeError(f"{text!r}: must be 2, 4, 6 or 8 (the group sizes fused_ar serves)")
    return int(text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tp", type=_tp, default=os.environ.get("WORLD_SIZE", "2"), help="group size: 2, 4, 6 or 8")
    p.add_argument("--m", type=_whole(1), nargs="+", default=[1, 8, 64], help="tokens per step")
    p.add_argument("--hidden", type=_whole(8, 8), default=4096, help="hidden size (whole 16-byte bf16 packs)")
    p.add_argument("--ffn", type=_whole(8, 8), default=4096, help="FFN size, split over the ranks")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--one-process", action="store_true", help="all ranks in this process on GPU 0")
    a = p.parse_args(argv)  # every argument is checked here, before a GPU is looked for
    if a.ffn % a.tp:
        p.error(f"argument --ffn: {a.ffn}: must split evenly over --tp {a.tp} ranks")
    fused_ar.require_gpu("examples/tp_decode.py")
    torch._dynamo.config.cache_size_limit = max(64, 8 * a.tp)  # one compiled variant per (rank, m)
    max_bytes = max(a.m) * a.hidden * 2
    if "RANK" in os.environ or (not a.one_process and torch.cuda.device_count() >= a.tp):
        return _per_gpu(a, max_bytes)
    print(f"tp_decode: TP={a.tp}, all ranks in one process on GPU 0 (single-GPU emulation), bf16, "
          f"hidden={a.hidden}, ffn={a.ffn}", flush=True)
    comms = Communicator.local_group(a.tp, 0, max_bytes=max_bytes)
    try:
        run(comms, a.tp, a.m, a.hidden, a.ffn, a.modes)
    finally:
        torch.cuda.synchronize()
        for c in comms:
            c.close()
    print("tp_decode: all modes match the single-process reference")
    return 0


def _per_gpu(a, max_bytes: int) -> int:
    if "RANK" not in os.environ:  # spawn one process per GPU ourselves
        import torch.multiprocessing as mp

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29533"))
        mp.spawn(_spawned, args=(a,), nprocs=a.tp, join=True)
        return 0
    _worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), a, max_bytes)
    return 0


def _spawned(rank: int, a) -> None:
    _worker(rank, a.tp, a, max(a.m) * a.hidden * 2)


def _worker(rank: int, world: int, a, max_bytes: int) -> None:
    import torch.distributed as dist

    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        if rank == 0:
            print(f"tp_decode: TP={world}, one process per GPU, bf16, hidden={a.hidden}, ffn={a.ffn}", flush=True)
        with Communicator(max_bytes=max_bytes) as comm:
            run([comm], world, a.m, a.hidden, a.ffn, a.modes,
                report=say if rank == 0 else (lambda line: None))
        if rank == 0:
            print("tp_decode: all modes match the single-process reference")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except fused_ar.FusedArError as exc:
        sys.exit(f"tp_decode: {exc}")

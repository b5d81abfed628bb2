"""What each benchmark path runs (fused_ar.bench.paths names them): one `Step` per local rank, built over a
`Case` (one TP, hidden, dtype, m: fresh random inputs, the reference, preallocated outputs), and the
check of a step's outputs against docs/design.md section 1 before anything is timed.

Our paths must be bit-exact (residual_out) and within 1 ulp (out); the collective baselines sum in their
own order and are held to a sanity bound (every element written, finite, close to the reference).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..errors import FusedArError
from ..device.ops import add_rmsnorm
from ..reference import add_rmsnorm_reference, ulp_distance
from .group import Group
from .paths import BenchPath, Needs

# Collective baselines: |got - reference| within this fraction of the largest |reference| (their summation
# order and intermediate rounding are their own; this catches unwritten or garbage outputs).
BASELINE_TOLERANCE = 0.02


class BenchError(FusedArError):
    """A path produced wrong results: nothing of it is timed."""


@dataclass
class Step:
    run: Callable[[], tuple[Any, Any]]  # one op call on the current stream; returns (out, residual_out)
    reset: Callable[[], None] = lambda: None  # restores what an in-place call consumed
    repeatable: bool = True  # the same outputs after any number of calls (not in place)
    close: Callable[[], None] = lambda: None


class Case:
    """One measured shape on this process: every rank's input (the same seed on every process, so each
    can compute the reference), the shared residual and weight, and each local rank's outputs."""

    def __init__(self, group: Group, hidden: int, m: int, dtype: Any, eps: float, seed: int) -> None:
        import torch

        self.group, self.hidden, self.m, self.dtype, self.eps = group, hidden, m, dtype, eps
        device = f"cuda:{group.device}"
        g = torch.Generator(device=device).manual_seed(seed)
        xs = [torch.randn(m, hidden, device=device, dtype=dtype, generator=g) for _ in range(group.world)]
        self.residual = torch.randn(m, hidden, device=device, dtype=dtype, generator=g)
        self.weight = torch.rand(hidden, device=device, dtype=dtype, generator=g) + 0.5
        _, self.ref_ro, self.ref_out = add_rmsnorm_reference(xs, self.residual, self.weight, eps)
        self.xs = [xs[r] for r in group.local]
        self.outs = [torch.empty_like(self.residual) for _ in group.local]
        self.ros = [torch.empty_like(self.residual) for _ in group.local]

    @property
    def nbytes(self) -> int:
        return self.residual.numel() * self.residual.element_size()

    def poison(self) -> None:
        for t in self.outs + self.ros:
            t.fill_(float("nan"))


def unavailable(path: BenchPath, group: Group) -> Optional[str]:
    """Why `path` cannot run in this group at all, or None."""
    import torch

    if path.needs is Needs.IPC:
        return None
    if group.emulated:
        return ("a single-GPU emulation has no NCCL/RCCL group (they take one rank per GPU); runs with one "
                "process per GPU")
    if path.needs is Needs.SYMM_MEM:
        try:
            import torch.distributed._symmetric_memory  # noqa: F401
        except ImportError as exc:
            return f"torch symmetric memory is not importable: {exc}"
        if not hasattr(torch.ops.symm_mem, "one_shot_all_reduce_out"):
            return f"torch {torch.__version__} has no symm_mem.one_shot_all_reduce_out"
    if path.needs is Needs.FLASHINFER:
        if getattr(torch.version, "hip", None):
            return "FlashInfer's fused all-reduce is CUDA-only"
        try:
            import flashinfer.comm  # noqa: F401
        except Exception as exc:  # ImportError, or a broken install failing at import
            return f"flashinfer is not importable here ({type(exc).__name__}: {exc})"
    return None


def build(path: BenchPath, case: Case, i: int) -> Step:
    """Local rank i's step for `path` (the group's communicators are open)."""
    import torch

    comm, x, out, ro = case.group.comms[i], case.xs[i], case.outs[i], case.ros[i]
    residual, weight, eps = case.residual, case.weight, case.eps
    name = path.name
    if name.startswith("fused_") or name == "fallback":
        choice = {"fallback": "fallback", "fused_chunked": "auto"}.get(name, name.removeprefix("fused_"))
        return Step(lambda: comm.allreduce_rmsnorm(x, residual, weight, eps, path=choice, out=out, residual_out=ro))
    if name == "unfused_ours":
        ar = torch.empty_like(x)

        def unfused_ours():
            comm.allreduce(x, out=ar)
            return add_rmsnorm(ar, residual, weight, eps, out=out, residual_out=ro)
        return Step(unfused_ours)
    import torch.distributed as dist

    device_group = case.group.device_group
    buf = x.clone()

    def refill() -> None:
        buf.copy_(x)
    if name == "nccl_torch":
        import torch.nn.functional as F

        def nccl_torch():
            dist.all_reduce(buf, group=device_group)  # in place, as serving engines call it
            torch.add(buf, residual, out=ro)
            return F.rms_norm(ro, (case.hidden,), weight, eps), ro
        return Step(nccl_torch, refill, repeatable=False)
    if name == "nccl_ours":
        def nccl_ours():
            dist.all_reduce(buf, group=device_group)
            return add_rmsnorm(buf, residual, weight, eps, out=out, residual_out=ro)
        return Step(nccl_ours, refill, repeatable=False)
    if name == "symm_mem":
        import torch.distributed._symmetric_memory as symm_mem

        group_name = (device_group or dist.group.WORLD).group_name
        shared = symm_mem.empty(x.numel(), dtype=x.dtype, device=x.device)
        symm_mem.rendezvous(shared, group_name)
        ar = torch.empty_like(x)

        def symm():
            shared.copy_(x.view(-1))
            torch.ops.symm_mem.one_shot_all_reduce_out(shared, "sum", group_name, ar.view(-1))
            return add_rmsnorm(ar, residual, weight, eps, out=out, residual_out=ro)
        return Step(symm)
    if name == "flashinfer":
        import flashinfer.comm as fic

        group = case.group
        workspace = fic.create_allreduce_fusion_workspace(backend="trtllm", world_size=group.world, rank=group.rank,
                                                          max_token_num=case.m, hidden_dim=case.hidden, dtype=x.dtype)

        def flashinfer():
            fic.allreduce_fusion(input=x, workspace=workspace, pattern=fic.AllReduceFusionPattern.kARResidualRMSNorm,
                                 launch_with_pdl=False, residual_in=residual, residual_out=ro, norm_out=out,
                                 rms_gamma=weight, rms_eps=eps, fp32_acc=True)
            return out, ro
        return Step(flashinfer, close=workspace.destroy)
    raise ValueError(f"no step for path {name!r}")


def verify(path: BenchPath, case: Case, results: list[tuple[Any, Any]]) -> None:
    """Raises BenchError unless every local rank's (out, residual_out) meets the path's bound."""
    import torch

    where = f"{path.name}, TP{case.group.world}, m={case.m}, hidden={case.hidden}, {case.dtype}"
    for i, (out, ro) in enumerate(results):
        rank = case.group.local[i]
        if path.exact:
            if not torch.equal(ro, case.ref_ro):
                raise BenchError(f"{where}: rank {rank}'s residual_out differs from the rank-order reference in "
                                 f"{(ro != case.ref_ro).sum().item()} elements")
            worst = ulp_distance(out, case.ref_out).max().item()
            if worst > 1:
                raise BenchError(f"{where}: rank {rank}'s out is {worst} ulp from the reference")
            continue
        for label, got, want in (("residual_out", ro, case.ref_ro), ("out", out, case.ref_out)):
            err = (got.float() - want.float()).abs().max().item()
            bound = BASELINE_TOLERANCE * want.float().abs().max().item()
            if not err <= bound:  # NaN fails too
                raise BenchError(f"{where}: rank {rank}'s {label} is {err:.3g} from the reference (bound {bound:.3g})")

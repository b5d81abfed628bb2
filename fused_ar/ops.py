"""Public single-GPU ops. `add_rmsnorm` is also the epilogue of the communicator's fallback path.

Semantics are docs/design.md section 1 with N = 1. A call's key (shapes, dtypes, strides, devices, which
outputs are given) is validated fully the first time, with a launch plan built for it (fused_ar.plans);
later calls with that key check only what can change (pointers, alignment, aliasing, eps) and launch.
Anything a per-call check does not pass goes through the full validation, which raises the error.
"""

from __future__ import annotations

from typing import Any, Optional

from .kernels import add_rmsnorm_block
from .launch import spec_for
from .plans import LaunchPlan, nbytes, plain_eps, raw_stream, rmsnorm_key, rmsnorm_pointers_ok
from .spec import DEFAULT_PACK, DType, Op
from .validate import check_devices, check_eps, check_outputs, check_rmsnorm_inputs

# Grid-stride over rows beyond this many blocks: keeps grid * block under 2**32 (a HIP limit) for any m.
MAX_GRID_BLOCKS = 1 << 16


class AddRmsnormPlan(LaunchPlan):
    """add_rmsnorm for one key: the kernel, its grid, rows and cols fixed; the byte size of each operand
    for the per-call aliasing check."""

    __slots__ = ("x_bytes", "weight_bytes")

    def __init__(self, x: Any, weight: Any) -> None:
        cols = x.shape[-1]
        rows = x.numel() // cols
        device = x.device.index
        block = add_rmsnorm_block(cols * x.element_size() // DEFAULT_PACK)
        spec = spec_for(Op.ADD_RMSNORM, DType.parse(x.dtype), device, block)
        super().__init__(spec, device, min(rows, MAX_GRID_BLOCKS), {"rows": rows, "cols": cols})
        self.x_bytes, self.weight_bytes = nbytes(x), nbytes(weight)

    def run(self, out: Any, residual_out: Any, x: Any, residual: Any, weight: Any, eps: float) -> None:
        buf = self.buffer()
        v = buf.values
        v.out, v.residual_out = out.data_ptr(), residual_out.data_ptr()
        v.x, v.residual, v.weight = x.data_ptr(), residual.data_ptr(), weight.data_ptr()
        v.eps = eps
        self.launch(raw_stream(self.device), buf)


_plans: dict[tuple, AddRmsnormPlan] = {}


def _fast_plan(x: Any, residual: Any, weight: Any, eps: Any, out: Any, residual_out: Any) -> Optional[AddRmsnormPlan]:
    """The plan of this call's key when every per-call check passes, else None (the full checks then run)."""
    try:
        plan = _plans.get(rmsnorm_key(x, residual, weight, out, residual_out))
    except AttributeError:  # not a tensor: the full checks say so
        return None
    if plan is None or not plain_eps(eps):
        return None
    if not rmsnorm_pointers_ok(plan.x_bytes, plan.weight_bytes, x, residual, weight, out, residual_out):
        return None
    return plan


def _checked_plan(x: Any, residual: Any, weight: Any, eps: Any, out: Any, residual_out: Any) -> tuple[AddRmsnormPlan, float]:
    """Every rule of the op (raising InputError naming the value), then the plan of this key."""
    shape, eps = check_rmsnorm_inputs(x, residual, weight, eps)
    check_outputs({"x": x, "residual": residual, "weight": weight}, {"out": out, "residual_out": residual_out}, x)
    outputs = {k: v for k, v in (("out", out), ("residual_out", residual_out)) if v is not None}
    check_devices(x=x, residual=residual, weight=weight, **outputs)
    key = rmsnorm_key(x, residual, weight, out, residual_out)
    plan = _plans.get(key)
    if plan is None:
        plan = _plans[key] = AddRmsnormPlan(x, weight)
    return plan, eps


def add_rmsnorm(x: Any, residual: Any, weight: Any, eps: float = 1e-6, *, out: Optional[Any] = None,
                residual_out: Optional[Any] = None) -> tuple[Any, Any]:
    """(out, residual_out): residual_out = T(x + residual), out = T(RMSNorm(residual_out) * weight).

    Out-of-place: x, residual and weight are never written. x and residual share a shape (..., n) and
    dtype (bf16, fp16, fp32); weight is (n,); n is a multiple of 16 bytes. `out` and `residual_out` may
    be given (x's shape and dtype, aliasing nothing) and are then written and returned. Runs on torch's
    current stream of x's device.
    """
    import torch

    plan = _fast_plan(x, residual, weight, eps, out, residual_out)
    if plan is None:
        plan, eps = _checked_plan(x, residual, weight, eps, out, residual_out)
    out = torch.empty_like(x) if out is None else out
    residual_out = torch.empty_like(x) if residual_out is None else residual_out
    plan.run(out, residual_out, x, residual, weight, eps)
    return out, residual_out


def add_rmsnorm_into(out: Any, residual_out: Any, x: Any, residual: Any, weight: Any, eps: float) -> None:
    """Launch on already validated, same-shaped contiguous tensors (the fallback's epilogue)."""
    plan = _fast_plan(x, residual, weight, eps, out, residual_out)
    if plan is None:
        plan, eps = _checked_plan(x, residual, weight, check_eps(eps), out, residual_out)
    plan.run(out, residual_out, x, residual, weight, eps)

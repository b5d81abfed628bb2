"""Public single-GPU ops. `add_rmsnorm` is also the epilogue of the communicator's fallback path.

Semantics are docs/design.md sections 1 and 1b with N = 1. A call's key (shapes, dtypes, strides, devices,
which operands are given) is validated fully the first time, with a launch plan built for it
(fused_ar.plans); later calls with that key check only what can change (pointers, their alignment,
aliasing, eps, the weight offset) and launch. Anything a per-call check does not pass goes through the full
validation, which raises the error or builds the plan that call needs.
"""

from __future__ import annotations

from typing import Any, Optional

from .kernels import add_rmsnorm_block
from .launch import spec_for
from .plans import LaunchPlan, plain_eps, plain_offset, raw_stream, rmsnorm_key, rmsnorm_pointers_ok, span_bytes
from .spec import Op
from .validate import RmsnormCall, RowsShape, check_devices, check_outputs, check_rmsnorm_inputs, row_pack

# Grid-stride over rows beyond this many blocks: keeps grid * block under 2**32 (a HIP limit) for any m.
MAX_GRID_BLOCKS = 1 << 16


class AddRmsnormPlan(LaunchPlan):
    """add_rmsnorm for one key and access width: the kernel, its grid, the shape and strides fixed; the
    byte spans and alignment the per-call pointer check needs."""

    __slots__ = ("align", "spans", "in_place")

    def __init__(self, call: RmsnormCall, layouts: dict[str, RowsShape], device: int, pack: int, in_place: bool,
                 tensors: tuple) -> None:
        rows, cols, dtype = call.x.rows, call.x.cols, call.x.dtype
        block = add_rmsnorm_block(-(-cols * dtype.itemsize // pack))
        spec = spec_for(Op.ADD_RMSNORM, dtype, device, block, pack=pack, weight=call.weight,
                        residual=call.residual_stride is not None, inplace=in_place)
        fixed = {"rows": rows, "cols": cols, "x_stride": call.x.row_stride,
                 "residual_stride": call.residual_stride or 0,
                 "out_stride": layouts["out"].row_stride if "out" in layouts else cols,
                 "residual_out_stride": layouts["residual_out"].row_stride if "residual_out" in layouts else cols}
        super().__init__(spec, device, min(rows, MAX_GRID_BLOCKS), fixed)
        self.align, self.in_place = pack, in_place
        self.spans = tuple(span_bytes(t) for t in tensors)

    def run(self, out: Any, residual_out: Any, x: Any, residual: Any, weight: Any, eps: float, offset: float) -> None:
        buf = self.buffer()
        v = buf.values
        v.out, v.residual_out, v.x = out.data_ptr(), residual_out.data_ptr(), x.data_ptr()
        v.residual = 0 if residual is None else residual.data_ptr()
        v.weight = 0 if weight is None else weight.data_ptr()
        v.eps, v.weight_offset = eps, offset
        self.launch(raw_stream(self.device), buf)


_plans: dict[tuple, AddRmsnormPlan] = {}  # per key: the plan of a call whose pointers are as aligned as its strides
_by_pack: dict[tuple, AddRmsnormPlan] = {}  # per (key, access width, in place): every plan made


def _fast_plan(x: Any, residual: Any, weight: Any, eps: Any, offset: Any, out: Any,
               residual_out: Any) -> Optional[AddRmsnormPlan]:
    """The plan of this call's key when every per-call check passes, else None (the full checks then run)."""
    try:
        plan = _plans.get(rmsnorm_key(x, residual, weight, out, residual_out))
    except AttributeError:  # not a tensor: the full checks say so
        return None
    if plan is None or not plain_eps(eps) or not plain_offset(offset):
        return None
    if not rmsnorm_pointers_ok(plan.spans, plan.align, plan.in_place, x, residual, weight, out, residual_out):
        return None
    return plan


def _checked_plan(x: Any, residual: Any, weight: Any, eps: Any, offset: Any, out: Any,
                  residual_out: Any) -> tuple[AddRmsnormPlan, float, float]:
    """Every rule of the op (raising InputError naming the value), then the plan of this call."""
    call = check_rmsnorm_inputs(x, residual, weight, eps, offset)
    layouts = check_outputs({"x": x, "residual": residual, "weight": weight},
                            {"out": out, "residual_out": residual_out}, x)
    check_devices(x=x, residual=residual, weight=weight, out=out, residual_out=residual_out)
    in_place = (out is not None and out.data_ptr() == x.data_ptr()) or (
        residual_out is not None and residual is not None and residual_out.data_ptr() == residual.data_ptr())
    strides = [call.x.row_stride] + [call.residual_stride] * (residual is not None) + \
        [layout.row_stride for layout in layouts.values()]
    rows_at = [t.data_ptr() for t in (x, residual, out, residual_out) if t is not None]
    weight_at = [] if weight is None else [weight.data_ptr()]
    pack = row_pack(call.x.dtype.itemsize, rows_at + weight_at, strides)
    key = rmsnorm_key(x, residual, weight, out, residual_out)
    plan = _by_pack.get((key, pack, in_place))
    if plan is None:
        plan = _by_pack[(key, pack, in_place)] = AddRmsnormPlan(call, layouts, x.device.index, pack, in_place,
                                                                (x, residual, weight, out, residual_out))
    if pack == row_pack(call.x.dtype.itemsize, [0], strides):  # as aligned as the layout allows: the fast path's
        _plans[key] = plan
    return plan, call.eps, call.offset


def add_rmsnorm(x: Any, residual: Optional[Any], weight: Optional[Any], eps: float = 1e-6, *,
                weight_offset: float = 0.0, out: Optional[Any] = None,
                residual_out: Optional[Any] = None) -> tuple[Any, Any]:
    """(out, residual_out): residual_out = T(x + residual), out = T(RMSNorm(residual_out) * (weight +
    weight_offset)), the RMSNorm's mean and scaling in fp32 (fp64 for fp32 x).

    x: rows (..., n) of bf16, fp16 or fp32, any n, the last dimension of unit stride and the rows any stride
    of at least n apart. residual: like x (its own row stride), or None (residual_out is then x's values).
    weight: (n,) of x's dtype, or fp32 with a 16-bit x, or None (ones). weight_offset: 0, or 1 for Gemma's
    `x * (1 + w)`. `out` and `residual_out` may be given (x's shape and dtype, any row layout) and are then
    written and returned; `out` may be x itself and `residual_out` residual itself (in place), any other
    overlap is refused. Runs on torch's current stream of x's device.
    """
    import torch

    plan = _fast_plan(x, residual, weight, eps, weight_offset, out, residual_out)
    if plan is None:
        plan, eps, weight_offset = _checked_plan(x, residual, weight, eps, weight_offset, out, residual_out)
    out = torch.empty_like(x) if out is None else out
    residual_out = torch.empty_like(x) if residual_out is None else residual_out
    plan.run(out, residual_out, x, residual, weight, eps, weight_offset)
    return out, residual_out


def add_rmsnorm_into(out: Any, residual_out: Any, x: Any, residual: Optional[Any], weight: Optional[Any], eps: float,
                     weight_offset: float = 0.0) -> None:
    """The fallback's epilogue: writes into given outputs (the caller validated the call)."""
    plan = _fast_plan(x, residual, weight, eps, weight_offset, out, residual_out)
    if plan is None:
        plan, eps, weight_offset = _checked_plan(x, residual, weight, eps, weight_offset, out, residual_out)
    plan.run(out, residual_out, x, residual, weight, eps, weight_offset)


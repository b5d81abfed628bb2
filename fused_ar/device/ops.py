"""Public single-GPU ops: `add_rmsnorm` (out in T), `add_rmsnorm_fp8` and `add_rmsnorm_fp4` (out quantized, with
its scales), also the epilogue of the communicator's fallback path.

Semantics are docs/design.md sections 1 and 1b with N = 1. A call's key (shapes, dtypes, strides, devices,
which operands are given, how it quantizes) is validated fully the first time, with a launch plan built
for it (fused_ar.device.plans); later calls with that key check only what can change (pointers, their alignment,
aliasing, eps, the weight offset) and launch. Anything a per-call check does not pass goes through the
full validation, which raises the error or builds the plan that call needs.
"""

from __future__ import annotations

from typing import Any, Optional

from ..jit.kernels import add_rmsnorm_kernel, group_in_lanes, lane_epilogue_block
from .launch import arch_of, spec_for
from .. import env
from .plans import (PLAN_ENV, LaunchPlan, call_inputs, fp4_arguments, fp8_arguments, input_addresses, plain_eps,
                    plain_offset, quant_key, raw_stream, rmsnorm_key, span_bytes)
from ..errors import InputError
from ..jit.spec import DEFAULT_PACK, Op, Quant, native_fp8
from .validate import (QuantCall, RmsnormCall, RowsShape, check_devices, check_fp8_call, check_outputs,
                       check_rmsnorm_inputs, check_scale_value, overlaps, row_pack)

# Grid-stride over rows beyond this many blocks: keeps grid * block under 2**32 (a HIP limit) for any m.
MAX_GRID_BLOCKS = 1 << 16


class AddRmsnormPlan(LaunchPlan):
    """add_rmsnorm for one key and access width: the kernel, its grid, the shape and strides fixed; the
    byte spans and alignments the per-call pointer checks need."""

    __slots__ = ("align", "spans", "in_place", "quant", "q_spans", "q_align")

    def __init__(self, call: RmsnormCall, quant: Optional[QuantCall], layouts: dict[str, RowsShape], device: int,
                 pack: int, in_place: bool, tensors: tuple, q_tensors: tuple = ()) -> None:
        rows, cols, dtype = call.x.rows, call.x.cols, call.x.dtype
        packs = -(-cols * dtype.itemsize // pack)
        block, short_rows = add_rmsnorm_kernel(packs)
        if quant is None:
            variant = {"short_rows": short_rows}
        else:  # the T call's sum order (its block, or one pack a thread: kernels.py), so q quantizes its out exactly
            if quant.kind.per_group and not group_in_lanes(quant.group, pack // dtype.itemsize):
                short_rows = False  # the same sum order with more registers: the shared-memory amax fits there
            elif short_rows and (quant.kind.per_group or quant.kind.fp4):
                block = lane_epilogue_block(packs, rows, block)
            variant = {"quant": quant.kind, "fp8": quant.fmt, "short_rows": short_rows}
        spec = spec_for(Op.ADD_RMSNORM, dtype, device, block, pack=pack, weight=call.weight,
                        residual=call.residual_stride is not None, inplace=in_place, **variant)
        fixed = {"rows": rows, "cols": cols, "x_stride": call.x.row_stride, "residual_stride": call.residual_stride or 0,
                 "out_stride": layouts["out"].row_stride if "out" in layouts else (quant.out_cols if quant else cols),
                 "residual_out_stride": layouts["residual_out"].row_stride if "residual_out" in layouts else cols}
        scale_args, shared_mem = ({}, 0) if quant is None else quant.launch_args(cols)
        super().__init__(spec, device, min(rows, MAX_GRID_BLOCKS), {**fixed, **scale_args}, shared_mem=shared_mem)
        self.align, self.in_place, self.quant = pack, in_place, quant
        self.spans = tuple(span_bytes(t) for t in tensors)
        self.q_spans = tuple(span_bytes(t) for t in q_tensors)  # out (quantized), scales or scale
        self.q_align = pack // dtype.itemsize // (1 if quant is None else quant.out_ratio)  # out bytes per access

    def run(self, out: Any, residual_out: Any, inputs: tuple[int, int, int], eps: float, offset: float,
            scales: Any = None, global_scale: Any = None, scale_copy: Any = None) -> None:
        """One launch; `inputs`: the (x, residual, weight) addresses, 0 for an absent one; `scale_copy`: where
        the kernel writes a static scale's value (None: nowhere)."""
        buf = self.buffer()
        v = buf.values
        v.x, v.residual, v.weight = inputs
        v.out, v.residual_out = out.data_ptr(), residual_out.data_ptr()
        v.scales = 0 if scales is None else scales.data_ptr()
        v.global_scale = 0 if global_scale is None else global_scale.data_ptr()
        v.scale_copy = 0 if scale_copy is None else scale_copy.data_ptr()
        v.eps, v.weight_offset = eps, offset
        self.launch(raw_stream(self.device), buf)
        if scale_copy is not None and not self.grid:  # no rows, no kernel: the copy it would have written
            scale_copy.copy_(scales)


_plans: dict[tuple, AddRmsnormPlan] = {}  # per key: the plan of a call whose pointers are as aligned as its strides
_by_pack: dict[tuple, AddRmsnormPlan] = {}  # per (key, access width, in place): every plan made


def _plan(x: Any, residual: Any, weight: Any, eps: Any, offset: Any, out: Any, residual_out: Any,
          fp8: Optional[dict] = None) -> tuple[AddRmsnormPlan, tuple[int, int, int], float, float]:
    """(plan, the (x, residual, weight) addresses, eps, offset) of this call: only the per-call checks when its
    key has a plan and they pass, else every check (which raises the error or builds the plan). `fp8`: the
    FP8 call's fp8_arguments."""
    try:
        key = (rmsnorm_key(x, residual, weight, out, residual_out), env.raw_values(PLAN_ENV),
               None if fp8 is None else quant_key(fp8))
        plan = _plans.get(key)
    except (AttributeError, TypeError):  # not a tensor, or an argument that cannot key: the full checks say so
        key, plan = None, None
    if plan is not None and plain_eps(eps) and plain_offset(offset):
        inputs = call_inputs(plan, x, residual, weight, out, residual_out, *quant_pointers(fp8))
        if inputs is not None:
            return plan, inputs, eps, offset
    plan, eps, offset = _checked_plan(key, x, residual, weight, eps, offset, out, residual_out, fp8)
    return plan, input_addresses(x, residual, weight), eps, offset


def _checked_plan(key: tuple, x: Any, residual: Any, weight: Any, eps: Any, offset: Any, out: Any, residual_out: Any,
                  fp8: Optional[dict] = None) -> tuple[AddRmsnormPlan, float, float]:
    """Every rule of the op (raising InputError naming the value), then the plan of this call. `fp8`: the FP8
    call's fp8_arguments."""
    call = check_rmsnorm_inputs(x, residual, weight, eps, offset)
    quant = None
    named = {"out": out, "residual_out": residual_out}
    if fp8 is not None:
        quant, q_layout = check_fp8_call(x, call, fp8, native_fp8(arch_of(x.device.index)) if x.device.type == "cuda"
                                         else native_fp8("sm_90"), out)
        named = {"residual_out": residual_out}
    layouts = check_outputs({"x": x, "residual": residual, "weight": weight}, named, x)
    if fp8 is not None:
        check_fp8_aliasing(quant, x, residual, weight, residual_out, out, fp8)
        if q_layout is not None:
            layouts["out"] = q_layout
    check_devices(x=x, residual=residual, weight=weight, out=out, residual_out=residual_out, **quant_tensors(fp8))
    check_quant_values(quant, fp8)
    in_place = (fp8 is None and out is not None and out.data_ptr() == x.data_ptr()) or (
        residual_out is not None and residual is not None and residual_out.data_ptr() == residual.data_ptr())
    strides = [call.x.row_stride] + [call.residual_stride] * (residual is not None) + \
        [layout.row_stride for name, layout in layouts.items() if name != "out" or fp8 is None]
    rows_at = [t.data_ptr() for t in (x, residual, residual_out) if t is not None]
    rows_at += [] if out is None or fp8 is not None else [out.data_ptr()]
    weight_at = [] if weight is None else [weight.data_ptr()]
    itemsize = call.x.dtype.itemsize
    if fp8 is not None and out is not None:  # FP8 rows: a byte per element (FP4: two), so scaled to T's alignment
        rows_at.append(out.data_ptr() * itemsize * quant.out_ratio)
        strides.append(layouts["out"].row_stride * quant.out_ratio)
    pack = row_pack(itemsize, rows_at + weight_at, strides)
    if quant is not None and quant.kind.fp4 and pack != DEFAULT_PACK:
        raise InputError(f"FP4 output writes whole bytes of codes from 16-byte accesses: x, residual, weight and "
                         f"the outputs need 16-byte aligned rows (row starts at {[hex(p) for p in rows_at]}, "
                         f"row strides {strides} elements)")
    plan = _by_pack.get((key, pack, in_place))
    if plan is None:
        q_tensors = () if fp8 is None else (out, fp8["scales"])
        plan = _by_pack[(key, pack, in_place)] = AddRmsnormPlan(
            call, quant, layouts, x.device.index, pack, in_place, (x, residual, weight, None if fp8 else out,
                                                                   residual_out), q_tensors)
    if key is not None and pack == row_pack(itemsize, [0], strides):  # as aligned as the layout allows: the fast path's
        _plans[key] = plan
    return plan, call.eps, call.offset


def quant_tensors(fp8: Optional[dict]) -> dict[str, Any]:
    """The tensors of a quantized call's arguments, by name, for the device checks (none for a T call)."""
    return {} if fp8 is None else {"scales": fp8["scales"], "global_scale": fp8["global_scale"],
                                   "scales_out": fp8["scale_copy"]}


def quant_pointers(fp8: Optional[dict]) -> tuple[Any, Any, Any]:
    """(scales, global scale, static scale's copy) of a call's quantization arguments, for the per-call checks
    and the launch."""
    return (None, None, None) if fp8 is None else (fp8["scales"], fp8["global_scale"], fp8["scale_copy"])


def returned_scales(fp8: Optional[dict], scales: Any, launched: bool) -> Any:
    """The scales a quantized call returns: `scales`, or for a static scale given with scales_out, that copy,
    which the kernel wrote (copied here for a call that `launched` nothing)."""
    copy = None if fp8 is None else fp8["scale_copy"]
    if copy is None:
        return scales
    if not launched:
        copy.copy_(fp8["scales"])
    return copy


def check_quant_values(quant: Optional[QuantCall], fp8: Optional[dict]) -> None:
    """A static FP8 scale and NVFP4's global scale: positive and finite (one device read at a key's first call)."""
    if quant is not None and quant.kind is Quant.STATIC:
        check_scale_value(fp8["scales"])
    if quant is not None and fp8["global_scale"] is not None:
        check_scale_value(fp8["global_scale"], "global_scale")


def check_fp8_aliasing(quant: QuantCall, x: Any, residual: Any, weight: Any, residual_out: Any, out: Any,
                       fp8: dict) -> None:
    """The quantized out and the scales it writes (a static scale and NVFP4's global scale are read) share no
    byte with another operand."""
    static = quant.kind is Quant.STATIC
    scales = fp8["scales"]
    written = [("out", out)] + ([("scales_out", fp8["scale_copy"])] if static else [("scales_out", scales)])
    others = [("x", x), ("residual", residual), ("weight", weight), ("residual_out", residual_out)] + \
        ([("scale", scales)] if static else []) + [("global_scale", fp8["global_scale"])]
    for i, (name, t) in enumerate(written):
        for other_name, other in others + written[i + 1:]:
            if t is not None and other is not None and overlaps(t, other):
                raise InputError(f"{name} overlaps {other_name}: outputs must not alias the inputs or each other")


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

    plan, inputs, eps, weight_offset = _plan(x, residual, weight, eps, weight_offset, out, residual_out)
    out = torch.empty_like(x) if out is None else out
    residual_out = torch.empty_like(x) if residual_out is None else residual_out
    plan.run(out, residual_out, inputs, eps, weight_offset)
    return out, residual_out


def add_rmsnorm_fp8(x: Any, residual: Optional[Any], weight: Optional[Any], eps: float = 1e-6, *,
                    weight_offset: float = 0.0, scale: Optional[Any] = None, group_size: Optional[int] = None,
                    fp8_dtype: Any = None, scales_format: str = "fp32", scales_mn_major: bool = False,
                    out: Optional[Any] = None, residual_out: Optional[Any] = None,
                    scales_out: Optional[Any] = None) -> tuple[Any, Any, Any]:
    """(q, residual_out, scales): add_rmsnorm's out quantized to FP8 in the same kernel (docs/design.md
    section 1b), bit for bit what torch gives for `(y * (1.0 / s)).clamp(-M, M).to(fp8)` of that out y.

    scale: a one-element float32 tensor on x's device (static; returned as the scales, or with scales_out,
    a float32 of the scale's shape, written with the scale's value by the kernel and returned); else, without
    group_size, one scale per row (fp32, shape (..., 1)); with group_size G, one per G columns (shape
    (..., n / G); G divides n into whole 16-byte packs). Dynamic scales are max(amax / M, 1 / (512 M)) with
    M = 448 for float8_e4m3fn, 240 for float8_e4m3fnuz. Per-group scales come as scales_format says: "fp32"
    (those scales), "ue8m0" (rounded up to a power of two, as fp32) or "ue8m0_packed" (the power of two's
    exponent byte, four groups to an int32, group j in byte j % 4 of word j // 4: shape (..., ceil(n / G / 4)));
    scales_mn_major lays the per-group scales out column-major, each column 16-byte aligned (strides (1, m
    rounded up to 4) for 2-D x), as block-FP8 GEMMs read them. fp8_dtype: torch.float8_e4m3fn or
    float8_e4m3fnuz (default: the device's own: fnuz on gfx942, fn elsewhere). residual_out keeps x's dtype
    and the bits of add_rmsnorm. out (FP8, x's shape, any row layout), residual_out and scales_out (of the
    shape, dtype and strides the call would allocate) may be given. The other inputs are as add_rmsnorm's.
    """
    fp8 = fp8_arguments(scale, group_size, fp8_dtype, scales_format, scales_mn_major, scales_out)
    return _quantized(x, residual, weight, eps, weight_offset, out, residual_out, fp8)


def add_rmsnorm_fp4(x: Any, residual: Optional[Any], weight: Optional[Any], eps: float = 1e-6, *,
                    fp4_format: str = "nvfp4", global_scale: Optional[Any] = None, scales_swizzled: bool = False,
                    weight_offset: float = 0.0, out: Optional[Any] = None, residual_out: Optional[Any] = None,
                    scales_out: Optional[Any] = None) -> tuple[Any, Any, Any]:
    """(values, residual_out, scales): add_rmsnorm's out quantized to FP4 in the same kernel (docs/design.md
    section 1b), bit for bit fused_ar.reference.nvfp4_reference / mxfp4_reference of that out.

    values: E2M1 codes two a byte, the first element in the low nibble, uint8 (..., n / 2). fp4_format
    "nvfp4": per 16 columns an E4M3 scale e4m3(global_scale * amax / 6) and values e2m1(y * (global_scale /
    scale)); global_scale is one float32 on x's device (positive, finite); scales float8_e4m3fn (..., n / 16),
    or with scales_swizzled the NVFP4 GEMMs' layout: 1-D, rows padded to 128 and blocks to 4, tiles of
    128 x 4 (fused_ar.reference.swizzle_nvfp4_scales; the padding is 0 in scales this call allocates; a
    given scales_out's padding rows are left as they are). "mxfp4" (OCP MX): per 32 columns the UE8M0 byte of
    2^(floor(log2(amax)) - 2) and values e2m1(y / that), scales uint8 (..., n / 32); "mxfp4_rceil" and
    "mxfp4_even" round that exponent as AMD's aiter (RoundUp) and Quark (EVEN) do (reference.mxfp4_reference's
    `rounding`). n is a multiple of the
    block; rows are 16-byte aligned. residual_out keeps x's dtype and add_rmsnorm's bits; out, residual_out
    and scales_out may be given. The other inputs are as add_rmsnorm's.
    """
    fp8 = fp4_arguments(fp4_format, global_scale, scales_swizzled, scales_out)
    return _quantized(x, residual, weight, eps, weight_offset, out, residual_out, fp8)


def _quantized(x: Any, residual: Any, weight: Any, eps: Any, weight_offset: Any, out: Any, residual_out: Any,
               fp8: dict) -> tuple[Any, Any, Any]:
    import torch

    plan, inputs, eps, weight_offset = _plan(x, residual, weight, eps, weight_offset, out, residual_out, fp8)
    quant = plan.quant
    out = quant.new_out(x) if out is None else out
    residual_out = torch.empty_like(x) if residual_out is None else residual_out
    scales = quant.new_scales(x.device) if fp8["scales"] is None else fp8["scales"]
    plan.run(out, residual_out, inputs, eps, weight_offset, scales, fp8["global_scale"], fp8["scale_copy"])
    return out, residual_out, returned_scales(fp8, scales, launched=True)  # run copies where it launches nothing


def add_rmsnorm_into(out: Any, residual_out: Any, x: Any, residual: Optional[Any], weight: Optional[Any], eps: float,
                     weight_offset: float = 0.0, fp8: Optional[dict] = None, scales: Any = None) -> None:
    """The fallback's epilogue: writes into given outputs (the caller validated the call); with `fp8` (the
    call's fp8_arguments or fp4_arguments), out quantized and its scales into `scales` (the static scale:
    read)."""
    if fp8 is not None:
        fp8 = {**fp8, "scales": scales}
    plan, inputs, eps, weight_offset = _plan(x, residual, weight, eps, weight_offset, out, residual_out, fp8)
    plan.run(out, residual_out, inputs, eps, weight_offset, *quant_pointers(fp8))


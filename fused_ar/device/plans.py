"""Launch plans: what a call needs that depends only on its key (op, shapes, dtypes, strides, devices, path,
environment), validated and built once; per call only pointers, alignment, aliasing and eps are checked,
and only the changing fields of a prebuilt argument buffer are written before one ctypes launch.

A plan never validates: callers run the full checks of fused_ar.device.validate when they build one, and the
per-call checks each time (`rmsnorm_pointers`, `allreduce_pointers_ok`, `plain_eps`), falling back to the
full checks (which raise the right error) when a per-call check fails.
"""

from __future__ import annotations

import ctypes
import math
import threading
from typing import Any, Callable, Optional, Sequence

from .. import env
from ..jit.kernels import Arg, KernelDef, kernel_def
from .launch import function
from ..backends import current_runtime
from ..jit.runtime import check_grid, pack_args, stream_arg
from ..jit.spec import DEFAULT_PACK, KernelSpec

_CTYPES = {Arg.PTR: ctypes.c_void_p, Arg.I32: ctypes.c_int32, Arg.I64: ctypes.c_int64, Arg.F32: ctypes.c_float}
_structs: dict[KernelDef, type] = {}


def _struct_for(kdef: KernelDef) -> type:
    """A ctypes Structure laid out like the kernel's C parameters, one field per parameter. No instance dict: a
    call writing a name the kernel does not take raises, where a plain Structure would keep it as a Python
    attribute that never reaches the kernel."""
    struct = _structs.get(kdef)
    if struct is None:
        fields = [(name, _CTYPES[kind]) for name, kind in kdef.params]
        struct = _structs[kdef] = type(f"{kdef.op.value}_args", (ctypes.Structure,),
                                       {"_fields_": fields, "__slots__": ()})
    return struct


class ArgBuffer:
    """One launch's arguments in C layout and the void* array of their addresses that the driver reads at
    launch time (so one buffer serves every launch of a plan from one thread)."""

    __slots__ = ("values", "pointers", "address")

    def __init__(self, kdef: KernelDef, fixed: dict[str, Any]) -> None:
        struct = _struct_for(kdef)
        self.values = struct()
        for (name, _), value in zip(kdef.params, pack_args(kdef, [fixed.get(n, 0) for n, _ in kdef.params])):
            setattr(self.values, name, value.value)
        base = ctypes.addressof(self.values)
        self.pointers = (ctypes.c_void_p * len(kdef.params))(*[base + getattr(struct, n).offset for n, _ in kdef.params])
        self.address = ctypes.c_void_p(ctypes.addressof(self.pointers))


# What a plan reads from the environment when it is made (FUSED_AR_PDL): part of every plan key, so a change
# takes effect at the next call.
PLAN_ENV = env.raw_names(env.PDL)


class LaunchPlan:
    """A kernel ready to launch on one device with a fixed grid and the arguments that do not change."""

    __slots__ = ("spec", "device", "grid", "block", "fn", "kdef", "fixed", "launch_raw", "shared_mem", "pdl", "_local")

    def __init__(self, spec: KernelSpec, device: int, grid: int, fixed: dict[str, Any], shared_mem: int = 0) -> None:
        self.spec, self.device, self.grid, self.block = spec, device, grid, spec.block
        self.shared_mem = shared_mem  # dynamic LDS bytes per block (the per-group FP8 amax)
        self.kdef = kernel_def(spec.op)
        self.fixed = dict(fixed)
        pack_args(self.kdef, [self.fixed.get(n, 0) for n, _ in self.kdef.params])  # range-checks the fixed values
        check_grid(self.kdef, grid, self.fixed)
        runtime = current_runtime()
        self.fn = ctypes.c_void_p(runtime.function_pointer(function(spec, device)))
        self.launch_raw = runtime.launch_raw
        self.pdl = bool(env.PDL.get()) and runtime.supports_pdl(spec.arch)
        self._local = threading.local()

    def buffer(self) -> ArgBuffer:
        """This thread's argument buffer (the fixed values already written)."""
        try:
            return self._local.buffer
        except AttributeError:
            buf = self._local.buffer = ArgBuffer(self.kdef, self.fixed)
            return buf

    def launch(self, stream: int, buf: ArgBuffer) -> None:
        if self.grid:
            self.launch_raw(self.fn, self.grid, self.block, buf.address, stream_arg(stream), self.shared_mem, self.pdl)


_raw_stream_getter: list[Callable[[int], int]] = []


def raw_stream(device: int) -> int:
    """torch's current stream on `device` as a raw handle (one C call: what Inductor's generated code uses)."""
    if not _raw_stream_getter:
        import torch

        getter = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        _raw_stream_getter.append(getter or (lambda d: torch.cuda.current_stream(d).cuda_stream))
    return _raw_stream_getter[0](device)


def is_capturing() -> bool:
    import torch

    check = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)
    return bool(check()) if check is not None else torch.cuda.is_current_stream_capturing()


def rmsnorm_key(x: Any, residual: Any, weight: Any, out: Any, residual_out: Any) -> tuple:
    """Everything an add + RMSNorm plan depends on in its tensors (AttributeError for a non-tensor: the
    caller then runs the full checks, which say what is wrong). Spelled out, not through a helper per tensor:
    this runs on every call and a Python call per tensor is a fifth of it."""
    return (x.shape, x.dtype, x.stride(), x.device,
            None if residual is None else (residual.shape, residual.dtype, residual.stride(), residual.device),
            None if weight is None else (weight.shape, weight.dtype, weight.stride(), weight.device),
            None if out is None else (out.shape, out.dtype, out.stride(), out.device),
            None if residual_out is None else (residual_out.shape, residual_out.dtype, residual_out.stride(),
                                               residual_out.device))


def span_bytes(t: Any) -> int:
    """Bytes from a tensor's first element to one past its last, whatever its strides (0 for None)."""
    if t is None:
        return 0
    from .validate import extent

    return extent(t) * t.element_size()


def rmsnorm_pointers(spans: tuple, align: int, in_place: bool, x: Any, residual: Any, weight: Any, out: Any,
                     residual_out: Any) -> Optional[tuple[int, int, int]]:
    """Per call: (x, residual, weight) addresses (0 for None) when every pointer is aligned as the plan's
    accesses need (`align`) and each given output's span is disjoint from the inputs' and the other output's,
    except out at x and residual_out at residual in an in-place plan; else None. Conservative (spans, not
    rows): what fails here takes the full checks. The addresses are read once and handed to the launch."""
    xs, rs, ws, os_, ros = spans
    xp = x.data_ptr()
    rp = -1 if residual is None else residual.data_ptr()
    wp = -1 if weight is None else weight.data_ptr()
    mask = xp | max(rp, 0) | max(wp, 0)
    op = -1
    if out is not None:
        op = out.data_ptr()
        if not (op == xp and in_place) and not (op + os_ <= xp or xp + xs <= op):
            return None
        if not (op + os_ <= rp or rp + rs <= op or rp < 0) or not (op + os_ <= wp or wp + ws <= op or wp < 0):
            return None
        mask |= op
    if residual_out is not None:
        rop = residual_out.data_ptr()
        if not (rop == rp and in_place) and not (rop + ros <= rp or rp + rs <= rop or rp < 0):
            return None
        if not (rop + ros <= xp or xp + xs <= rop) or not (rop + ros <= wp or wp + ws <= rop or wp < 0):
            return None
        if op >= 0 and not (op + os_ <= rop or rop + ros <= op):
            return None
        mask |= rop
    return None if mask % align else (xp, max(rp, 0), max(wp, 0))


def input_addresses(x: Any, residual: Any, weight: Any) -> tuple[int, int, int]:
    """(x, residual, weight) addresses, 0 for an absent one: what rmsnorm_pointers returns, for a call that took
    the full checks."""
    return x.data_ptr(), 0 if residual is None else residual.data_ptr(), 0 if weight is None else weight.data_ptr()


def quant_key(fp8: dict[str, Any]) -> tuple:
    """What a quantized plan depends on beyond rmsnorm_key (`fp8`: the call's fp8_arguments or fp4_arguments).
    A static scale is `scales` itself, so the key holds whether one was given, not its layout twice; spelled
    out, as rmsnorm_key is: this runs on every call. The types of the integer and boolean arguments are part
    of it: 128.0 == 128 and 1 == True, but the checks refuse a float group size and a non-bool flag, and a
    key shared with an accepted value would skip them. fp8_dtype keys as given (validation reads its name)."""
    scales, global_scale, copy = fp8["scales"], fp8["global_scale"], fp8["scale_copy"]
    group, mn_major, swizzled = fp8["group_size"], fp8["scales_mn_major"], fp8["swizzled"]
    return (fp8["scale"] is None, group, type(group), fp8["fp8_dtype"],
            None if scales is None else (scales.shape, scales.dtype, scales.stride(), scales.device),
            None if copy is None else (copy.shape, copy.dtype, copy.device),
            fp8["scales_format"], mn_major, type(mn_major), fp8["fp4"], swizzled, type(swizzled),
            None if global_scale is None else (global_scale.shape, global_scale.dtype, global_scale.stride(),
                                               global_scale.device))


def fp8_arguments(scale: Any, group_size: Any, fp8_dtype: Any, scales_format: Any, scales_mn_major: Any,
                  scales_out: Any) -> dict[str, Any]:
    """An FP8 call's arguments as every FP8 op passes them on, with `scales` the tensor the kernel reads or
    writes (the static scale, or the given scales_out) and `scale_copy` the scales_out given with a static
    scale (the kernel writes the scale's value there, and the call returns it)."""
    static = scale is not None
    return {"scale": scale, "group_size": group_size, "fp8_dtype": fp8_dtype, "scales_format": scales_format,
            "scales_mn_major": scales_mn_major, "scales": scale if static else scales_out,
            "scale_copy": scales_out if static else None, "fp4": None, "swizzled": False, "global_scale": None}


def fp4_arguments(fp4_format: Any, global_scale: Any, scales_swizzled: Any, scales_out: Any) -> dict[str, Any]:
    """An FP4 call's arguments in the form of fp8_arguments (`scales`: the given scales_out)."""
    return {**fp8_arguments(None, None, None, "fp32", False, scales_out), "fp4": fp4_format,
            "swizzled": scales_swizzled, "global_scale": global_scale}


def fp8_pointers_ok(spans: tuple, q_spans: tuple, q_align: int, inputs: tuple[int, int, int], residual_out: Any,
                    out: Any, scales: Any, global_scale: Any = None, scale_copy: Any = None) -> bool:
    """Per call, for quantized output: out's rows aligned to `q_align` bytes, and out's and the scales' spans
    (q_spans) disjoint from every other operand's (`inputs`: the x, residual, weight addresses, 0 for an
    absent one, whose span is then 0; spans in rmsnorm_key's order as the plan recorded them; NVFP4's global
    scale, read), and so is a static scale's copy (one float, written). Straight-line comparisons: this runs
    on every call."""
    xp, rp, wp = inputs
    xs, rs, ws, _, ros = spans
    rop, gp, gs = (0 if residual_out is None else residual_out.data_ptr()), 0, 0
    if global_scale is not None:
        gp, gs = global_scale.data_ptr(), 4
    op, os_ = 0, 0
    if out is not None:
        op, os_ = out.data_ptr(), q_spans[0]
        end = op + os_
        if op % q_align or not ((end <= xp or xp + xs <= op) and (end <= rp or rp + rs <= op) and
                                (end <= wp or wp + ws <= op) and (end <= rop or rop + ros <= op) and
                                (end <= gp or gp + gs <= op)):
            return False
    sp, ss = 0, 0
    if scales is not None:
        sp = scales.data_ptr()
        end = sp + q_spans[1]
        if not ((end <= xp or xp + xs <= sp) and (end <= rp or rp + rs <= sp) and (end <= wp or wp + ws <= sp) and
                (end <= rop or rop + ros <= sp) and (end <= gp or gp + gs <= sp) and (end <= op or op + os_ <= sp)):
            return False
        ss = q_spans[1]
    if scale_copy is not None:
        cp = scale_copy.data_ptr()
        end = cp + 4
        return ((end <= xp or xp + xs <= cp) and (end <= rp or rp + rs <= cp) and (end <= wp or wp + ws <= cp) and
                (end <= rop or rop + ros <= cp) and (end <= gp or gp + gs <= cp) and (end <= op or op + os_ <= cp)
                and (end <= sp or sp + ss <= cp))
    return True


def call_inputs(plan: Any, x: Any, residual: Any, weight: Any, out: Any, residual_out: Any,
                scales: Any, global_scale: Any = None, scale_copy: Any = None) -> Optional[tuple[int, int, int]]:
    """Every per-call pointer check of an add + RMSNorm plan (its spans, align, in_place; for quantized output
    its quant, q_spans, q_align): the (x, residual, weight) addresses when all pass, else None."""
    if plan.quant is None:
        return rmsnorm_pointers(plan.spans, plan.align, plan.in_place, x, residual, weight, out, residual_out)
    inputs = rmsnorm_pointers(plan.spans, plan.align, plan.in_place, x, residual, weight, None, residual_out)
    if inputs is None or not fp8_pointers_ok(plan.spans, plan.q_spans, plan.q_align, inputs, residual_out, out, scales,
                                             global_scale, scale_copy):
        return None
    return inputs


def allreduce_key(x: Any, out: Any) -> tuple:
    return x.shape, x.dtype, x.stride(), x.device, None if out is None else (out.shape, out.dtype, out.stride(), out.device)


def allreduce_pointers_ok(size: int, x: Any, out: Any) -> bool:
    xp = x.data_ptr()
    if out is None:
        return not xp % DEFAULT_PACK
    op = out.data_ptr()
    return (op + size <= xp or xp + size <= op) and not (xp | op) % DEFAULT_PACK


def plain_eps(eps: Any) -> bool:
    """True for what check_eps accepts unchanged: a positive finite Python float."""
    return type(eps) is float and 0.0 < eps < math.inf


def plain_offset(offset: Any) -> bool:
    """True for what check_offset accepts unchanged: a finite Python float."""
    return type(offset) is float and -math.inf < offset < math.inf


def nbytes(t: Any) -> int:
    return t.numel() * t.element_size()


class CallPlan(LaunchPlan):
    """A communicator call's plan: a kernel launch, launches in chunks (`chunks`), or the fallback (`fallback`,
    no kernel). `tensors` are the call's operands (rmsnorm: x, residual, weight, out, residual_out; all-reduce:
    x, out; None where absent): their byte spans serve the per-call pointer checks, x's layout the staging
    copy (`x_layout` gives a chunk's own)."""

    __slots__ = ("fallback", "rows", "spans", "x_bytes", "align", "in_place", "stage_x", "x_layout", "quant",
                 "q_spans", "q_align", "chunks", "pitches")

    def __init__(self, spec: KernelSpec, device: int, grid: int, fixed: dict[str, Any], tensors: Sequence[Any],
                 rows: int, in_place: bool = False, quant: Any = None, q_tensors: Sequence[Any] = (),
                 shared_mem: int = 0, x_layout: Optional[tuple[int, int, int]] = None) -> None:
        super().__init__(spec, device, grid, fixed, shared_mem)
        self._describe(tensors, rows, fallback=False, in_place=in_place, quant=quant, q_tensors=q_tensors)
        if x_layout is not None:
            self.x_layout = x_layout

    @classmethod
    def fallback_plan(cls, tensors: Sequence[Any], rows: int, quant: Any = None, q_tensors: Sequence[Any] = ()) -> "CallPlan":
        plan = cls.__new__(cls)
        plan._describe(tensors, rows, fallback=True, in_place=True, quant=quant, q_tensors=q_tensors)
        return plan

    @classmethod
    def chunked_plan(cls, tensors: Sequence[Any], rows: int, in_place: bool, quant: Any, q_tensors: Sequence[Any],
                     chunks: tuple[tuple[int, "CallPlan"], ...], pitches: tuple[int, int, int, int, int]) -> "CallPlan":
        """A call over more than the staging buffer holds: `chunks` are (first row, plan) launched in order;
        `pitches` the bytes from one row to the next of x, residual, out, residual_out and the scales."""
        plan = cls.__new__(cls)
        plan._describe(tensors, rows, fallback=False, in_place=in_place, quant=quant, q_tensors=q_tensors)
        plan.chunks, plan.pitches = chunks, pitches
        return plan

    def _describe(self, tensors: Sequence[Any], rows: int, *, fallback: bool, in_place: bool, quant: Any,
                  q_tensors: Sequence[Any]) -> None:
        from .validate import row_stride

        x = tensors[0]
        self.fallback, self.rows, self.in_place, self.align = fallback, rows, in_place, DEFAULT_PACK
        self.quant = quant
        self.q_align = DEFAULT_PACK // x.element_size() // (1 if quant is None else quant.out_ratio)
        self.q_spans = tuple(span_bytes(t) for t in q_tensors)
        self.spans = tuple(span_bytes(t) for t in tensors)
        self.x_bytes = self.spans[0]
        cols = x.shape[-1] if x.dim() else 1
        # (rows, row bytes, row stride bytes) of x, for the staging copy; stage_x: copy even under capture
        self.x_layout = (x.numel() // cols if cols else 0, cols * x.element_size(),
                         ((row_stride(x) if x.dim() else 1) or cols) * x.element_size())
        self.stage_x = False
        self.chunks: Optional[tuple[tuple[int, CallPlan], ...]] = None
        self.pitches = (x.element_size(), 0, 0, 0, 0)

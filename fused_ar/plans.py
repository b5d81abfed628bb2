"""Launch plans: what a call needs that depends only on its key (op, shapes, dtypes, strides, devices, path,
environment), validated and built once; per call only pointers, alignment, aliasing and eps are checked,
and only the changing fields of a prebuilt argument buffer are written before one ctypes launch.

A plan never validates: callers run the full checks of fused_ar.validate when they build one, and the
per-call checks each time (`rmsnorm_pointers_ok`, `allreduce_pointers_ok`, `plain_eps`), falling back to the
full checks (which raise the right error) when a per-call check fails.
"""

from __future__ import annotations

import ctypes
import math
import threading
from typing import Any, Callable, Optional

from .kernels import Arg, KernelDef, kernel_def
from .launch import function
from .runtime import current_runtime, pack_args, stream_arg
from .spec import DEFAULT_PACK, KernelSpec

_CTYPES = {Arg.PTR: ctypes.c_void_p, Arg.I32: ctypes.c_int32, Arg.I64: ctypes.c_int64, Arg.F32: ctypes.c_float}
_structs: dict[KernelDef, type] = {}


def _struct_for(kdef: KernelDef) -> type:
    """A ctypes Structure laid out like the kernel's C parameters, one field per parameter."""
    struct = _structs.get(kdef)
    if struct is None:
        fields = [(name, _CTYPES[kind]) for name, kind in kdef.params]
        struct = _structs[kdef] = type(f"{kdef.op.value}_args", (ctypes.Structure,), {"_fields_": fields})
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


class LaunchPlan:
    """A kernel ready to launch on one device with a fixed grid and the arguments that do not change."""

    __slots__ = ("spec", "device", "grid", "block", "fn", "kdef", "fixed", "launch_raw", "_local")

    def __init__(self, spec: KernelSpec, device: int, grid: int, fixed: dict[str, Any]) -> None:
        self.spec, self.device, self.grid, self.block = spec, device, grid, spec.block
        self.kdef = kernel_def(spec.op)
        self.fixed = dict(fixed)
        pack_args(self.kdef, [self.fixed.get(n, 0) for n, _ in self.kdef.params])  # range-checks the fixed values
        runtime = current_runtime()
        self.fn = ctypes.c_void_p(runtime.function_pointer(function(spec, device)))
        self.launch_raw = runtime.launch_raw
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
            self.launch_raw(self.fn, self.grid, self.block, buf.address, stream_arg(stream))


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
    caller then runs the full checks, which say what is wrong)."""
    return (x.shape, x.dtype, x.stride(), x.device, residual.shape, residual.dtype, residual.stride(), residual.device,
            weight.shape, weight.dtype, weight.stride(), weight.device,
            None if out is None else (out.shape, out.dtype, out.stride(), out.device),
            None if residual_out is None else (residual_out.shape, residual_out.dtype, residual_out.stride(),
                                               residual_out.device))


def rmsnorm_pointers_ok(size: int, weight_size: int, x: Any, residual: Any, weight: Any, out: Any,
                        residual_out: Any) -> bool:
    """Per call: every pointer 16-byte aligned, each given output (`size` bytes, as x) disjoint from the
    inputs and the other output. Written out, not looped: this runs on every eager call."""
    xp, rp, wp = x.data_ptr(), residual.data_ptr(), weight.data_ptr()
    mask = xp | rp | wp
    op = None
    if out is not None:
        op = out.data_ptr()
        if not ((op + size <= xp or xp + size <= op) and (op + size <= rp or rp + size <= op)
                and (op + size <= wp or wp + weight_size <= op)):
            return False
        mask |= op
    if residual_out is not None:
        rop = residual_out.data_ptr()
        if not ((rop + size <= xp or xp + size <= rop) and (rop + size <= rp or rp + size <= rop)
                and (rop + size <= wp or wp + weight_size <= rop)):
            return False
        if op is not None and not (op + size <= rop or rop + size <= op):
            return False
        mask |= rop
    return not mask % DEFAULT_PACK


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


def nbytes(t: Any) -> int:
    return t.numel() * t.element_size()


class CallPlan(LaunchPlan):
    """A communicator call's plan: a kernel launch, or the fallback (`fallback`, no kernel), with the byte
    sizes its per-call pointer checks need."""

    __slots__ = ("fallback", "torch_epilogue", "rows", "x_bytes", "weight_bytes")

    def __init__(self, spec: KernelSpec, device: int, grid: int, fixed: dict[str, Any], x: Any,
                 weight: Optional[Any], rows: int) -> None:
        super().__init__(spec, device, grid, fixed)
        self._describe(x, weight, rows, fallback=False, torch_epilogue=False)

    @classmethod
    def fallback_plan(cls, x: Any, weight: Optional[Any], rows: int, torch_epilogue: bool = False) -> "CallPlan":
        plan = cls.__new__(cls)
        plan._describe(x, weight, rows, fallback=True, torch_epilogue=torch_epilogue)
        return plan

    def _describe(self, x: Any, weight: Optional[Any], rows: int, *, fallback: bool, torch_epilogue: bool) -> None:
        self.fallback, self.torch_epilogue, self.rows = fallback, torch_epilogue, rows
        self.x_bytes, self.weight_bytes = nbytes(x), 0 if weight is None else nbytes(weight)

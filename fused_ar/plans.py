"""Launch plans: what a call needs that depends only on its key (op, shapes, dtypes, strides, devices, path,
environment), validated and built once; per call only pointers, alignment, aliasing and eps are checked,
and only the changing fields of a prebuilt argument buffer are written before one ctypes launch.

A plan never validates: callers run the full checks of fused_ar.validate when they build one, and the
per-call checks each time (`aligned`, `disjoint`, `plain_eps`), falling back to the full checks (which
raise the right error) when a per-call check fails.
"""

from __future__ import annotations

import ctypes
import math
import threading
from typing import Any, Optional, Sequence

from .kernels import Arg, KernelDef, kernel_def
from .launch import function
from .runtime import current_runtime, pack_args
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
        self.address = ctypes.addressof(self.pointers)


class LaunchPlan:
    """A kernel ready to launch on one device with a fixed grid and the arguments that do not change."""

    __slots__ = ("spec", "device", "grid", "block", "fn", "kdef", "fixed", "launch_raw", "_local")

    def __init__(self, spec: KernelSpec, device: int, grid: int, fixed: dict[str, Any]) -> None:
        self.spec, self.device, self.grid, self.block = spec, device, grid, spec.block
        self.kdef = kernel_def(spec.op)
        self.fixed = dict(fixed)
        pack_args(self.kdef, [self.fixed.get(n, 0) for n, _ in self.kdef.params])  # range-checks the fixed values
        runtime = current_runtime()
        self.fn = runtime.function_pointer(function(spec, device))
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
            self.launch_raw(self.fn, self.grid, self.block, buf.address, stream)


def raw_stream(device: int) -> int:
    """torch's current stream on `device` as a raw handle (one C call; what Inductor's generated code uses)."""
    import torch

    getter = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if getter is not None:
        return getter(device)
    return torch.cuda.current_stream(device).cuda_stream


def is_capturing() -> bool:
    import torch

    check = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)
    return bool(check()) if check is not None else torch.cuda.is_current_stream_capturing()


def aligned(*pointers: int, to: int = DEFAULT_PACK) -> bool:
    mask = 0
    for p in pointers:
        mask |= p
    return not mask % to


def disjoint(a: int, a_bytes: int, b: int, b_bytes: int) -> bool:
    return a + a_bytes <= b or b + b_bytes <= a


def plain_eps(eps: Any) -> bool:
    """True for what check_eps accepts unchanged: a positive finite Python float."""
    return type(eps) is float and 0.0 < eps < math.inf


def meta(t: Any) -> tuple:
    """What a plan key holds of a tensor (raises AttributeError for a non-tensor: the caller validates)."""
    return t.shape, t.dtype, t.stride(), t.device


def nbytes(t: Any) -> int:
    return t.numel() * t.element_size()


def same_key(values: Sequence[Optional[Any]]) -> tuple:
    return tuple(None if v is None else meta(v) for v in values)


class CallPlan(LaunchPlan):
    """A communicator call's plan: a kernel launch, or the fallback (`fallback`, no kernel). `tensors` are
    the call's inputs then its outputs (None where not given); per call, every pointer must be 16-byte
    aligned and every given output disjoint from the inputs and the other outputs."""

    __slots__ = ("fallback", "torch_epilogue", "rows", "x_bytes", "sizes", "n_inputs")

    def __init__(self, spec: KernelSpec, device: int, grid: int, fixed: dict[str, Any], tensors: Sequence[Any],
                 n_inputs: int, rows: int) -> None:
        super().__init__(spec, device, grid, fixed)
        self._describe(tensors, n_inputs, rows, fallback=False, torch_epilogue=False)

    @classmethod
    def fallback_plan(cls, tensors: Sequence[Any], n_inputs: int, rows: int, torch_epilogue: bool = False) -> "CallPlan":
        plan = cls.__new__(cls)
        plan._describe(tensors, n_inputs, rows, fallback=True, torch_epilogue=torch_epilogue)
        return plan

    def _describe(self, tensors: Sequence[Any], n_inputs: int, rows: int, *, fallback: bool,
                  torch_epilogue: bool) -> None:
        self.fallback, self.torch_epilogue, self.rows, self.n_inputs = fallback, torch_epilogue, rows, n_inputs
        self.sizes = tuple(None if t is None else nbytes(t) for t in tensors)
        self.x_bytes = self.sizes[0]

    def call_ok(self, tensors: Sequence[Any]) -> bool:
        ptrs = [None if t is None else t.data_ptr() for t in tensors]
        given = [p for p in ptrs if p is not None]
        if not aligned(*given):
            return False
        sizes = self.sizes
        for i in range(self.n_inputs, len(ptrs)):
            p = ptrs[i]
            if p is None:
                continue
            for j in range(i):
                if ptrs[j] is not None and not disjoint(p, sizes[i], ptrs[j], sizes[j]):
                    return False
        return True

"""The runtime interface a backend implements (load, launch, memory, IPC), and what every backend shares.

Shared here: argument packing by C layout, the launch itself (one ctypes call into the driver's C launch
function with a `void**` of parameter addresses: the hot path creates no binding objects). The vendor
facades (fused_ar.backends.nvidia.runtime, fused_ar.backends.amd.runtime) only load code objects, fetch
functions and name the driver's C functions; fused_ar.backends picks one. This module names no vendor.
"""

from __future__ import annotations

import ctypes
from abc import ABC, abstractmethod
from typing import Any, Mapping, Optional, Sequence

from .compiler import CompiledKernel
from ..errors import DeviceError, InputError
from .kernels import Arg, KernelDef
from .spec import Platform

_CTYPES = {Arg.PTR: ctypes.c_void_p, Arg.I32: ctypes.c_int32, Arg.I64: ctypes.c_int64, Arg.F32: ctypes.c_float}
_INT_RANGE = {Arg.I32: (-(2**31), 2**31 - 1), Arg.I64: (-(2**63), 2**63 - 1), Arg.PTR: (0, 2**64 - 1)}


def pack_args(kdef: KernelDef, values: Sequence[Any]) -> list[ctypes._SimpleCData]:
    """Python values -> ctypes values typed exactly as the kernel's C parameters (a bare Python float
    would travel as a double, a bare int as a pointer: both silently wrong)."""
    if len(values) != len(kdef.params):
        raise InputError(f"{kdef.op.value} takes {len(kdef.params)} arguments "
                         f"({', '.join(n for n, _ in kdef.params)}), got {len(values)}")
    packed = []
    for (name, kind), value in zip(kdef.params, values):
        if kind is Arg.F32:
            packed.append(ctypes.c_float(float(value)))
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(f"argument {name} of {kdef.op.value} must be an int ({kind.value}), got {value!r}")
        lo, hi = _INT_RANGE[kind]
        if not lo <= value <= hi:
            raise InputError(f"argument {name}={value} of {kdef.op.value} does not fit {kind.value}")
        packed.append(_CTYPES[kind](value))
    return packed


def check_grid(kdef: KernelDef, grid: int, values: Mapping[str, Any]) -> None:
    """Refuses a grid larger than the kernel's `grid_bound` parameter (its blocks take a first row untested:
    a block past the last row would read and write outside the tensors)."""
    bound = kdef.grid_bound
    if bound is not None and grid > values.get(bound, 0):
        raise InputError(f"{kdef.op.value} launched with {grid} blocks for {bound}={values.get(bound, 0)}: "
                         f"at most one block a row")


def c_function(library: Any, name: str, argtypes: Optional[Sequence[Any]]) -> Any:
    """A C function of `library` returning an int status. Without `argtypes` ctypes converts nothing by
    declaration (0.6 us a call instead of 1.5 us for eleven arguments): callers then pass pointers as
    c_void_p objects and small non-negative ints for unsigned ints, which the x86-64 and AArch64 ABIs pass
    alike."""
    fn = getattr(library, name)
    if argtypes is not None:
        fn.argtypes = list(argtypes)
    fn.restype = ctypes.c_int
    return fn


_streams: dict[int, Optional[ctypes.c_void_p]] = {0: None}


def stream_arg(stream: int) -> Optional[ctypes.c_void_p]:
    """A raw stream handle as the launch takes it (0, the legacy default stream, as NULL), made once per
    stream."""
    arg = _streams.get(stream)
    if arg is None and stream:
        arg = _streams[stream] = ctypes.c_void_p(stream)
    return arg


class Runtime(ABC):
    platform: Platform

    @abstractmethod
    def load(self, kernel: CompiledKernel, name: str, device: int) -> Any:
        """The launchable function `name` of `kernel` on `device` (memoize in the caller)."""

    @abstractmethod
    def function_pointer(self, function: Any) -> int:
        """The C handle (CUfunction / hipFunction_t) behind what `load` returned."""

    @property
    @abstractmethod
    def c_launch(self) -> Any:
        """The driver's C launch function, cuLaunchKernel or hipModuleLaunchKernel (one C signature:
        function, grid xyz, block xyz, shared memory bytes, stream, void** kernelParams, void** extra),
        through c_function without argtypes."""

    @abstractmethod
    def status_name(self, status: int) -> str:
        """The driver's name for a status code (CUDA_ERROR_..., hipError...)."""

    def supports_pdl(self, arch: str) -> bool:
        """Whether kernels for `arch` can be launched with programmatic dependent launch (start while the
        previous kernel on the stream finishes; the kernels wait for it before touching memory)."""
        return False

    def launch_pdl(self, fn: ctypes.c_void_p, grid: int, block: int, params: ctypes.c_void_p,
                   stream: Optional[ctypes.c_void_p], shared_mem: int) -> int:
        """launch_raw with programmatic dependent launch: the driver's status. Only where supports_pdl."""
        raise NotImplementedError(f"{type(self).__name__} has no programmatic dependent launch")

    def launch_raw(self, fn: ctypes.c_void_p, grid: int, block: int, params: ctypes.c_void_p,
                   stream: Optional[ctypes.c_void_p], shared_mem: int = 0, pdl: bool = False) -> None:
        """One launch: `fn` the C function handle, `params` the address of a void* array of argument
        addresses, `stream` from stream_arg (None: the legacy default stream); `pdl` (where supports_pdl):
        with programmatic dependent launch."""
        if pdl:
            status = self.launch_pdl(fn, grid, block, params, stream, shared_mem)
        else:
            status = self.c_launch(fn, grid, 1, 1, block, 1, 1, shared_mem, stream, params, None)
        if status:
            raise DeviceError(f"kernel launch (grid {grid}, block {block}) failed: {self.status_name(status)}")

    def launch(self, function: Any, grid: int, block: int, args: Sequence[ctypes._SimpleCData], stream: int,
               shared_mem: int = 0) -> None:
        """Enqueue one launch of `function` with typed `args` (pack_args) on `stream` (a raw stream handle,
        e.g. torch's `cuda_stream`)."""
        pointers = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
        self.launch_raw(ctypes.c_void_p(self.function_pointer(function)), grid, block,
                        ctypes.c_void_p(ctypes.addressof(pointers)), stream_arg(stream), shared_mem)

    # -- memory the communicator owns (never torch's caching allocator: its blocks cannot be exported) --
    @abstractmethod
    def alloc(self, nbytes: int, device: int, uncached: bool = False) -> int:
        """Device memory, zeroed; `uncached` (AMD: fine-grained, uncached; CUDA: ignored) for signal flags."""

    @abstractmethod
    def free(self, ptr: int, device: int) -> None: ...

    @abstractmethod
    def copy_to_device(self, ptr: int, data: bytes, device: int) -> None:
        """Synchronous host-to-device copy (small tables)."""

    @abstractmethod
    def copy_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        """Device-to-device copy enqueued on `stream`."""

    @abstractmethod
    def copy_rows(self, dst: int, dst_pitch: int, src: int, src_pitch: int, row_bytes: int, rows: int,
                  stream: int) -> None:
        """Device-to-device copy of `rows` rows of `row_bytes`, `src_pitch` / `dst_pitch` bytes apart, enqueued
        on `stream` (a strided x into the contiguous staging buffer)."""

    @abstractmethod
    def read_bytes(self, ptr: int, nbytes: int, device: int) -> bytes:
        """Device memory, read synchronously (error words, signal buffers)."""

    def read_u32(self, ptr: int, device: int) -> int:
        return int.from_bytes(self.read_bytes(ptr, 4, device), "little")

    @abstractmethod
    def alloc_host_mapped(self, nbytes: int, device: int) -> tuple[int, int]:
        """Pinned host memory the device reads and writes, zeroed: (host address, device address)."""

    @abstractmethod
    def free_host(self, host_ptr: int, device: int) -> None: ...

    @abstractmethod
    def allocation_range(self, ptr: int, device: int) -> tuple[int, int]:
        """(base, size) of the device allocation holding `ptr` (an IPC handle covers a whole allocation)."""

    @abstractmethod
    def ipc_handle(self, ptr: int) -> bytes:
        """The 64-byte IPC handle of the allocation starting at `ptr`."""

    @abstractmethod
    def ipc_open(self, handle: bytes, device: int) -> int:
        """Maps a peer process's allocation into this process; returns its address here."""

    @abstractmethod
    def ipc_close(self, ptr: int, device: int) -> None: ...

    @abstractmethod
    def max_active_blocks(self, function: Any, block: int) -> int:
        """Blocks of `function` one multiprocessor (CU) holds at once."""

    @abstractmethod
    def mem_get_info(self, device: int) -> tuple[int, int]:
        """(free, total) device memory in bytes."""


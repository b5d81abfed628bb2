"""CUDA facade over the driver's C API (libcuda, through ctypes): cuLibraryLoadData, cuLibraryGetKernel,
cuLaunchKernel, memory, IPC.

Libraries are context-independent; a function handle is fetched per device in that device's primary
context (the one torch uses), and launches go on the caller's stream. Every call is one ctypes call into
libcuda, which torch has already mapped: no binding layer is imported (cuda-bindings costs about 90 ms to
import, on the first call of a serving process), and the per-call functions create no objects.
"""

from __future__ import annotations

import ctypes
import threading
from contextlib import contextmanager
from functools import cached_property
from typing import Any, Iterator, Optional

from ...jit.compiler import CompiledKernel
from ...errors import DeviceError
from ...jit.runtime import Runtime, c_function, stream_arg
from ...jit.spec import Platform, sm_version


IPC_HANDLE_BYTES = 64  # CU_IPC_HANDLE_SIZE
_MEMORY_DEVICE = 2  # CU_MEMORYTYPE_DEVICE
_MEMHOSTALLOC_PORTABLE = 0x01  # CU_MEMHOSTALLOC_PORTABLE
_MEMHOSTALLOC_DEVICEMAP = 0x02  # CU_MEMHOSTALLOC_DEVICEMAP
_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 0x1  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS


class _Memcpy2D(ctypes.Structure):
    """CUDA_MEMCPY2D of cuda.h, field for field."""

    _fields_ = [("srcXInBytes", ctypes.c_size_t), ("srcY", ctypes.c_size_t), ("srcMemoryType", ctypes.c_int),
                ("srcHost", ctypes.c_void_p), ("srcDevice", ctypes.c_uint64), ("srcArray", ctypes.c_void_p),
                ("srcPitch", ctypes.c_size_t), ("dstXInBytes", ctypes.c_size_t), ("dstY", ctypes.c_size_t),
                ("dstMemoryType", ctypes.c_int), ("dstHost", ctypes.c_void_p), ("dstDevice", ctypes.c_uint64),
                ("dstArray", ctypes.c_void_p), ("dstPitch", ctypes.c_size_t), ("WidthInBytes", ctypes.c_size_t),
                ("Height", ctypes.c_size_t)]


class _LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute of cuda.h: the attribute's id, padding, a 64-byte value union."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int), ("rest", ctypes.c_char * 60)]


class _LaunchConfig(ctypes.Structure):
    """CUlaunchConfig of cuda.h, field for field."""

    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
PDL_MIN_SM = 90  # griddepcontrol (the kernels' wait and release) is sm_90's


class _IpcHandle(ctypes.Structure):
    """CUipcMemHandle: 64 opaque bytes, passed by value."""

    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_BYTES)]


_P = ctypes.c_void_p
_U64 = ctypes.c_uint64
_SIZE = ctypes.c_size_t
# The driver functions this facade calls, with their C parameter types (cuda.h; the _v2 names are what
# the header's macros resolve to). Pointers to out-parameters are passed with byref.
_SIGNATURES: dict[str, Optional[tuple]] = {
    "cuInit": (ctypes.c_uint,),
    "cuGetErrorName": (ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)),
    "cuDeviceGet": (ctypes.POINTER(ctypes.c_int), ctypes.c_int),
    "cuDevicePrimaryCtxRetain": (ctypes.POINTER(_P), ctypes.c_int),
    "cuCtxPushCurrent_v2": (_P,),
    "cuCtxPopCurrent_v2": (ctypes.POINTER(_P),),
    "cuCtxSynchronize": (),
    "cuLibraryLoadData": (ctypes.POINTER(_P), ctypes.c_char_p, _P, _P, ctypes.c_uint, _P, _P, ctypes.c_uint),
    "cuLibraryGetKernel": (ctypes.POINTER(_P), _P, ctypes.c_char_p),
    "cuKernelGetFunction": (ctypes.POINTER(_P), _P),
    "cuFuncLoad": (_P,),
    "cuOccupancyMaxActiveBlocksPerMultiprocessor": (ctypes.POINTER(ctypes.c_int), _P, ctypes.c_int, _SIZE),
    "cuMemAlloc_v2": (ctypes.POINTER(_U64), _SIZE),
    "cuMemsetD8_v2": (_U64, ctypes.c_ubyte, _SIZE),
    "cuMemFree_v2": (_U64,),
    "cuMemcpyHtoD_v2": (_U64, ctypes.c_char_p, _SIZE),
    "cuMemcpyDtoH_v2": (_P, _U64, _SIZE),
    "cuMemHostAlloc": (ctypes.POINTER(_P), _SIZE, ctypes.c_uint),
    "cuMemHostGetDevicePointer_v2": (ctypes.POINTER(_U64), _P, ctypes.c_uint),
    "cuMemFreeHost": (_P,),
    "cuMemGetAddressRange_v2": (ctypes.POINTER(_U64), ctypes.POINTER(_SIZE), _U64),
    "cuIpcGetMemHandle": (ctypes.POINTER(_IpcHandle), _U64),
    "cuIpcOpenMemHandle_v2": (ctypes.POINTER(_U64), _IpcHandle, ctypes.c_uint),
    "cuIpcCloseMemHandle": (_U64,),
    "cuMemGetInfo_v2": (ctypes.POINTER(_SIZE), ctypes.POINTER(_SIZE)),
}
DRIVER_LIBRARY = "libcuda.so.1"


class CudaRuntime(Runtime):
    platform = Platform.CUDA

    def __init__(self) -> None:
        self._libraries: dict[bytes, Any] = {}  # code -> CUlibrary, kept alive (with its code) for the process
        self._contexts: dict[int, ctypes.c_void_p] = {}  # device -> retained primary context (torch's)
        self._pdl_configs = threading.local()  # (grid, block, shared memory) -> this thread's CUlaunchConfig
        self._call("cuInit", 0)

    @cached_property
    def _libcuda(self) -> Any:
        try:
            return ctypes.CDLL(DRIVER_LIBRARY)  # torch has mapped it already: the same handle
        except OSError as exc:
            raise DeviceError(f"the CUDA driver ({DRIVER_LIBRARY}) cannot be loaded: {exc}") from exc

    @cached_property
    def _functions(self) -> dict[str, Any]:
        found = {}
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(self._libcuda, name, None)
            if fn is not None:  # cuFuncLoad is CUDA 12.4+
                found[name] = c_function(self._libcuda, name, argtypes)
        return found

    def _call(self, name: str, *args: Any, what: str = "") -> None:
        status = self._functions[name](*args)
        if status:
            raise DeviceError(f"{what or name} failed: {self.status_name(status)}")

    @contextmanager
    def _in(self, device: int) -> Iterator[None]:
        """Makes `device`'s primary context current for driver calls, whatever torch has initialized."""
        ctx = self._contexts.get(device)
        if ctx is None:
            dev, ctx = ctypes.c_int(), ctypes.c_void_p()
            self._call("cuDeviceGet", ctypes.byref(dev), device)
            self._call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
            self._contexts[device] = ctx
        self._call("cuCtxPushCurrent_v2", ctx)
        try:
            yield
        finally:
            self._call("cuCtxPopCurrent_v2", ctypes.byref(ctypes.c_void_p()))

    def load(self, kernel: CompiledKernel, name: str, device: int) -> int:
        library = self._libraries.get(kernel.code)
        if library is None:
            library = ctypes.c_void_p()
            # the bytes object is the dict's key: it outlives the library that may read it lazily
            self._call("cuLibraryLoadData", ctypes.byref(library), kernel.code, None, None, 0, None, None, 0)
            self._libraries[kernel.code] = library
        handle, fn = ctypes.c_void_p(), ctypes.c_void_p()
        self._call("cuLibraryGetKernel", ctypes.byref(handle), library, kernel.symbol(name).encode(),
                   what=f"cuLibraryGetKernel({name})")
        with self._in(device):
            self._call("cuKernelGetFunction", ctypes.byref(fn), handle, what=f"cuKernelGetFunction({name})")
            # Load now, not at the first launch: a lazy load may wait for the whole context, and ranks
            # emulated in one process have kernels spinning for each other in it.
            if "cuFuncLoad" in self._functions:
                self._call("cuFuncLoad", fn, what=f"cuFuncLoad({name})")
        return int(fn.value)

    def function_pointer(self, function: Any) -> int:
        return int(function)

    @cached_property
    def c_launch(self) -> Any:
        return c_function(self._libcuda, "cuLaunchKernel", None)

    @cached_property
    def _c_launch_ex(self) -> Optional[Any]:
        # CUDA 12's; an older driver launches every kernel without PDL
        return c_function(self._libcuda, "cuLaunchKernelEx", None) if hasattr(self._libcuda, "cuLaunchKernelEx") else None

    def supports_pdl(self, arch: str) -> bool:
        return sm_version(arch) >= PDL_MIN_SM and self._c_launch_ex is not None

    def launch_pdl(self, fn: ctypes.c_void_p, grid: int, block: int, params: ctypes.c_void_p,
                   stream: Optional[ctypes.c_void_p], shared_mem: int) -> int:
        configs = self._pdl_configs.__dict__
        found = configs.get((grid, block, shared_mem))
        if found is None:  # one per shape and thread: a launch writes only the stream into it
            attr = _LaunchAttribute(id=_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, value=1)
            config = _LaunchConfig(grid, 1, 1, block, 1, 1, shared_mem, None, ctypes.pointer(attr), 1)
            found = configs[(grid, block, shared_mem)] = (config, ctypes.c_void_p(ctypes.addressof(config)), attr)
        found[0].hStream = stream
        return self._c_launch_ex(found[1], fn, params, None)

    @cached_property
    def _c_copy(self) -> Any:
        return c_function(self._libcuda, "cuMemcpyDtoDAsync_v2",
                          (ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p))

    @cached_property
    def _c_copy_2d(self) -> Any:
        return c_function(self._libcuda, "cuMemcpy2DAsync_v2", (ctypes.POINTER(_Memcpy2D), ctypes.c_void_p))

    def copy_rows(self, dst: int, dst_pitch: int, src: int, src_pitch: int, row_bytes: int, rows: int,
                  stream: int) -> None:
        copy = _Memcpy2D(srcMemoryType=_MEMORY_DEVICE, srcDevice=src, srcPitch=src_pitch, dstMemoryType=_MEMORY_DEVICE,
                         dstDevice=dst, dstPitch=dst_pitch, WidthInBytes=row_bytes, Height=rows)
        status = self._c_copy_2d(ctypes.byref(copy), stream_arg(stream))
        if status:
            raise DeviceError(f"cuMemcpy2DAsync({rows} rows of {row_bytes} bytes) failed: {self.status_name(status)}")

    def status_name(self, status: int) -> str:
        name = ctypes.c_char_p()
        if self._functions["cuGetErrorName"](status, ctypes.byref(name)) == 0 and name.value:
            return name.value.decode()
        return f"CUresult {status}"

    def alloc(self, nbytes: int, device: int, uncached: bool = False) -> int:
        ptr = ctypes.c_uint64()
        with self._in(device):
            self._call("cuMemAlloc_v2", ctypes.byref(ptr), nbytes, what=f"cuMemAlloc({nbytes})")
            self._call("cuMemsetD8_v2", ptr, 0, nbytes)
            self._call("cuCtxSynchronize")
        return int(ptr.value)

    def free(self, ptr: int, device: int) -> None:
        with self._in(device):
            self._call("cuMemFree_v2", ptr)

    def copy_to_device(self, ptr: int, data: bytes, device: int) -> None:
        with self._in(device):
            self._call("cuMemcpyHtoD_v2", ptr, bytes(data), len(data))

    def copy_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        status = self._c_copy(dst, src, nbytes, stream_arg(stream))
        if status:
            raise DeviceError(f"cuMemcpyDtoDAsync({nbytes} bytes) failed: {self.status_name(status)}")

    def read_bytes(self, ptr: int, nbytes: int, device: int) -> bytes:
        buf = (ctypes.c_char * nbytes)()  # a buffer this code owns, written by the driver
        with self._in(device):
            self._call("cuMemcpyDtoH_v2", buf, ptr, nbytes)
        return bytes(buf)

    def alloc_host_mapped(self, nbytes: int, device: int) -> tuple[int, int]:
        host, dev = ctypes.c_void_p(), ctypes.c_uint64()
        with self._in(device):
            self._call("cuMemHostAlloc", ctypes.byref(host), nbytes, _MEMHOSTALLOC_DEVICEMAP | _MEMHOSTALLOC_PORTABLE,
                       what=f"cuMemHostAlloc({nbytes})")
            ctypes.memset(host.value, 0, nbytes)
            self._call("cuMemHostGetDevicePointer_v2", ctypes.byref(dev), host, 0)
        return int(host.value), int(dev.value)

    def free_host(self, host_ptr: int, device: int) -> None:
        with self._in(device):
            self._call("cuMemFreeHost", host_ptr)

    def allocation_range(self, ptr: int, device: int) -> tuple[int, int]:
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        with self._in(device):
            self._call("cuMemGetAddressRange_v2", ctypes.byref(base), ctypes.byref(size), ptr)
        return int(base.value), int(size.value)

    def ipc_handle(self, ptr: int) -> bytes:
        handle = _IpcHandle()
        self._call("cuIpcGetMemHandle", ctypes.byref(handle), ptr)
        return ctypes.string_at(ctypes.addressof(handle), IPC_HANDLE_BYTES)

    def ipc_open(self, handle: bytes, device: int) -> int:
        if len(handle) != IPC_HANDLE_BYTES:
            raise DeviceError(f"IPC handle of {len(handle)} bytes, expected {IPC_HANDLE_BYTES}")
        h, ptr = _IpcHandle(), ctypes.c_uint64()
        ctypes.memmove(ctypes.addressof(h), handle, IPC_HANDLE_BYTES)
        with self._in(device):
            self._call("cuIpcOpenMemHandle_v2", ctypes.byref(ptr), h, _IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
        return int(ptr.value)

    def ipc_close(self, ptr: int, device: int) -> None:
        with self._in(device):
            self._call("cuIpcCloseMemHandle", ptr)

    def max_active_blocks(self, function: Any, block: int) -> int:
        blocks = ctypes.c_int()
        self._call("cuOccupancyMaxActiveBlocksPerMultiprocessor", ctypes.byref(blocks), int(function), block, 0)
        return int(blocks.value)

    def mem_get_info(self, device: int) -> tuple[int, int]:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        with self._in(device):
            self._call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        return int(free.value), int(total.value)

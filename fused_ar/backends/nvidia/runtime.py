"""CUDA facade over cuda-python's driver API: cuLibraryLoadData, cuLibraryGetKernel, cuLaunchKernel.

Libraries are context-independent; a function handle is fetched per device in that device's primary
context (the one torch uses), and launches go on the caller's stream. The per-call functions (launch,
the staging copy) are the driver's C functions called through ctypes, which creates no binding objects.
"""

from __future__ import annotations

import ctypes
from contextlib import contextmanager
from functools import cached_property
from typing import Any, Iterator

from ...jit.compiler import CompiledKernel, checked
from ...errors import DeviceError
from ...jit.runtime import Runtime, c_function, stream_arg
from ...jit.spec import Platform


IPC_HANDLE_BYTES = 64  # CU_IPC_HANDLE_SIZE
_MEMORY_DEVICE = 2  # CU_MEMORYTYPE_DEVICE


class _Memcpy2D(ctypes.Structure):
    """CUDA_MEMCPY2D of cuda.h, field for field."""

    _fields_ = [("srcXInBytes", ctypes.c_size_t), ("srcY", ctypes.c_size_t), ("srcMemoryType", ctypes.c_int),
                ("srcHost", ctypes.c_void_p), ("srcDevice", ctypes.c_uint64), ("srcArray", ctypes.c_void_p),
                ("srcPitch", ctypes.c_size_t), ("dstXInBytes", ctypes.c_size_t), ("dstY", ctypes.c_size_t),
                ("dstMemoryType", ctypes.c_int), ("dstHost", ctypes.c_void_p), ("dstDevice", ctypes.c_uint64),
                ("dstArray", ctypes.c_void_p), ("dstPitch", ctypes.c_size_t), ("WidthInBytes", ctypes.c_size_t),
                ("Height", ctypes.c_size_t)]
DRIVER_LIBRARY = "libcuda.so.1"


class CudaRuntime(Runtime):
    platform = Platform.CUDA

    def __init__(self) -> None:
        from cuda.bindings import driver

        self._driver = driver
        checked(driver.cuInit(0), "cuInit", DeviceError)
        self._libraries: dict[bytes, Any] = {}  # code -> CUlibrary, kept alive for the process
        self._contexts: dict[int, Any] = {}  # device -> retained primary context (the one torch uses)

    @contextmanager
    def _in(self, device: int) -> Iterator[None]:
        """Makes `device`'s primary context current for driver calls, whatever torch has initialized."""
        drv = self._driver
        ctx = self._contexts.get(device)
        if ctx is None:
            dev = checked(drv.cuDeviceGet(device), "cuDeviceGet", DeviceError)
            ctx = self._contexts[device] = checked(drv.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain",
                                                   DeviceError)
        checked(drv.cuCtxPushCurrent(ctx), "cuCtxPushCurrent", DeviceError)
        try:
            yield
        finally:
            checked(drv.cuCtxPopCurrent(), "cuCtxPopCurrent", DeviceError)

    def load(self, kernel: CompiledKernel, name: str, device: int) -> Any:
        drv = self._driver
        library = self._libraries.get(kernel.code)
        if library is None:
            library = checked(drv.cuLibraryLoadData(kernel.code, None, None, 0, None, None, 0),
                              "cuLibraryLoadData", DeviceError)
            self._libraries[kernel.code] = library
        handle = checked(drv.cuLibraryGetKernel(library, kernel.symbol(name).encode()), "cuLibraryGetKernel",
                         DeviceError)
        with self._in(device):
            fn = checked(drv.cuKernelGetFunction(handle), f"cuKernelGetFunction({name})", DeviceError)
            # Load now, not at the first launch: a lazy load may wait for the whole context, and ranks
            # emulated in one process have kernels spinning for each other in it.
            if hasattr(drv, "cuFuncLoad"):
                checked(drv.cuFuncLoad(fn), f"cuFuncLoad({name})", DeviceError)
            return fn

    def function_pointer(self, function: Any) -> int:
        return int(function)

    @cached_property
    def _libcuda(self) -> Any:
        return ctypes.CDLL(DRIVER_LIBRARY)  # already loaded by cuda-bindings: the same handle

    @cached_property
    def c_launch(self) -> Any:
        return c_function(self._libcuda, "cuLaunchKernel", None)

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
        try:
            return self._driver.CUresult(status).name
        except ValueError:
            return f"CUresult {status}"

    def alloc(self, nbytes: int, device: int, uncached: bool = False) -> int:
        drv = self._driver
        with self._in(device):
            ptr = int(checked(drv.cuMemAlloc(nbytes), f"cuMemAlloc({nbytes})", DeviceError))
            checked(drv.cuMemsetD8(drv.CUdeviceptr(ptr), 0, nbytes), "cuMemsetD8", DeviceError)
            checked(drv.cuCtxSynchronize(), "cuCtxSynchronize", DeviceError)
        return ptr

    def free(self, ptr: int, device: int) -> None:
        with self._in(device):
            checked(self._driver.cuMemFree(self._driver.CUdeviceptr(ptr)), "cuMemFree", DeviceError)

    def copy_to_device(self, ptr: int, data: bytes, device: int) -> None:
        with self._in(device):
            checked(self._driver.cuMemcpyHtoD(self._driver.CUdeviceptr(ptr), data, len(data)), "cuMemcpyHtoD",
                    DeviceError)

    def copy_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        status = self._c_copy(dst, src, nbytes, stream_arg(stream))
        if status:
            raise DeviceError(f"cuMemcpyDtoDAsync({nbytes} bytes) failed: {self.status_name(status)}")

    def read_bytes(self, ptr: int, nbytes: int, device: int) -> bytes:
        buf = bytearray(nbytes)
        with self._in(device):
            checked(self._driver.cuMemcpyDtoH(buf, self._driver.CUdeviceptr(ptr), nbytes), "cuMemcpyDtoH",
                    DeviceError)
        return bytes(buf)

    def alloc_host_mapped(self, nbytes: int, device: int) -> tuple[int, int]:
        drv = self._driver
        with self._in(device):
            host = int(checked(drv.cuMemHostAlloc(nbytes, drv.CU_MEMHOSTALLOC_DEVICEMAP | drv.CU_MEMHOSTALLOC_PORTABLE),
                               f"cuMemHostAlloc({nbytes})", DeviceError))
            ctypes.memset(host, 0, nbytes)
            dev = int(checked(drv.cuMemHostGetDevicePointer(host, 0), "cuMemHostGetDevicePointer", DeviceError))
        return host, dev

    def free_host(self, host_ptr: int, device: int) -> None:
        with self._in(device):
            checked(self._driver.cuMemFreeHost(host_ptr), "cuMemFreeHost", DeviceError)

    def allocation_range(self, ptr: int, device: int) -> tuple[int, int]:
        with self._in(device):
            base, size = checked(self._driver.cuMemGetAddressRange(self._driver.CUdeviceptr(ptr)),
                                 "cuMemGetAddressRange", DeviceError)
        return int(base), int(size)

    def ipc_handle(self, ptr: int) -> bytes:
        handle = checked(self._driver.cuIpcGetMemHandle(self._driver.CUdeviceptr(ptr)), "cuIpcGetMemHandle",
                         DeviceError)
        # the struct's 64 bytes through its address: field accessors differ between cuda-bindings releases
        return ctypes.string_at(handle.getPtr(), IPC_HANDLE_BYTES)

    def ipc_open(self, handle: bytes, device: int) -> int:
        drv = self._driver
        if len(handle) != IPC_HANDLE_BYTES:
            raise DeviceError(f"IPC handle of {len(handle)} bytes, expected {IPC_HANDLE_BYTES}")
        h = drv.CUipcMemHandle()
        ctypes.memmove(h.getPtr(), handle, IPC_HANDLE_BYTES)
        with self._in(device):
            flags = drv.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
            return int(checked(drv.cuIpcOpenMemHandle(h, flags), "cuIpcOpenMemHandle", DeviceError))

    def ipc_close(self, ptr: int, device: int) -> None:
        with self._in(device):
            checked(self._driver.cuIpcCloseMemHandle(self._driver.CUdeviceptr(ptr)), "cuIpcCloseMemHandle",
                    DeviceError)

    def max_active_blocks(self, function: Any, block: int) -> int:
        return int(checked(self._driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(function, block, 0),
                           "cuOccupancyMaxActiveBlocksPerMultiprocessor", DeviceError))

    def mem_get_info(self, device: int) -> tuple[int, int]:
        with self._in(device):
            free, total = checked(self._driver.cuMemGetInfo(), "cuMemGetInfo", DeviceError)
        return int(free), int(total)

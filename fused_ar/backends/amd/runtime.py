"""HIP facade over hip-python: hipModuleLoadData, hipModuleGetFunction, hipModuleLaunchKernel, memory, IPC.

Arguments travel in `extra` as the tuple of ctypes values hip-python lays out by C alignment; a module
is loaded per device (HIP modules belong to the current device, chosen with hipSetDevice, not through
torch). Signal memory is fine-grained and uncached (hipExtMallocWithFlags, flag 3). Every call's argument
types are exercised in the CPU tests against the real libamdhip64 (no device: each returns an error status).
"""

from __future__ import annotations

import ctypes
from contextlib import contextmanager
from functools import cached_property
from typing import Any, Iterator

from ...jit.compiler import CompiledKernel, checked
from ...errors import DeviceError
from .compiler import HIP_LIBRARY
from ...jit.runtime import Runtime, c_function, stream_arg
from ...jit.spec import Platform


IPC_HANDLE_BYTES = 64  # HIP_IPC_HANDLE_SIZE


class HipRuntime(Runtime):
    platform = Platform.HIP

    def __init__(self) -> None:
        from hip import hip

        self._hip = hip
        self._modules: dict[tuple[int, bytes], Any] = {}  # kept alive for the process

    def load(self, kernel: CompiledKernel, name: str, device: int) -> Any:
        with self._in(device):
            module = self._modules.get((device, kernel.code))
            if module is None:
                module = checked(self._hip.hipModuleLoadData(kernel.code), "hipModuleLoadData", DeviceError)
                self._modules[(device, kernel.code)] = module
            return checked(self._hip.hipModuleGetFunction(module, kernel.symbol(name).encode()),
                           f"hipModuleGetFunction({name})", DeviceError)

    def function_pointer(self, function: Any) -> int:
        return int(function)

    @cached_property
    def _libhip(self) -> Any:
        return ctypes.CDLL(HIP_LIBRARY)  # the library hip-python opened: the same handle

    @cached_property
    def c_launch(self) -> Any:
        return c_function(self._libhip, "hipModuleLaunchKernel", None)

    @cached_property
    def _c_copy(self) -> Any:
        return c_function(self._libhip, "hipMemcpyAsync", (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                                            ctypes.c_int, ctypes.c_void_p))

    @cached_property
    def _c_copy_2d(self) -> Any:
        return c_function(self._libhip, "hipMemcpy2DAsync", (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                                             ctypes.c_size_t, ctypes.c_size_t, ctypes.c_size_t,
                                                             ctypes.c_int, ctypes.c_void_p))

    def copy_rows(self, dst: int, dst_pitch: int, src: int, src_pitch: int, row_bytes: int, rows: int,
                  stream: int) -> None:
        kind = int(self._hip.hipMemcpyKind.hipMemcpyDeviceToDevice)
        status = self._c_copy_2d(dst, dst_pitch, src, src_pitch, row_bytes, rows, kind, stream_arg(stream))
        if status:
            raise DeviceError(f"hipMemcpy2DAsync({rows} rows of {row_bytes} bytes) failed: {self.status_name(status)}")

    def status_name(self, status: int) -> str:
        try:
            return self._hip.hipError_t(status).name
        except ValueError:
            return f"hipError_t {status}"

    # hipDeviceMallocUncached: flags written by one GPU are seen by its peers without cache flushes.
    _MALLOC_UNCACHED = 3
    _IPC_LAZY_ENABLE_PEER_ACCESS = 1
    _HOST_MALLOC_MAPPED_PORTABLE = 0x2 | 0x1  # hipHostMallocMapped | hipHostMallocPortable

    @contextmanager
    def _in(self, device: int) -> Iterator[None]:
        """Makes `device` current for the calls inside, then restores the caller's device."""
        hip = self._hip
        previous = checked(hip.hipGetDevice(), "hipGetDevice", DeviceError)
        if previous != device:
            checked(hip.hipSetDevice(device), f"hipSetDevice({device})", DeviceError)
        try:
            yield
        finally:
            if previous != device:
                hip.hipSetDevice(previous)

    def alloc(self, nbytes: int, device: int, uncached: bool = False) -> int:
        hip = self._hip
        with self._in(device):
            if uncached:
                ptr = checked(hip.hipExtMallocWithFlags(nbytes, self._MALLOC_UNCACHED), "hipExtMallocWithFlags",
                              DeviceError)
            else:
                ptr = checked(hip.hipMalloc(nbytes), f"hipMalloc({nbytes})", DeviceError)
            checked(hip.hipMemset(ptr, 0, nbytes), "hipMemset", DeviceError)
            checked(hip.hipDeviceSynchronize(), "hipDeviceSynchronize", DeviceError)
        return int(ptr)

    def free(self, ptr: int, device: int) -> None:
        with self._in(device):
            checked(self._hip.hipFree(ptr), "hipFree", DeviceError)

    def copy_to_device(self, ptr: int, data: bytes, device: int) -> None:
        with self._in(device):
            checked(self._hip.hipMemcpyHtoD(ptr, bytearray(data), len(data)), "hipMemcpyHtoD", DeviceError)

    def copy_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        kind = int(self._hip.hipMemcpyKind.hipMemcpyDeviceToDevice)
        status = self._c_copy(dst, src, nbytes, kind, stream_arg(stream))
        if status:
            raise DeviceError(f"hipMemcpyAsync({nbytes} bytes) failed: {self.status_name(status)}")

    def read_bytes(self, ptr: int, nbytes: int, device: int) -> bytes:
        buf = bytearray(nbytes)
        with self._in(device):
            checked(self._hip.hipMemcpyDtoH(buf, ptr, nbytes), "hipMemcpyDtoH", DeviceError)
        return bytes(buf)

    def alloc_host_mapped(self, nbytes: int, device: int) -> tuple[int, int]:
        hip = self._hip
        with self._in(device):
            host = int(checked(hip.hipHostMalloc(nbytes, self._HOST_MALLOC_MAPPED_PORTABLE), f"hipHostMalloc({nbytes})",
                               DeviceError))
            ctypes.memset(host, 0, nbytes)
            dev = int(checked(hip.hipHostGetDevicePointer(host, 0), "hipHostGetDevicePointer", DeviceError))
        return host, dev

    def free_host(self, host_ptr: int, device: int) -> None:
        with self._in(device):
            checked(self._hip.hipHostFree(host_ptr), "hipHostFree", DeviceError)

    def allocation_range(self, ptr: int, device: int) -> tuple[int, int]:
        with self._in(device):
            base, size = checked(self._hip.hipMemGetAddressRange(ptr), "hipMemGetAddressRange", DeviceError)
        return int(base), int(size)

    def ipc_handle(self, ptr: int) -> bytes:
        handle = checked(self._hip.hipIpcGetMemHandle(ptr), "hipIpcGetMemHandle", DeviceError)
        return ctypes.string_at(handle.as_c_void_p(), IPC_HANDLE_BYTES)  # the 64 bytes, not `.reserved`

    def ipc_open(self, handle: bytes, device: int) -> int:
        if len(handle) != IPC_HANDLE_BYTES:
            raise DeviceError(f"IPC handle of {len(handle)} bytes, expected {IPC_HANDLE_BYTES}")
        h = self._hip.hipIpcMemHandle_t()
        ctypes.memmove(h.as_c_void_p(), handle, IPC_HANDLE_BYTES)
        with self._in(device):
            return int(checked(self._hip.hipIpcOpenMemHandle(h, self._IPC_LAZY_ENABLE_PEER_ACCESS),
                               "hipIpcOpenMemHandle", DeviceError))

    def ipc_close(self, ptr: int, device: int) -> None:
        with self._in(device):
            checked(self._hip.hipIpcCloseMemHandle(ptr), "hipIpcCloseMemHandle", DeviceError)

    def max_active_blocks(self, function: Any, block: int) -> int:
        return int(checked(self._hip.hipModuleOccupancyMaxActiveBlocksPerMultiprocessor(function, block, 0),
                           "hipModuleOccupancyMaxActiveBlocksPerMultiprocessor", DeviceError))

    def mem_get_info(self, device: int) -> tuple[int, int]:
        with self._in(device):
            free, total = checked(self._hip.hipMemGetInfo(), "hipMemGetInfo", DeviceError)
        return int(free), int(total)

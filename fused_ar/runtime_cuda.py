"""CUDA facade over cuda-python's driver API: cuLibraryLoadData, cuLibraryGetKernel, cuLaunchKernel.

Libraries are context-independent; a function handle is fetched per device in that device's primary
context (the one torch uses), and launches go on the caller's stream.
"""

from __future__ import annotations

import ctypes
from typing import Any, Sequence

from .compiler import CompiledKernel, checked
from .errors import DeviceError
from .runtime import Runtime
from .spec import Platform


class CudaRuntime(Runtime):
    platform = Platform.CUDA

    def __init__(self) -> None:
        from cuda.bindings import driver

        self._driver = driver
        checked(driver.cuInit(0), "cuInit", DeviceError)
        self._libraries: dict[bytes, Any] = {}  # code -> CUlibrary, kept alive for the process

    def load(self, kernel: CompiledKernel, name: str, device: int) -> Any:
        import torch

        drv = self._driver
        library = self._libraries.get(kernel.code)
        if library is None:
            library = checked(drv.cuLibraryLoadData(kernel.code, None, None, 0, None, None, 0),
                              "cuLibraryLoadData", DeviceError)
            self._libraries[kernel.code] = library
        handle = checked(drv.cuLibraryGetKernel(library, kernel.symbol(name).encode()), "cuLibraryGetKernel",
                         DeviceError)
        with torch.cuda.device(device):
            torch.cuda.init()
            return checked(drv.cuKernelGetFunction(handle), f"cuKernelGetFunction({name})", DeviceError)

    def launch(self, function: Any, grid: int, block: int, args: Sequence[ctypes._SimpleCData], stream: int,
               shared_mem: int = 0) -> None:
        pointers = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
        checked(self._driver.cuLaunchKernel(function, grid, 1, 1, block, 1, 1, shared_mem,
                                            self._driver.CUstream(stream), ctypes.addressof(pointers), 0),
                "cuLaunchKernel", DeviceError)

"""HIP facade over hip-python: hipModuleLoadData, hipModuleGetFunction, hipModuleLaunchKernel.

Arguments travel in `extra` as the tuple of ctypes values hip-python lays out by C alignment; a module
is loaded per device (HIP modules belong to the current device).
"""

from __future__ import annotations

import ctypes
from typing import Any, Sequence

from .compiler import CompiledKernel, checked
from .errors import DeviceError
from .runtime import Runtime
from .spec import Platform


class HipRuntime(Runtime):
    platform = Platform.HIP

    def __init__(self) -> None:
        from hip import hip

        self._hip = hip
        self._modules: dict[tuple[int, bytes], Any] = {}  # kept alive for the process

    def load(self, kernel: CompiledKernel, name: str, device: int) -> Any:
        import torch

        with torch.cuda.device(device):
            module = self._modules.get((device, kernel.code))
            if module is None:
                module = checked(self._hip.hipModuleLoadData(kernel.code), "hipModuleLoadData", DeviceError)
                self._modules[(device, kernel.code)] = module
            return checked(self._hip.hipModuleGetFunction(module, kernel.symbol(name).encode()),
                           f"hipModuleGetFunction({name})", DeviceError)

    def launch(self, function: Any, grid: int, block: int, args: Sequence[ctypes._SimpleCData], stream: int,
               shared_mem: int = 0) -> None:
        checked(self._hip.hipModuleLaunchKernel(function, grid, 1, 1, block, 1, 1, shared_mem,
                                                self._hip.hipStream_t(stream) if stream else None,
                                                None, extra=tuple(args)),
                "hipModuleLaunchKernel", DeviceError)

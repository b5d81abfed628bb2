"""fused_ar: JIT-compiled GPU kernels fusing the tensor-parallel AllReduce with residual add + RMSNorm.

`import fused_ar` is cheap: torch, hip-python and cuda-python load only when a name that needs them is
first used (module-level __getattr__), so serving processes can import it anywhere.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from ._version import __version__

# public name -> module that defines it
_LAZY = {
    "add_rmsnorm": "ops",
    "add_rmsnorm_fp8": "ops",
    "Communicator": "communicator",
    "KernelSpec": "spec",
    "DType": "spec",
    "Op": "spec",
    "compiler_for": "compiler",
    "default_cache": "cache",
    "FusedArError": "errors",
    "InputError": "errors",
    "CompileError": "errors",
    "CompilerUnavailableError": "errors",
    "UnsupportedArchError": "errors",
    "CacheTrustError": "errors",
    "ConfigError": "errors",
    "DeviceError": "errors",
    "NoGpuError": "errors",
    "require_gpu": "validate",
    "device_index": "validate",
    "UnsupportedShapeError": "errors",
    "PeerTimeoutError": "errors",
    "MismatchError": "errors",
    "register_torch_ops": "torch_ops",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fused_ar' has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)

"""The one place that picks a backend: the compiler for an arch, the runtime for torch's build, a device's arch.

Each vendor folder implements fused_ar.jit's interfaces (`Compiler`, `Runtime`): nvidia/ (NVRTC, the CUDA
driver) and amd/ (hiprtc, the HIP runtime, and the offline clang check and ISA rules). Vendor modules are
imported here, lazily, and nowhere else in the package: the generic stages ask this module.
"""

from __future__ import annotations

from functools import lru_cache

from ..jit.compiler import Compiler
from ..jit.runtime import Runtime
from ..jit.spec import Platform, platform_of_arch


@lru_cache(maxsize=None)
def compiler_for(arch: str) -> Compiler:
    """NVRTC for sm_XX, hiprtc for gfx...; the compiler object loads its library only when first asked."""
    if platform_of_arch(arch) is Platform.CUDA:
        from .nvidia.compiler import NvrtcCompiler
        return NvrtcCompiler()
    from .amd.compiler import HiprtcCompiler
    return HiprtcCompiler()


def torch_platform() -> Platform:
    """The platform torch was built for: HIP on a ROCm build, else CUDA."""
    import torch

    return Platform.HIP if getattr(torch.version, "hip", None) else Platform.CUDA


@lru_cache(maxsize=None)
def current_runtime() -> Runtime:
    """The driver facade of torch's platform (one per process)."""
    if torch_platform() is Platform.HIP:
        from .amd.runtime import HipRuntime
        return HipRuntime()
    from .nvidia.runtime import CudaRuntime
    return CudaRuntime()


def device_arch(device: int) -> str:
    """The full arch string of a visible GPU: sm_90, or gfx942:sramecc+:xnack- as the driver reports it."""
    import torch

    props = torch.cuda.get_device_properties(device)
    if torch_platform() is Platform.HIP:
        return props.gcnArchName
    return f"sm_{props.major}{props.minor}"

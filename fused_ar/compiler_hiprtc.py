"""hiprtc through hip-python: rendered source -> HSA code object for `--offload-arch=gfx...`.

`hiprtcVersion` is hard-coded in ROCm, so the identity also names the HIP runtime version and the
realpath, size and mtime of libhiprtc and libamd_comgr (the compiler that really runs).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from .compiler import CompiledKernel, Compiler, checked, file_identity, loaded_library, rtc_compile, unavailable
from .render import Source
from .spec import Platform

_BASE_OPTIONS = ("-O3", "-std=c++17")
HIPRTC_LIBRARY = "libhiprtc.so"  # the name hip-python opens


class HiprtcCompiler(Compiler):
    platform = Platform.HIP

    @cached_property
    def _libs(self) -> tuple[Any, Any]:
        try:
            from hip import hip, hiprtc
        except ImportError as exc:
            raise unavailable("gfx targets", "hip-python (pip install 'fused_ar[rocm]')", exc) from exc
        try:
            checked(hiprtc.hiprtcVersion(), "hiprtcVersion")
        except Exception as exc:  # hip-python is there; the ROCm library it opens is not
            raise unavailable("gfx targets", f"hiprtc, the ROCm runtime compiler: hip-python is installed, but "
                              f"{HIPRTC_LIBRARY} is not on the loader's path (install ROCm, or add the directory "
                              f"holding it to LD_LIBRARY_PATH; ROCm 5.x has hiprtc inside libamdhip64.so: add a "
                              f"link named {HIPRTC_LIBRARY} to it)", exc) from exc
        return hip, hiprtc

    @cached_property
    def _identity(self) -> str:
        hip, hiprtc = self._libs
        major, minor = checked(hiprtc.hiprtcVersion(), "hiprtcVersion")
        runtime = checked(hip.hipRuntimeGetVersion(), "hipRuntimeGetVersion")
        libs = [file_identity(loaded_library(name)) for name in ("libhiprtc.so", "libamd_comgr.so")]
        return f"hiprtc-{major}.{minor}-hip{runtime}@" + "@".join(libs)

    def identity(self) -> str:
        return self._identity

    def options(self, arch: str) -> tuple[str, ...]:
        return (f"--offload-arch={arch}",) + _BASE_OPTIONS

    def compile(self, source: Source, arch: str) -> CompiledKernel:
        hiprtc = self._libs[1]
        return rtc_compile(hiprtc, "hiprtc", "Code", source, self.options(arch), arch, self.identity(),
                           lambda prog: hiprtc.hiprtcDestroyProgram(prog.createRef()))

"""hiprtc through hip-python: rendered source -> HSA code object for `--offload-arch=gfx...`.

`hiprtcVersion` is hard-coded in ROCm, so the identity also names the HIP runtime version and the
realpath, size and mtime of libhiprtc and libamd_comgr (the compiler that really runs).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from .compiler import CompiledKernel, Compiler, checked, file_identity, loaded_library, unavailable
from .errors import CompileError
from .render import Source
from .spec import Platform

_BASE_OPTIONS = ("-O3", "-std=c++17")


class HiprtcCompiler(Compiler):
    platform = Platform.HIP

    @cached_property
    def _libs(self) -> tuple[Any, Any]:
        try:
            from hip import hip, hiprtc
            checked(hiprtc.hiprtcVersion(), "hiprtcVersion")
        except Exception as exc:  # no hip-python, or hip-python without ROCm's libraries
            raise unavailable("gfx targets", "hiprtc from ROCm (pip install 'fused_ar[rocm]' on a ROCm machine)", exc) from exc
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
        _, hiprtc = self._libs
        options = self.options(arch)
        prog = checked(hiprtc.hiprtcCreateProgram(source.text.encode(), source.filename.encode(), 0, [], []),
                       "hiprtcCreateProgram")
        try:
            checked(hiprtc.hiprtcAddNameExpression(prog, source.name.encode()), "hiprtcAddNameExpression")
            status = hiprtc.hiprtcCompileProgram(prog, len(options), [o.encode() for o in options])[0]
            log = self._log(hiprtc, prog)
            if int(status) != 0:
                raise CompileError(source.spec, options, log, f"hiprtc {status!r}")
            size = checked(hiprtc.hiprtcGetCodeSize(prog), "hiprtcGetCodeSize")
            if size == 0:
                raise CompileError(source.spec, options, log, "hiprtc produced an empty code object")
            code = bytearray(size)
            checked(hiprtc.hiprtcGetCode(prog, code), "hiprtcGetCode")
            lowered = checked(hiprtc.hiprtcGetLoweredName(prog, source.name.encode()), "hiprtcGetLoweredName")
        finally:
            hiprtc.hiprtcDestroyProgram(prog)
        name = lowered.decode() if isinstance(lowered, bytes) else str(lowered)
        return CompiledKernel(bytes(code), {source.name: name}, log, self.identity(), options, arch)

    @staticmethod
    def _log(hiprtc: Any, prog: Any) -> str:
        size = checked(hiprtc.hiprtcGetProgramLogSize(prog), "hiprtcGetProgramLogSize")
        buf = bytearray(size)
        if size:
            checked(hiprtc.hiprtcGetProgramLog(prog, buf), "hiprtcGetProgramLog")
        return bytes(buf).rstrip(b"\x00").decode(errors="replace")

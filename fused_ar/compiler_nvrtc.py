"""NVRTC through cuda-python (cuda-bindings): rendered source -> CUBIN for a real `sm_XX`.

NVRTC rejects -O3 (ptxas takes it through -Xptxas) and has no default include path, which the
self-contained rendered source does not need.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from .compiler import CompiledKernel, Compiler, checked, file_identity, loaded_library, unavailable
from .errors import CompileError
from .render import Source
from .spec import Platform

_BASE_OPTIONS = ("--std=c++17", "-Xptxas=-O3")


class NvrtcCompiler(Compiler):
    platform = Platform.CUDA

    @cached_property
    def _nvrtc(self) -> Any:
        try:
            from cuda.bindings import nvrtc
            checked(nvrtc.nvrtcVersion(), "nvrtcVersion")
        except Exception as exc:  # missing wheel, missing libnvrtc: both mean "no NVRTC here"
            raise unavailable("sm_XX targets", "NVRTC (pip install 'fused_ar[cuda]')", exc) from exc
        return nvrtc

    def version(self) -> tuple[int, int]:
        return checked(self._nvrtc.nvrtcVersion(), "nvrtcVersion")

    @cached_property
    def _identity(self) -> str:
        major, minor = self.version()
        return f"nvrtc-{major}.{minor}@{file_identity(loaded_library('libnvrtc.so'))}"

    def identity(self) -> str:
        return self._identity

    def options(self, arch: str) -> tuple[str, ...]:
        return (f"--gpu-architecture={arch}",) + _BASE_OPTIONS

    def compile(self, source: Source, arch: str) -> CompiledKernel:
        nvrtc = self._nvrtc
        options = self.options(arch)
        prog = checked(nvrtc.nvrtcCreateProgram(source.text.encode(), source.filename.encode(), 0, [], []),
                       "nvrtcCreateProgram")
        try:
            checked(nvrtc.nvrtcAddNameExpression(prog, source.name.encode()), "nvrtcAddNameExpression")
            status = nvrtc.nvrtcCompileProgram(prog, len(options), [o.encode() for o in options])[0]
            log = self._log(prog)
            if int(status) != 0:
                raise CompileError(source.spec, options, log, f"NVRTC {status!r}")
            size = checked(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
            if size == 0:
                raise CompileError(source.spec, options, log, f"NVRTC produced no CUBIN (arch {arch} must be sm_XX)")
            cubin = b" " * size
            checked(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
            lowered = checked(nvrtc.nvrtcGetLoweredName(prog, source.name.encode()), "nvrtcGetLoweredName")
        finally:
            nvrtc.nvrtcDestroyProgram(prog)
        return CompiledKernel(bytes(cubin), {source.name: lowered.decode()}, log, self.identity(), options, arch)

    def _log(self, prog: Any) -> str:
        size = checked(self._nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        buf = b" " * size
        checked(self._nvrtc.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
        return buf.rstrip(b"\x00").decode(errors="replace")

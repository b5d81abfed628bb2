"""NVRTC through cuda-python (cuda-bindings): rendered source -> CUBIN for a real `sm_XX`.

NVRTC rejects -O3 (ptxas takes it through -Xptxas) and has no default include path, which the
self-contained rendered source does not need.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from ...jit.compiler import (CompiledKernel, Compiler, checked, file_identity, loaded_library, rtc_compile, status_name,
                             unavailable)
from ...errors import UnsupportedArchError
from ...jit.render import Source
from ...jit.spec import Platform

_BASE_OPTIONS = ("--std=c++17", "-Xptxas=-O3")
_PROBE_SOURCE = 'extern "C" __global__ void fa_arch_probe(unsigned int* p) { p[threadIdx.x] = 1u; }\n'


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

    @cached_property
    def supported(self) -> tuple[int, ...]:
        return tuple(checked(self._nvrtc.nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs"))

    def check_arch(self, arch: str) -> None:
        """One line when NVRTC cannot build `arch`: a number it does not list, or a variant (the `a` / `f`
        suffixes) it rejects when asked, which a small test compile finds once per arch."""
        major, minor = self.version()
        number = int(arch.removeprefix("sm_").rstrip("af"))
        if number not in self.supported:
            raise UnsupportedArchError(arch, f"NVRTC {major}.{minor} cannot build {arch}; it builds "
                                       + ", ".join(f"sm_{n}" for n in self.supported))
        if arch.endswith(("a", "f")):
            why = self._refusals.get(arch)
            if why is None:
                why = self._refusals[arch] = self._probe(arch)
            if why:
                raise UnsupportedArchError(arch, f"NVRTC {major}.{minor} cannot build {arch}: {why}")

    @cached_property
    def _refusals(self) -> dict[str, str]:
        return {}

    def _probe(self, arch: str) -> str:
        """"" when NVRTC compiles a small kernel for `arch`, else the first line of its complaint."""
        nvrtc = self._nvrtc
        prog = checked(nvrtc.nvrtcCreateProgram(_PROBE_SOURCE.encode(), b"fa_arch_probe.cu", 0, [], []),
                       "nvrtcCreateProgram")
        try:
            status = nvrtc.nvrtcCompileProgram(prog, 1, [f"--gpu-architecture={arch}".encode()])[0]
            if int(status) == 0:
                return ""
            size = checked(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
            log = bytearray(size)
            if size:
                checked(nvrtc.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
            lines = [ln.strip() for ln in bytes(log).rstrip(b"\x00").decode(errors="replace").splitlines() if ln.strip()]
            return lines[0] if lines else status_name(status)
        finally:
            nvrtc.nvrtcDestroyProgram(prog)

    def compile(self, source: Source, arch: str) -> CompiledKernel:
        self.check_arch(arch)
        # CUBIN (not PTX): only a real sm_XX yields one; rtc_compile rejects an empty image
        return rtc_compile(self._nvrtc, "nvrtc", "CUBIN", source, self.options(arch), arch, self.identity(),
                           self._nvrtc.nvrtcDestroyProgram)

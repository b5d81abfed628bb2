"""NVRTC through cuda-python (cuda-bindings): rendered source -> CUBIN for a real `sm_XX`.

NVRTC rejects -O3 (ptxas takes it through -Xptxas) and has no default include path, which the
self-contained rendered source does not need. The identity that keys the cache names the libnvrtc file
(resolved path, size, mtime): found without loading it where cuda-bindings looks first (the
nvidia-cuda-nvrtc wheel), so a cache hit loads no compiler; elsewhere NVRTC is loaded to ask.
"""

from __future__ import annotations

import site
import sys
from functools import cached_property
from pathlib import Path
from typing import Any, Optional

from ...jit.compiler import (CompiledKernel, Compiler, checked, file_identity, loaded_library, rtc_compile, status_name,
                             unavailable)
from ...errors import CompilerUnavailableError, UnsupportedArchError
from ...jit.render import Source
from ...jit.spec import Platform

_BASE_OPTIONS = ("--std=c++17", "-Xptxas=-O3")
LIBRARY = "libnvrtc.so"


def wheel_library() -> Optional[Path]:
    """The libnvrtc cuda-bindings would load, found without importing or loading anything: one this process
    has mapped already, else the nvidia-cuda-nvrtc wheel's (nvidia/cu*/lib) in the site-packages
    directories, in the order cuda.pathfinder searches them; None otherwise (then NVRTC is loaded to ask)."""
    mapped = loaded_library(LIBRARY)
    if mapped is not None:
        return mapped
    parents = list(site.getsitepackages())
    if site.ENABLE_USER_SITE and site.getusersitepackages():
        parents.insert(1 if sys.prefix != sys.base_prefix else 0, site.getusersitepackages())
    for parent in parents:
        found = sorted(Path(parent).glob(f"nvidia/cu*/lib/{LIBRARY}.[0-9]*"), reverse=True)  # newest CUDA first
        if found:
            return found[0]
    return None
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
        located = wheel_library()
        if located is not None:
            return f"nvrtc@{file_identity(located)}"
        major, minor = self.version()
        return f"nvrtc-{major}.{minor}@{file_identity(loaded_library(LIBRARY))}"

    def _check_loaded(self) -> None:
        """Before compiling under an identity made without loading NVRTC: the library now loaded must be
        the file it named (else a key would name one compiler and hold another's code)."""
        self._nvrtc  # noqa: B018  (loads it)
        located, loaded = wheel_library(), loaded_library(LIBRARY)
        if located is not None and loaded is not None and located.resolve() != loaded.resolve():
            raise CompilerUnavailableError(f"NVRTC was loaded from {loaded}, but the nvidia-cuda-nvrtc wheel's "
                                           f"{located} names the compiler in the cache key: remove the other "
                                           "library from the loader's path (LD_PRELOAD, LD_LIBRARY_PATH) or the wheel")

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
        self._check_loaded()
        # CUBIN (not PTX): only a real sm_XX yields one; rtc_compile rejects an empty image
        return rtc_compile(self._nvrtc, "nvrtc", "CUBIN", source, self.options(arch), arch, self.identity(),
                           self._nvrtc.nvrtcDestroyProgram)

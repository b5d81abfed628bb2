"""The offline check of the AMD path: the same rendered source through a plain clang for gfx targets.

`clang -x hip --offload-arch=gfx942 -nogpulib -nogpuinc --offload-device-only` needs no ROCm, so a
machine without an AMD GPU proves the HIP source compiles; fused_ar.backends.amd.isa inspects the code (DPP, system
scope, scratch, occupancy). Its code objects are real; the cache keys them by this compiler's identity.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from functools import cached_property
from pathlib import Path
from typing import Optional

from ... import env
from ...jit.compiler import CompiledKernel, Compiler, file_identity, unavailable
from ...errors import CompileError
from ...jit.render import Source
from ...jit.spec import Platform

_BASE_OPTIONS = ("-x", "hip", "-nogpulib", "-nogpuinc", "--offload-device-only", "--no-gpu-bundle-output",
                 "-O3", "-std=c++17")


class ClangHipCompiler(Compiler):
    platform = Platform.HIP

    def __init__(self, clang: Optional[str] = None) -> None:
        self._clang_name = clang or env.CLANG.get()

    @cached_property
    def clang(self) -> str:
        path = shutil.which(self._clang_name)
        if path is None:
            raise unavailable("the gfx check", f"{self._clang_name} (apt-get install clang-19 lld-19)",
                              FileNotFoundError(self._clang_name))
        return path

    @cached_property
    def _identity(self) -> str:
        version = subprocess.run([self.clang, "--version"], capture_output=True, text=True, check=True).stdout
        return f"clang:{version.splitlines()[0]}@{file_identity(Path(self.clang))}"

    def identity(self) -> str:
        return self._identity

    def options(self, arch: str) -> tuple[str, ...]:
        return _BASE_OPTIONS + (f"--offload-arch={arch}",)

    def _run(self, source: Source, options: tuple[str, ...], suffix: str) -> tuple[bytes, str]:
        with tempfile.TemporaryDirectory(prefix="fused_ar-clang-") as tmp:
            src, out = Path(tmp) / source.filename, Path(tmp) / f"{source.name}{suffix}"
            src.write_text(source.text)
            proc = subprocess.run([self.clang, *options, str(src), "-o", str(out)], capture_output=True, text=True)
            if proc.returncode != 0 or not out.is_file():
                raise CompileError(source.spec, options, proc.stderr, f"{self.clang} exited {proc.returncode}")
            return out.read_bytes(), proc.stderr

    def compile(self, source: Source, arch: str) -> CompiledKernel:
        options = self.options(arch)
        code, log = self._run(source, options + ("-c",), ".hsaco")
        return CompiledKernel(code, {source.name: source.name}, log, self.identity(), options, arch)

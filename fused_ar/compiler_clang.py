"""The offline check of the AMD path: the same rendered source through a plain clang for gfx targets.

`clang -x hip --offload-arch=gfx942 -nogpulib -nogpuinc --offload-device-only` needs no ROCm, so a
machine without an AMD GPU proves the HIP source compiles and inspects the code (DPP, scratch) with
`disassemble`. Its code objects are real; the cache keys them by this compiler's identity.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from functools import cached_property
from pathlib import Path
from typing import Optional

from . import env
from .compiler import CompiledKernel, Compiler, file_identity, unavailable
from .errors import CompileError
from .render import Source
from .spec import Platform

_BASE_OPTIONS = ("-x", "hip", "-nogpulib", "-nogpuinc", "--offload-device-only", "--no-gpu-bundle-output",
                 "-O3", "-std=c++17", "-Rpass-analysis=kernel-resource-usage")
_SCRATCH = re.compile(r"ScratchSize \[bytes/lane\]: (\d+)")


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

    def compile(self, source: Source, arch: str) -> CompiledKernel:
        options = self.options(arch)
        with tempfile.TemporaryDirectory(prefix="fused_ar-clang-") as tmp:
            src, obj = Path(tmp) / source.filename, Path(tmp) / f"{source.name}.hsaco"
            src.write_text(source.text)
            proc = subprocess.run([self.clang, *options, "-c", str(src), "-o", str(obj)], capture_output=True, text=True)
            if proc.returncode != 0 or not obj.is_file():
                raise CompileError(source.spec, options, proc.stderr, f"{self.clang} exited {proc.returncode}")
            code = obj.read_bytes()
        return CompiledKernel(code, {source.name: source.name}, proc.stderr, self.identity(), options, arch)


def scratch_bytes(kernel: CompiledKernel) -> list[int]:
    """Per-kernel scratch (spill) bytes per lane, as the compiler's resource remarks report them."""
    return [int(n) for n in _SCRATCH.findall(kernel.log)]


def disassemble(kernel: CompiledKernel, objdump: str = "llvm-objdump-19") -> str:
    tool = shutil.which(objdump)
    if tool is None:
        raise FileNotFoundError(f"{objdump} not found (apt-get install llvm-19)")
    with tempfile.NamedTemporaryFile(suffix=".hsaco") as f:
        f.write(kernel.code)
        f.flush()
        arch = kernel.arch.split(":")[0]
        return subprocess.run([tool, "-d", f"--mcpu={arch}", f.name], capture_output=True, text=True, check=True).stdout

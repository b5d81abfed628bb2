"""The compiler interface: `compile(source, arch) -> CompiledKernel`, and what NVRTC and hiprtc share.

Compilers know nothing of the cache (which wraps them) or of launching. Implementations live in the
vendor folders (fused_ar.backends.nvidia: NVRTC; fused_ar.backends.amd: hiprtc and the offline clang
check); fused_ar.backends picks one per arch. This module names no vendor.
"""

from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from ..errors import CompilerUnavailableError
from .render import Source
from .spec import Platform


@dataclass(frozen=True)
class CompiledKernel:
    """A compiled code object with what its cache entry records beside it."""

    code: bytes                 # CUBIN (NVIDIA) or HSA code object (AMD)
    lowered_names: dict[str, str]  # name expression -> symbol in the code object
    log: str
    compiler: str               # the compiler identity that went into the cache key
    options: tuple[str, ...]
    arch: str

    def symbol(self, name: str) -> str:
        return self.lowered_names[name]


class Compiler(ABC):
    platform: Platform

    @abstractmethod
    def identity(self) -> str:
        """Everything about the compiler that can change the bytes it emits (version, library files)."""

    @abstractmethod
    def options(self, arch: str) -> tuple[str, ...]:
        """The ordered options `compile` passes for `arch`; part of the cache key."""

    @abstractmethod
    def compile(self, source: Source, arch: str) -> CompiledKernel:
        """Compile or raise CompileError carrying the spec, options and full log."""

    def check_arch(self, arch: str) -> None:
        """Raises a FusedArError naming `arch` and this compiler when it cannot build for `arch` here
        (CompilerUnavailableError when the compiler itself cannot load)."""
        self.identity()


def loaded_library(fragment: str) -> Optional[Path]:
    """The file of a shared library this process has mapped whose name contains `fragment`."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                if os.path.basename(path).startswith(fragment):
                    return Path(path)
    except OSError:
        pass
    return None


def file_identity(path: Optional[Path]) -> str:
    if path is None:
        return "unknown-file"
    real = Path(os.path.realpath(path))
    st = real.stat()
    return f"{real}:{st.st_size}:{st.st_mtime_ns}"


def checked(result: Any, what: str, error: type[Exception] = RuntimeError) -> Any:
    """Unwraps the (status, *values) tuples of cuda-bindings and hip-python; status 0 means success."""
    status, *values = result if isinstance(result, tuple) else (result,)
    if int(status) != 0:
        raise error(f"{what} failed: {status_name(status)}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)



def plain(exc: BaseException) -> str:
    """A library's error message without Python's byte-string reprs (`'b'libx.so''` -> `libx.so`)."""
    text = re.sub(r"""'?b(['"])(.*?)\1'?""", r"\2", str(exc))
    return text.replace("\\n", " ").strip()


def unavailable(arch: str, need: str, exc: BaseException) -> CompilerUnavailableError:
    return CompilerUnavailableError(f"{arch} need {need}, which cannot be loaded here: {plain(exc)}")


def rtc_compile(api: Any, prefix: str, code: str, source: Source, options: tuple[str, ...], arch: str,
                identity: str, destroy: Callable[[Any], Any]) -> CompiledKernel:
    """The program life cycle NVRTC and hiprtc share, call for call: create, add the kernel's name
    expression, compile, log, code object, lowered name, destroy. `prefix` is 'nvrtc' or 'hiprtc', `code`
    the code-object getter's stem ('CUBIN' or 'Code'); `destroy(prog)` calls the binding's destroy the way
    it takes the program (hiprtc's C function takes a pointer to it). Output buffers are bytearrays this
    function owns (a C API writes into them); everything read from the program is copied before destroy."""
    from ..errors import CompileError

    call = lambda name, *args: checked(getattr(api, prefix + name)(*args), prefix + name)  # noqa: E731
    prog = call("CreateProgram", source.text.encode(), source.filename.encode(), 0, [], [])
    try:
        call("AddNameExpression", prog, source.name.encode())
        status = getattr(api, prefix + "CompileProgram")(prog, len(options), [o.encode() for o in options])[0]
        size = call("GetProgramLogSize", prog)
        log = bytearray(size)
        if size:
            call("GetProgramLog", prog, log)
        log = bytes(log).rstrip(b"\x00").decode(errors="replace")
        if int(status) != 0:
            raise CompileError(source.spec, options, log, f"{prefix} {status_name(status)}")
        size = call(f"Get{code}Size", prog)
        if size == 0:
            raise CompileError(source.spec, options, log, f"{prefix} produced no code object for arch {arch}")
        image = bytearray(size)
        call(f"Get{code}", prog, image)
        lowered = call("GetLoweredName", prog, source.name.encode())
        # bytes (cuda-bindings) or a CStr into the program's memory (hip-python): decoded while it lives
        lowered = lowered.decode()
    except BaseException:
        destroy(prog)  # the first error is the one to report
        raise
    checked(destroy(prog), prefix + "DestroyProgram")
    return CompiledKernel(bytes(image), {source.name: str(lowered)}, log, identity, options, arch)


def status_name(status: Any) -> str:
    return getattr(status, "name", None) or f"status {int(status)}"

"""hiprtc through hip-python: rendered source -> HSA code object for `--offload-arch=gfx...`.

`hiprtcVersion` is hard-coded in ROCm, so the identity names the HIP runtime version and the files that
really compile: the library providing hiprtc (libhiprtc, or libamdhip64 on ROCm 5.x) and the comgr it
loads. A hiprtc that does not know an arch aborts the whole process inside hiprtcCompileProgram, so each
(identity, arch) is first compiled in a child process once, and the verdict is remembered on disk.

    python -m fused_ar.backends.amd.compiler gfx942     # the child: compiles a small kernel for that arch
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import subprocess
import sys
from functools import cached_property
from pathlib import Path
from typing import Any, Optional

from ... import env
from ...jit.compiler import (CompiledKernel, Compiler, checked, file_identity, loaded_library, rtc_compile, status_name,
                       unavailable)
from ...errors import UnsupportedArchError
from ...jit.render import Source
from ...jit.spec import Platform
from ...jit.verdicts import remembered

_BASE_OPTIONS = ("-O3", "-std=c++17")
HIPRTC_LIBRARY = "libhiprtc.so"  # the names hip-python opens
HIP_LIBRARY = "libamdhip64.so"
_COMGR_SONAME = re.compile(rb"libamd_comgr\.so\.[0-9]+")
# What a hiprtc needs for the archs the library targets (AMD's ROCm release notes).
NEEDS = {"gfx90a": "ROCm >= 5.0", "gfx942": "ROCm >= 6.0", "gfx950": "ROCm >= 7.0"}
PROBE_TIMEOUT_S = 120.0
_PROBE_SOURCE = 'extern "C" __global__ void fa_arch_probe(unsigned int* p) { p[threadIdx.x] = 1u; }\n'


def _dladdr_file(function: Any) -> Optional[Path]:
    """The shared object that holds a ctypes function (dladdr)."""

    class DlInfo(ctypes.Structure):
        _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                    ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]

    libc = ctypes.CDLL(None)
    info = DlInfo()
    if not libc.dladdr(ctypes.cast(function, ctypes.c_void_p), ctypes.byref(info)) or not info.dli_fname:
        return None
    return Path(os.path.realpath(info.dli_fname.decode()))


def hiprtc_files() -> tuple[Optional[Path], Optional[Path]]:
    """(the file providing hiprtc, the comgr file it compiles with), as the loader resolves them here.
    comgr is dlopened by hiprtc at its first compile (ROCm 5.x); opening the same soname now, with the same
    search path, maps the very file hiprtc will get."""
    provider = _dladdr_file(ctypes.CDLL(HIPRTC_LIBRARY).hiprtcCreateProgram)
    comgr = loaded_library("libamd_comgr.so")
    if comgr is None and provider is not None:
        soname = _COMGR_SONAME.search(provider.read_bytes())
        if soname is not None:
            try:
                comgr = _dladdr_file(ctypes.CDLL(soname.group().decode()).amd_comgr_get_version)
            except (OSError, AttributeError):
                comgr = None
    return provider, comgr


def comgr_version(comgr: Optional[Path]) -> str:
    """comgr's own version (`amd_comgr_get_version`: 2.4 in ROCm 5.2, 3.0 in ROCm 6.4), or "unknown"."""
    if comgr is None:
        return "unknown"
    try:
        get = ctypes.CDLL(str(comgr)).amd_comgr_get_version
    except (OSError, AttributeError):
        return "unknown"
    major, minor = ctypes.c_size_t(), ctypes.c_size_t()
    get(ctypes.byref(major), ctypes.byref(minor))
    return f"{major.value}.{minor.value}"


class HiprtcCompiler(Compiler):
    platform = Platform.HIP

    def __init__(self) -> None:
        self._verdicts: dict[str, tuple[bool, str]] = {}

    @cached_property
    def _libs(self) -> tuple[Any, Any]:
        try:
            from hip import hip, hiprtc
        except ImportError as exc:
            raise unavailable("gfx targets", "hip-python (pip install 'fused_ar[rocm]')", exc) from exc
        try:
            checked(hiprtc.hiprtcVersion(), "hiprtcVersion")
            checked(hip.hipRuntimeGetVersion(), "hipRuntimeGetVersion")
        except Exception as exc:  # hip-python is there; the ROCm libraries it opens are not
            raise unavailable("gfx targets", f"hiprtc, the ROCm runtime compiler: hip-python is installed, but "
                              f"{HIPRTC_LIBRARY} or {HIP_LIBRARY} is not on the loader's path (install ROCm, or add "
                              f"the directory holding them to LD_LIBRARY_PATH; ROCm 5.x has hiprtc inside "
                              f"{HIP_LIBRARY}: add a link named {HIPRTC_LIBRARY} to it)", exc) from exc
        return hip, hiprtc

    @cached_property
    def _identity(self) -> str:
        hip, hiprtc = self._libs
        major, minor = checked(hiprtc.hiprtcVersion(), "hiprtcVersion")
        runtime = checked(hip.hipRuntimeGetVersion(), "hipRuntimeGetVersion")
        provider, comgr = hiprtc_files()
        return (f"hiprtc-{major}.{minor}-hip{runtime}-comgr{comgr_version(comgr)}@{file_identity(provider)}"
                f"@comgr:{file_identity(comgr)}")

    def identity(self) -> str:
        return self._identity

    def describe(self) -> str:
        """hiprtc's version and file, for messages."""
        provider, _ = hiprtc_files()
        runtime = checked(self._libs[0].hipRuntimeGetVersion(), "hipRuntimeGetVersion")
        return f"hiprtc of HIP {runtime // 10_000_000}.{runtime // 100_000 % 100} ({provider})"

    def options(self, arch: str) -> tuple[str, ...]:
        return (f"--offload-arch={arch}",) + _BASE_OPTIONS

    def check_arch(self, arch: str) -> None:
        """Compiles a small kernel for `arch` in a child process, once per (hiprtc identity, arch) and cache
        directory: a hiprtc that does not know the arch aborts the process it runs in."""
        target = arch.split(":")[0]
        verdict = self._verdicts.get(arch)
        if verdict is None:
            key = hashlib.sha256(f"{self.identity()}\x1f{arch}".encode()).hexdigest()[:24]
            verdict = self._verdicts[arch] = remembered(key, lambda: _probe_in_child(arch),
                                                        {"arch": arch, "compiler": self.identity()}, kind="hiprtc_arch")
        ok, detail = verdict
        if not ok:
            raise UnsupportedArchError(arch, f"{self.describe()} cannot build {arch}: {detail}; {target} needs "
                                             f"{NEEDS.get(target, 'a hiprtc that knows it')}")

    def compile(self, source: Source, arch: str) -> CompiledKernel:
        self.check_arch(arch)
        hiprtc = self._libs[1]
        return rtc_compile(hiprtc, "hiprtc", "Code", source, self.options(arch), arch, self.identity(),
                           lambda prog: hiprtc.hiprtcDestroyProgram(prog.createRef()))


def _probe_in_child(arch: str) -> tuple[bool, str]:
    try:
        done = subprocess.run([sys.executable, "-m", "fused_ar.backends.amd.compiler", arch], capture_output=True,
                              text=True, timeout=PROBE_TIMEOUT_S, env=env.child_environ())
    except subprocess.TimeoutExpired:
        return False, f"the compile did not finish within {PROBE_TIMEOUT_S:g} s"
    if done.returncode == 0:
        return True, f"a test kernel compiled for {arch}"
    how = f"killed by signal {-done.returncode}" if done.returncode < 0 else f"exit status {done.returncode}"
    last = (done.stderr.strip().splitlines() or [""])[-1][:300]
    return False, f"compiling a test kernel ended the compiler's process ({how}{': ' + last if last else ''})"


def _child(arch: str) -> int:
    hiprtc = HiprtcCompiler()._libs[1]
    call = lambda name, *args: checked(getattr(hiprtc, name)(*args), name)  # noqa: E731
    prog = call("hiprtcCreateProgram", _PROBE_SOURCE.encode(), b"fa_arch_probe.hip", 0, [], [])
    try:
        status = hiprtc.hiprtcCompileProgram(prog, 1, [f"--offload-arch={arch}".encode()])[0]
        size = call("hiprtcGetCodeSize", prog) if int(status) == 0 else 0
    finally:
        hiprtc.hiprtcDestroyProgram(prog.createRef())
    if int(status) != 0 or not size:
        print(f"hiprtc: {status_name(status)} for {arch}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1]))

"""Exception types of fused_ar: each carries what the caller needs to act (the offending value, the rule).

This module imports nothing heavy; every other module raises from here.
"""

from __future__ import annotations

from typing import Any, Sequence


class FusedArError(Exception):
    """Base class of every error fused_ar raises on purpose."""


class InputError(FusedArError, ValueError):
    """A tensor or scalar argument breaks a rule of the op; nothing was launched."""


class UnsupportedShapeError(InputError):
    """Valid for the math but outside what the kernels take (row width, alignment): a communicator with a
    device group serves it through its fallback path; single-GPU ops and local groups raise it."""


class ConfigError(FusedArError, ValueError):
    """An environment variable or option holds a value that cannot be used."""


class CompilerUnavailableError(FusedArError, RuntimeError):
    """The compiler an arch needs (NVRTC for sm_XX, hiprtc for gfx...) cannot be loaded here."""


class CompileError(FusedArError, RuntimeError):
    """The runtime compiler rejected a rendered kernel; carries the spec, the options and the full log."""

    def __init__(self, spec: Any, options: Sequence[str], log: str, reason: str = "compilation failed") -> None:
        self.spec = spec
        self.options = tuple(options)
        self.log = log
        super().__init__(f"{reason} for {spec}\noptions: {' '.join(self.options)}\n--- compiler log ---\n{log}")


class UnsupportedArchError(CompileError):
    """The compiler here cannot build for this arch at all (too old, or it does not know it): one line naming
    the arch, the compiler and what is needed; raised before anything is compiled."""

    def __init__(self, arch: str, message: str) -> None:
        self.spec, self.options, self.log, self.arch = None, (), "", arch
        Exception.__init__(self, message)


class CacheTrustError(FusedArError, PermissionError):
    """The kernel cache directory is owned by someone else or writable by others: code is not loaded from it."""


class DeviceError(FusedArError, RuntimeError):
    """A driver call (load, launch) failed; the message names the call and the driver's error."""


class NoGpuError(DeviceError):
    """Something that runs on a GPU was asked for where torch sees none."""


class PeerTimeoutError(FusedArError, RuntimeError):
    """A cross-GPU kernel gave up waiting for peers (FUSED_AR_TIMEOUT_S): `ranks` never arrived. The
    communicator refuses further calls; create a new one."""

    def __init__(self, message: str, ranks: Sequence[int]) -> None:
        self.ranks = tuple(ranks)
        super().__init__(message)


class MismatchError(FusedArError, RuntimeError):
    """Ranks of one group made different calls (op, shape, dtype or path); no data was touched. The
    communicator refuses further calls; create a new one."""

    def __init__(self, message: str, peer: int, mine: str, theirs: str) -> None:
        self.peer, self.mine, self.theirs = peer, mine, theirs
        super().__init__(message)

"""Every environment variable fused_ar reads, declared once: name, type, default, one-line description.

Reading happens on use (never at import), so tests may set and unset variables freely. The README's
table of variables is checked against `markdown_table()` by the test suite.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Generic, Optional, TypeVar

from .errors import ConfigError

T = TypeVar("T")


# Seconds a wait may be given: at least a millisecond (a GPU timer reads in ns; less rounds to no wait)
# and at most a week (the kernels hold the timeout in a 64-bit count of nanoseconds).
SECONDS_RANGE = (1e-3, 7 * 24 * 3600.0)


def _seconds(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("must be a number of seconds") from None
    low, high = SECONDS_RANGE
    if not low <= value <= high:  # NaN fails too
        raise ValueError(f"must be a number of seconds from {low:g} to {high:g}")
    return value


def _bool01(raw: str) -> bool:
    if raw not in ("0", "1"):
        raise ValueError("must be 0 or 1")
    return raw == "1"


def _bytes(raw: str) -> int:
    if not raw.isascii() or not raw.isdigit():
        raise ValueError("must be a byte count: decimal digits, >= 0")
    return int(raw)


def _path(raw: str) -> Path:
    """An absolute path (`~` expanded): a relative one would mean a different directory in every working
    directory the process happens to run in."""
    if "\x00" in raw:
        raise ValueError("must be a path without NUL bytes")
    try:
        path = Path(raw).expanduser()
    except RuntimeError as exc:  # ~user for a user that does not exist, or no home directory
        raise ValueError(str(exc)) from None
    if not path.is_absolute():
        raise ValueError("must be an absolute path (or start with ~)")
    return path


def _xdg_path(raw: str) -> Optional[Path]:
    """The XDG base directory rule: a relative path is invalid and ignored."""
    path = Path(raw)
    return path if path.is_absolute() else None


@dataclass(frozen=True)
class EnvVar(Generic[T]):
    """One environment variable: its name, parser, default and documentation (the one place it is defined)."""

    name: str
    parse: Callable[[str], T]
    default: Optional[T]
    default_doc: str
    doc: str

    def get(self) -> Optional[T]:
        raw = os.environ.get(self.name, "")
        if raw == "":
            return self.default
        try:
            return self.parse(raw)
        except ValueError as exc:
            raise ConfigError(f"environment variable {self.name}={raw!r} is invalid: {exc}") from None


CACHE_DIR: EnvVar[Path] = EnvVar(
    "FUSED_AR_CACHE_DIR", _path, None, "`$XDG_CACHE_HOME/fused_ar`, else `~/.cache/fused_ar`",
    "Directory of the compiled-kernel disk cache.",
)
LOCK_DIR: EnvVar[Path] = EnvVar(
    "FUSED_AR_LOCK_DIR", _path, None, "`$XDG_RUNTIME_DIR/fused_ar-locks`, else `/tmp/fused_ar-locks-$UID`",
    "Node-local directory for the per-kernel build locks (keep it off NFS).",
)
LOCK_TIMEOUT_S: EnvVar[float] = EnvVar(
    "FUSED_AR_LOCK_TIMEOUT_S", _seconds, 600.0, "600",
    "Seconds to wait for another process building the same kernel before raising.",
)
def _paths(raw: str) -> tuple[Path, ...]:
    return tuple(_path(part) for part in raw.split(os.pathsep) if part)


CACHE_PATH: EnvVar[tuple] = EnvVar(
    "FUSED_AR_CACHE_PATH", _paths, (), "unset (no layers)",
    "Read-only cache layers (`warm --into DIR`), colon-separated, read in order after the writable cache; "
    "each owned by root or the current user and writable by neither group nor others.",
)
CLANG: EnvVar[str] = EnvVar(
    "FUSED_AR_CLANG", str, "clang-19", "`clang-19`",
    "clang used by the offline AMD check compiler (`-x hip -nogpulib -nogpuinc`).",
)
ONE_STAGE: EnvVar[bool] = EnvVar(
    "FUSED_AR_1STAGE", _bool01, None, "unset (by size)",
    "Force the one-stage (1) or two-stage (0) kernels on the `auto` path.",
)
ONE_STAGE_MAX_BYTES: EnvVar[int] = EnvVar(
    "FUSED_AR_1STAGE_MAX_BYTES", _bytes, None,
    "the stored thresholds (`bench --write-thresholds`), else the table in `fused_ar/comm/policy.py`",
    "Largest input (bytes per rank) the `auto` path sends through the one-stage kernels.",
)
FALLBACK_MIN_BYTES: EnvVar[int] = EnvVar(
    "FUSED_AR_FALLBACK_MIN_BYTES", _bytes, None, "the stored thresholds (`bench --write-thresholds`), else never",
    "Inputs (bytes per rank) at or over this size take the fallback on the `auto` path, where the group has a "
    "device group; 0 turns the size rule off.",
)
TIMEOUT_S: EnvVar[float] = EnvVar(
    "FUSED_AR_TIMEOUT_S", _seconds, 30.0, "30",
    "Seconds a cross-GPU kernel waits for a peer at a barrier before giving up (never a hang).",
)
PDL: EnvVar[bool] = EnvVar(
    "FUSED_AR_PDL", _bool01, True, "1",
    "Programmatic dependent launch on NVIDIA sm_90 and newer (a kernel starts while the previous one on its "
    "stream finishes, and waits for it before touching memory); 0 launches every kernel plainly. Part of every "
    "call's plan key: a change takes effect at the next call (a graph keeps what it captured). No effect on AMD.",
)
PEER_PROBE: EnvVar[bool] = EnvVar(
    "FUSED_AR_PEER_PROBE", _bool01, True, "1",
    "Probe IPC peer access for real (a child process, once per node and boot, remembered in the cache "
    "directory) before a Communicator uses it; 0 trusts the driver.",
)
ENGINE_PLUGIN: EnvVar[bool] = EnvVar(
    "FUSED_AR_ENGINE_PLUGIN", _bool01, False, "0",
    "1 lets the installed vLLM and SGLang plug-ins replace the engine's custom all-reduce and its fused "
    "all-reduce + RMSNorm with fused_ar's; 0 leaves the engine untouched.",
)
XDG_CACHE_HOME: EnvVar[Path] = EnvVar(
    "XDG_CACHE_HOME", _xdg_path, None, "unset", "Standard base of per-user caches; used when FUSED_AR_CACHE_DIR is unset (a relative value is ignored, as the XDG spec says).",
)
XDG_RUNTIME_DIR: EnvVar[Path] = EnvVar(
    "XDG_RUNTIME_DIR", _xdg_path, None, "unset", "Standard per-user node-local runtime directory; hosts the lock directory (a relative value is ignored).",
)

VARIABLES: tuple[EnvVar, ...] = (CACHE_DIR, CACHE_PATH, LOCK_DIR, LOCK_TIMEOUT_S, CLANG, ONE_STAGE, ONE_STAGE_MAX_BYTES,
                                 FALLBACK_MIN_BYTES, TIMEOUT_S, PDL, PEER_PROBE, ENGINE_PLUGIN, XDG_CACHE_HOME,
                                 XDG_RUNTIME_DIR)


# os.environ.get decodes and re-encodes on every call (about 1 us); a per-call key reads the bytes behind it.
_ENVIRON_BYTES = getattr(os.environ, "_data", None)


def raw_names(*variables: EnvVar) -> tuple[bytes, ...]:
    return tuple(v.name.encode() for v in variables)


def raw_values(names: tuple[bytes, ...]) -> tuple[Optional[bytes], ...]:
    """The variables' values as set, undecoded (None when unset): cheap enough for a per-call key."""
    if _ENVIRON_BYTES is None:
        return tuple(None if (v := os.environ.get(n.decode())) is None else v.encode() for n in names)
    return tuple(map(_ENVIRON_BYTES.get, names))


def cache_dir() -> Path:
    explicit = CACHE_DIR.get()
    if explicit is not None:
        return explicit
    base = XDG_CACHE_HOME.get()
    if base is None:
        try:
            base = Path.home() / ".cache"
        except RuntimeError:
            raise ConfigError(f"no home directory to keep the kernel cache in: set {CACHE_DIR.name}") from None
    return base / "fused_ar"


def lock_dir() -> Path:
    explicit = LOCK_DIR.get()
    if explicit is not None:
        return explicit
    runtime = XDG_RUNTIME_DIR.get()
    if runtime is not None and runtime.is_dir():
        return runtime / "fused_ar-locks"
    return Path("/tmp") / f"fused_ar-locks-{os.getuid()}"


def reserve_rank_queues() -> None:
    """Before CUDA starts, in a process that emulates N ranks on one GPU: a hardware queue per rank stream
    (CUDA_DEVICE_MAX_CONNECTIONS, 8 by default, 32 at most; see Communicator.local_group), unless the user set
    it. Two ranks on one queue wait on each other until FUSED_AR_TIMEOUT_S."""
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")


def child_environ() -> dict[str, str]:
    """This process's environment for a child `python -m fused_ar...`: PYTHONPATH leads with the directory
    holding this very package, so the child imports the same fused_ar (a source tree, an editable install)."""
    here = str(Path(__file__).resolve().parent.parent)
    return dict(os.environ, PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))


def markdown_table() -> str:
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    rows += [f"| `{v.name}` | {v.default_doc} | {v.doc} |" for v in VARIABLES]
    return "\n".join(rows)

"""The open communicators of this process, by integer handle and by group name.

torch ops cannot take Python objects, so an op names its communicator: by the integer `handle` fused_ar
gives each (fused_ar.torch_ops), or by a name stable across processes, such as an engine's group name
(fused_ar.integrations: engines reuse compiled graphs between workers). Communicators enter when built
and leave when closed; the lookups raise InputError naming what was asked for. Imports nothing above it.
"""

from __future__ import annotations

from typing import Any

from ..errors import InputError

_by_handle: dict[int, Any] = {}
_by_name: dict[str, Any] = {}


def register(comm: Any, name: str = "") -> None:
    """Makes `comm` findable by its handle and, when given, by `name` (a later one of that name replaces it)."""
    _by_handle[comm.handle] = comm
    if name:
        _by_name[name] = comm


def unregister(comm: Any) -> None:
    _by_handle.pop(comm.handle, None)
    for name in [n for n, c in _by_name.items() if c is comm]:
        del _by_name[name]


def lookup(handle: int) -> Any:
    comm = _by_handle.get(handle)
    if comm is None:
        raise InputError(f"comm={handle}: no open fused_ar Communicator has this handle (closed, or from "
                         "another process?)")
    return comm


def lookup_name(name: str) -> Any:
    comm = _by_name.get(name)
    if comm is None:
        known = ", ".join(sorted(_by_name)) or "none"
        raise InputError(f"group {name!r}: no open fused_ar Communicator serves it in this process (open: {known})")
    return comm

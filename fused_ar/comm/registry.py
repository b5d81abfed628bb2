"""The open communicators of this process, by integer handle, and engine adapters by group name.

torch ops cannot take Python objects, so an op names what serves it: fused_ar's own ops by the integer
`handle` each Communicator gets (fused_ar.torch_ops); ops placed into an engine's compiled graph by a name
stable across processes, the engine's group name (fused_ar.integrations: engines reuse compiled graphs
between workers). Entries come when built and go when closed. Imports nothing above it.
"""

from __future__ import annotations

from typing import Any, Optional

from ..errors import InputError

_by_handle: dict[int, Any] = {}
_by_name: dict[str, Any] = {}


def register(comm: Any) -> None:
    _by_handle[comm.handle] = comm


def unregister(comm: Any) -> None:
    _by_handle.pop(comm.handle, None)


def lookup(handle: int) -> Any:
    comm = _by_handle.get(handle)
    if comm is None:
        raise InputError(f"comm={handle}: no open fused_ar Communicator has this handle (closed, or from "
                         "another process?)")
    return comm


def register_name(name: str, adapter: Any) -> None:
    """Makes `adapter` findable by `name` (a later one of that name replaces it)."""
    _by_name[name] = adapter


def unregister_name(adapter: Any) -> None:
    for name in [n for n, a in _by_name.items() if a is adapter]:
        del _by_name[name]


def find_name(name: str) -> Optional[Any]:
    """What serves the group `name` in this process, or None (the engine's own path then serves it)."""
    return _by_name.get(name)

"""The small store of remembered verdicts: a probe's (ok, detail) kept under the cache directory.

Shared by the peer-access probe (fused_ar.comm.probe) and hiprtc's arch check (fused_ar.backends.amd):
one JSON file per kind and key in the `probes` state directory, written and read under the trust rules,
one prober at a time behind a file lock. It knows nothing of what is probed.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Optional

from .. import env
from . import trust
from .cache import state_dir
from .locks import default_lock_dir

VERDICT_MAX_BYTES = 4096


def _verdict(verdict: Any) -> Optional[tuple[bool, str]]:
    """(ok, detail) from a stored verdict's JSON, or None when there is none or it is malformed."""
    if not isinstance(verdict, dict) or not isinstance(verdict.get("ok"), bool) or not isinstance(verdict.get("detail"), str):
        return None
    return verdict["ok"], verdict["detail"]


def _stored(name: str) -> Optional[tuple[bool, str]]:
    root = env.cache_dir()
    found = _verdict(trust.json_in(root, ("probes", name), VERDICT_MAX_BYTES, then="probing again"))
    return None if found is None else (found[0], f"{found[1]} (probed earlier, {root / 'probes' / name})")


def remembered(key: str, probe: Callable[[], tuple[bool, str]], extra: Optional[dict] = None,
               kind: str = "peer_access") -> tuple[bool, str]:
    """The verdict of the `kind` probe stored for `key` under the cache directory, else probe() stored
    there; one process probes at a time (the others wait on the lock, then read). A stored verdict is read
    without the lock (it is written whole, by rename), as a kernel cache hit is. A missing, malformed or
    untrusted file is probed again; an unwritable cache only means probing again next time."""
    name = f"{kind}-{key}.json"
    found = _stored(name)
    if found is not None:
        return found
    with default_lock_dir().held(f"probe-{key}", f"probing ({kind})"):
        found = _stored(name)  # another process may have probed while this one waited
        if found is not None:
            return found
        ok, detail = probe()
        try:
            with state_dir("probes", create=True) as (fd, _):
                trust.write_at(fd, name, json.dumps({"ok": ok, "detail": detail, **(extra or {})}).encode())
        except OSError:  # CacheTrustError included: the verdict is simply not remembered
            pass
        return ok, detail

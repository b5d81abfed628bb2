"""Drop-ins for serving engines: vLLM and SGLang plug-ins, registered as Python entry points.

Each adapter translates an engine's class shape, names and conventions into fused_ar's public API and holds
no kernel, policy or cache logic. The engines' modules are imported lazily, inside functions, and only when
the plug-in is switched on (FUSED_AR_ENGINE_PLUGIN=1); off, every entry point returns at once.
"""

from __future__ import annotations

import logging

from .. import env
from ..errors import ConfigError

log = logging.getLogger("fused_ar")

# The engine versions the adapters are written and tested against (README; the test setup installs these).
ENGINE_VERSIONS = {"vllm": "0.34.0", "sglang": "0.5.23"}

_warned: set[str] = set()


def enabled() -> bool:
    """FUSED_AR_ENGINE_PLUGIN=1. A malformed value leaves the engine untouched, with one error line (an
    engine's plug-in loader must not fail on our account)."""
    try:
        return bool(env.ENGINE_PLUGIN.get())
    except ConfigError as exc:
        once("config", f"fused_ar: {exc}; the engine plug-in stays off")
        return False


def once(key: str, line: str) -> None:
    """Logs `line` once per process per key."""
    if key not in _warned:
        _warned.add(key)
        log.warning(line)


def check_version(engine: str, version: str) -> None:
    """One line when the running engine is not the version the adapter was tested with."""
    tested = ENGINE_VERSIONS[engine]
    if version != tested:
        once(f"version-{engine}", f"fused_ar: the {engine} plug-in is tested with {engine} {tested}; this is "
                                  f"{engine} {version}")

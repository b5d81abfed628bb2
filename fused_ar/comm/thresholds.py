"""Measured path thresholds: written by `python -m fused_ar bench --write-thresholds`, read by the
communicator's `auto` path.

One JSON file per (arch, group size) under the cache directory, `thresholds/<arch>-tp<N>.json`, with one
entry per (dtype, hidden size) the benchmark swept: the largest input (bytes per rank) the one-stage kernels
should take, and the smallest input from which the fallback (the platform collective + our add_rmsnorm)
beats both kernels, if any. A shape with no entry uses the built-in table of fused_ar.comm.policy; the
environment (FUSED_AR_1STAGE, FUSED_AR_1STAGE_MAX_BYTES, FUSED_AR_FALLBACK_MIN_BYTES) overrides both.
Files are replaced atomically; a torn or foreign file is ignored with a warning (the built-in table
serves), never trusted.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from .. import env
from ..jit import trust
from ..errors import FusedArError
from ..jit.spec import DType, platform_of_arch

FORMAT_VERSION = 1
log = logging.getLogger("fused_ar")


@dataclass(frozen=True)
class SizeRule:
    """What the measurements say for one (dtype, hidden): None where they say nothing."""

    one_stage_max_bytes: Optional[int] = None
    fallback_min_bytes: Optional[int] = None


@dataclass(frozen=True)
class Thresholds:
    arch: str
    ngpus: int
    rules: Mapping[str, SizeRule] = field(default_factory=dict)
    source: str = ""

    @staticmethod
    def key(dtype: DType, hidden: int) -> str:
        return f"{DType.parse(dtype).value}:{int(hidden)}"

    def rule(self, dtype: DType, hidden: int) -> SizeRule:
        return self.rules.get(self.key(dtype, hidden), SizeRule())

    def to_dict(self) -> dict[str, Any]:
        return {"version": FORMAT_VERSION, "arch": self.arch, "ngpus": self.ngpus, "source": self.source,
                "rules": {k: {"one_stage_max_bytes": r.one_stage_max_bytes,
                              "fallback_min_bytes": r.fallback_min_bytes} for k, r in sorted(self.rules.items())}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Thresholds":
        if d.get("version") != FORMAT_VERSION:
            raise ValueError(f"format version {d.get('version')!r}, expected {FORMAT_VERSION}")
        rules = {}
        for key, r in d["rules"].items():
            dtype, _, hidden = key.partition(":")
            rules[cls.key(DType.parse(dtype), int(hidden))] = SizeRule(
                _bytes_or_none(r.get("one_stage_max_bytes")), _bytes_or_none(r.get("fallback_min_bytes")))
        return cls(str(d["arch"]), int(d["ngpus"]), rules, str(d.get("source", "")))


def _bytes_or_none(value: Any) -> Optional[int]:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"a byte count must be an int >= 0, not {value!r}")
    return value


MAX_FILE_BYTES = 256 << 10


def file_name(arch: str, ngpus: int) -> str:
    platform_of_arch(arch)  # a valid arch holds no path separator
    return f"{arch}-tp{int(ngpus)}.json"


def path_for(arch: str, ngpus: int) -> Path:
    return env.cache_dir() / "thresholds" / file_name(arch, ngpus)


def write(thresholds: Thresholds) -> Path:
    """Stores `thresholds` (replacing the file for its arch and group size atomically); returns the path."""
    from ..jit.cache import state_dir

    name = file_name(thresholds.arch, thresholds.ngpus)
    try:
        with state_dir("thresholds", create=True) as (fd, where):
            trust.write_at(fd, name, json.dumps(thresholds.to_dict(), indent=1).encode())
    except OSError as exc:  # CacheTrustError included
        raise FusedArError(f"cannot write the thresholds file {path_for(thresholds.arch, thresholds.ngpus)}: {exc}") from exc
    return where / name


def load(arch: str, ngpus: int) -> Optional[Thresholds]:
    """The stored thresholds for (arch, ngpus), or None (no file, or one that cannot be trusted)."""
    name = file_name(arch, ngpus)
    where = env.cache_dir() / "thresholds"
    stored = trust.json_in(where.parent, ("thresholds", name), MAX_FILE_BYTES, then="the built-in thresholds serve")
    if stored is None:
        return None
    try:
        found = Thresholds.from_dict(stored)
        if (found.arch, found.ngpus) != (arch, int(ngpus)):
            raise ValueError(f"it describes {found.arch} with {found.ngpus} GPUs")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("fused_ar: ignoring the thresholds file %s: %s; the built-in thresholds serve", where / name, exc)
        return None
    return found

"""Which path a call takes: the one-stage/two-stage byte thresholds, with their origins, the measured rules
that replace them (fused_ar.comm.thresholds), the environment overrides, and the rules that send a call to the
fallback (torch.distributed all-reduce + our add_rmsnorm). Pure functions; no devices, no launches.
"""

from __future__ import annotations

import logging
from enum import Enum
from typing import Optional, Sequence, Union

from .. import env
from ..errors import InputError
from ..device.plans import PLAN_ENV
from ..jit.kernels import CROSS_GPU_NGPUS
from ..jit.spec import Platform
from .thresholds import SizeRule

# The environment's path overrides and what a plan reads when made: part of every call's plan key, so changing
# one takes effect at once.
_OVERRIDES = env.raw_names(env.ONE_STAGE, env.ONE_STAGE_MAX_BYTES, env.FALLBACK_MIN_BYTES) + PLAN_ENV


def overrides() -> tuple:
    """The raw values of the environment's path overrides and FUSED_AR_PDL, for a plan key."""
    return env.raw_values(_OVERRIDES)

KiB = 1024
log = logging.getLogger("fused_ar")


class Path(str, Enum):
    AUTO = "auto"
    ONE_STAGE = "1stage"
    TWO_STAGE = "2stage"
    FALLBACK = "fallback"


# A communicator's buffers (each) unless it is given max_bytes: what one launch stages.
DEFAULT_MAX_BYTES = 64 * 1024 * 1024

# Largest input (bytes per rank) that takes the one-stage kernels; above it, two-stage.
# MI355X, aiter #3458 (the seed's selection thresholds): TP2 896 KiB, TP4 448 KiB, TP8 224 KiB, i.e. 1792 KiB / N
# in whole KiB; the sizes the field has not measured (3, 5, 6, 7) follow the same 1/N rule (the one-stage
# kernel reads N inputs per rank, so its cost grows with N while the two-stage kernel's stays flat).
_HIP_ONE_STAGE_KIB_TIMES_N = 1792
# H100, TensorRT-LLM / vLLM: one-shot up to 32 tokens of 8192 bf16 (512 KiB) at TP8; the same bound is kept
# for every other size until bench measures ours (--write-thresholds stores what it measures).
_CUDA_ONE_STAGE_BYTES = 512 * KiB
ONE_STAGE_MAX_BYTES: dict[tuple[Platform, int], int] = {
    **{(Platform.HIP, n): _HIP_ONE_STAGE_KIB_TIMES_N // n * KiB for n in CROSS_GPU_NGPUS},
    **{(Platform.CUDA, n): _CUDA_ONE_STAGE_BYTES for n in CROSS_GPU_NGPUS},
}


def one_stage_max_bytes(platform: Platform, ngpus: int, rule: SizeRule = SizeRule()) -> int:
    """The environment, else the measured rule (fused_ar.comm.thresholds), else the built-in table."""
    override = env.ONE_STAGE_MAX_BYTES.get()
    if override is not None:
        return override
    if rule.one_stage_max_bytes is not None:
        return rule.one_stage_max_bytes
    return ONE_STAGE_MAX_BYTES[(platform, ngpus)]


def fallback_min_bytes(rule: SizeRule = SizeRule()) -> Optional[int]:
    """From which input size `auto` takes the fallback: the environment (0: never), else the measured rule."""
    override = env.FALLBACK_MIN_BYTES.get()
    if override is not None:
        return override or None
    return rule.fallback_min_bytes


def parse_path(path: Union[str, Path]) -> Path:
    try:
        return Path(path)
    except ValueError:
        raise InputError(f"path={path!r}: must be one of {[p.value for p in Path]}") from None


def use_two_stage(path: Union[str, Path], platform: Platform, ngpus: int, nbytes: int,
                  rule: SizeRule = SizeRule()) -> bool:
    """True for the two-stage kernels. `path` forces one; `auto` follows FUSED_AR_1STAGE, else the size."""
    path = parse_path(path)
    if path is Path.FALLBACK:
        raise InputError("path='fallback' takes no cross-GPU kernel")
    if path is Path.ONE_STAGE:
        return False
    if path is Path.TWO_STAGE:
        return True
    forced = env.ONE_STAGE.get()
    if forced is not None:
        return not forced
    return nbytes > one_stage_max_bytes(platform, ngpus, rule)


def choose_path(path: Union[str, Path], platform: Platform, ngpus: int, nbytes: int, launch_bytes: Optional[int] = None,
                *, group_reason: Optional[str] = None, unsupported: Optional[str] = None,
                rule: SizeRule = SizeRule(), can_fall_back: bool = True) -> tuple[Path, Optional[str]]:
    """(path, why it is the fallback or None). The fallback serves what the kernels cannot: a group the IPC
    kernels cannot span (`group_reason`: several nodes, no working peer access), a shape they do not take
    (`unsupported`); and `path='fallback'` asks for it. On `auto`, an input of `nbytes` at or over the measured
    fallback size (`rule`, where `can_fall_back`) takes it too, unless FUSED_AR_1STAGE names a kernel, and the
    kernel follows the bytes of one launch (`launch_bytes`: an input over the communicator's buffer runs in
    chunks of at most that many; default `nbytes`). A forced 1stage/2stage is kept otherwise."""
    path = parse_path(path)
    if path is Path.FALLBACK:
        return path, "path='fallback' was asked for"
    why = group_reason or unsupported
    if why is None and path is Path.AUTO and can_fall_back and env.ONE_STAGE.get() is None:
        from_bytes = fallback_min_bytes(rule)
        if from_bytes is not None and nbytes >= from_bytes:
            why = (f"inputs of {from_bytes} bytes and more are faster through the collective (measured "
                   "thresholds or FUSED_AR_FALLBACK_MIN_BYTES)")
    if why is not None:
        return Path.FALLBACK, why
    if path is Path.AUTO:
        launch = nbytes if launch_bytes is None else launch_bytes
        path = Path.TWO_STAGE if use_two_stage(path, platform, ngpus, launch, rule) else Path.ONE_STAGE
    return path, None


def group_fallback_reason(hosts: Sequence[str], world_size: int, supported: Sequence[int],
                          probes: Sequence[tuple[bool, str]] = ()) -> Optional[str]:
    """Why the IPC kernels cannot serve a group at all, from what every rank reported (the same verdict on
    every rank): its hosts, its size, its ranks' peer-access probes. None if they can."""
    nodes = sorted(set(hosts))
    if len(nodes) > 1:
        return f"the group spans {len(nodes)} nodes ({', '.join(nodes)}); the IPC kernels serve one node"
    if world_size not in supported:
        return f"a group of {world_size} ranks; the IPC kernels take {list(supported)}"
    for rank, (ok, detail) in enumerate(probes):
        if not ok:
            return f"peer access does not work on rank {rank}'s GPUs: {detail}"
    return None


class FallbackLog:
    """One warning per distinct reason per communicator, not one per call."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.seen: set[str] = set()

    def note(self, why: str) -> None:
        if why not in self.seen:
            self.seen.add(why)
            log.warning("fused_ar: rank %d takes the fallback (torch.distributed all_reduce + fused_ar "
                        "add_rmsnorm): %s", self.rank, why)

"""vLLM plug-in: entry points, the `ca_comm` adapter and its installation into vLLM's TP communicator.

Entry points (pyproject.toml): `vllm.general_plugins` -> `register` (every process, before models load:
defines torch.ops.fused_ar.*), `vllm.platform_plugins` -> `platform` (names fused_ar's subclass of vLLM's
CUDA or ROCm platform, whose device communicator swaps the custom all-reduce of `tp` groups for
`VllmCustomAllreduce` and whose pass manager adds fused_ar's fusion pass). Both do nothing unless
FUSED_AR_ENGINE_PLUGIN=1. vLLM is imported inside functions only: this module loads with any vLLM.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from .adapter import EngineAllreduce
from . import check_version, enabled

log = logging.getLogger("fused_ar")

# vLLM's CustomAllreduce default (custom_all_reduce.py): what vLLM's communicator would build.
VLLM_MAX_SIZE = 8192 * 1024
PLATFORMS = {"cuda": "fused_ar.integrations.vllm_platform.FusedArCudaPlatform",
             "rocm": "fused_ar.integrations.vllm_platform.FusedArRocmPlatform"}


def register() -> None:
    """`vllm.general_plugins`: defines torch.ops.fused_ar.* (ours and the ops the fusion pass places, so a
    compiled graph loaded from vLLM's cache finds them in every worker). Idempotent."""
    from . import vllm_fusion  # noqa: F401  (defines the ops on import)

    if enabled():
        import vllm

        check_version("vllm", vllm.__version__)


def platform() -> Optional[str]:
    """`vllm.platform_plugins`: fused_ar's platform class where vLLM's own detection finds CUDA or ROCm and
    the plug-in is on, else None (vLLM then uses its built-in platform)."""
    if not enabled():
        return None
    from vllm.platforms import builtin_platform_plugins

    for name, qualname in PLATFORMS.items():
        if builtin_platform_plugins[name]() is not None:  # vLLM's own detection
            return qualname
    return None


def vllm_facts(group: Any, device: Any, symm_mem_enabled: bool, max_size: int) -> tuple[int, bool, bool]:
    """(max_size, fully_connected, batch_invariant) as vLLM's CustomAllreduce derives them: symmetric memory
    caps max_size (CUSTOM_ALL_REDUCE_MAX_SIZES), the platform judges the links between the group's physical
    GPUs (ranks sharing one GPU are connected), VLLM_BATCH_INVARIANT asks for any size. Collective."""
    import torch
    import torch.distributed as dist
    import vllm.envs as envs
    from vllm.distributed.device_communicators.all_reduce_utils import CUSTOM_ALL_REDUCE_MAX_SIZES
    from vllm.platforms import current_platform

    world = dist.get_world_size(group=group)
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    capability = current_platform.get_device_capability()
    if current_platform.is_cuda() and symm_mem_enabled and capability is not None:
        caps = CUSTOM_ALL_REDUCE_MAX_SIZES.get(capability.as_version_str(), {})
        if world in caps:
            max_size = min(caps[world], max_size)
    mine = torch.tensor([current_platform.visible_device_id_to_physical_device_id(device.index or 0)],
                        dtype=torch.int)
    ids = [torch.zeros(1, dtype=torch.int) for _ in range(world)]
    dist.all_gather(ids, mine, group=group)
    physical = [int(t.item()) for t in ids]
    connected = len(set(physical)) == 1 or current_platform.is_fully_connected(physical)
    return int(max_size), bool(connected), bool(envs.VLLM_BATCH_INVARIANT)


class VllmCustomAllreduce(EngineAllreduce):
    """vLLM's `CustomAllreduce` (distributed/device_communicators/custom_all_reduce.py), backed by fused_ar:
    the same constructor, attributes and methods vLLM and its models read; all-gather and reduce-scatter
    are declined (None), as for a group vLLM's own class does not serve."""

    engine = "vLLM"
    max_size_inclusive = False  # vLLM: nbytes < max_size

    def __init__(self, group: Any, device: Any, max_size: int = VLLM_MAX_SIZE, *args: Any,
                 symm_mem_enabled: bool = False, register_graph_buffers: bool = True, name: str = "",
                 **kwargs: Any) -> None:
        # *args, **kwargs: vLLM's all-gather / reduce-scatter sizes, which this class does not serve
        max_size, connected, invariant = vllm_facts(group, device, symm_mem_enabled, max_size)
        self.batch_invariant = invariant
        self.mnnvl_only = False
        self.mnnvl_lamport_ag_multicast_ptr = 0
        super().__init__(group, device, max_size, register_graph_buffers=register_graph_buffers, name=name,
                         any_size=invariant, fully_connected=connected)

    def custom_all_gather(self, inp: Any, *args: Any, **kwargs: Any) -> None:
        return None

    def custom_reduce_scatter(self, inp: Any, *args: Any, **kwargs: Any) -> None:
        return None


def install(device_communicator: Any) -> None:
    """Swaps the custom all-reduce vLLM built for a `tp` group (`ca_comm`) for VllmCustomAllreduce, and
    closes vLLM's. Groups without one (not `tp`, AITER's on ROCm, a single rank) are left as they are, and
    so is a group fused_ar cannot serve (its own then stays). Collective over the group."""
    built = getattr(device_communicator, "ca_comm", None)
    if built is None or device_communicator.world_size <= 1:
        return
    from vllm.config import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    register = config is None or not config.use_cumem_cudagraph_pool
    symm = getattr(device_communicator, "symm_mem_comm", None)
    name = device_communicator.unique_name
    ours = VllmCustomAllreduce(group=device_communicator.cpu_group, device=device_communicator.device,
                               symm_mem_enabled=symm is not None and not symm.disabled,
                               register_graph_buffers=register, name=name)
    if ours.disabled:
        ours.close()
        if ours.rank == 0:
            log.warning("fused_ar: vLLM group %s keeps vLLM's custom all-reduce: %s", name, ours.disabled_reason)
        return
    if not built.disabled:
        built.close()
    device_communicator.ca_comm = ours
    if ours.rank == 0:
        log.warning("fused_ar: replaced vLLM's custom all-reduce of group %s (%d ranks, max_size %d bytes%s) with "
                    "fused_ar's", name, ours.world_size, ours.max_size,
                    ", every size: batch-invariant mode" if ours.any_size else "")


def tp_adapter() -> Optional[VllmCustomAllreduce]:
    """The enabled adapter of this process's TP group, if fused_ar serves it."""
    from vllm.distributed.parallel_state import get_tp_group

    try:
        communicator = get_tp_group().device_communicator
    except AssertionError:  # no TP group initialized
        return None
    adapter = getattr(communicator, "ca_comm", None)
    return adapter if isinstance(adapter, VllmCustomAllreduce) and not adapter.disabled else None

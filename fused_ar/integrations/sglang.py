"""SGLang plug-in: the `sglang.srt.plugins` entry point, its hooks, and the `ca_comm` adapter.

`register` (run by SGLang's `load_plugins()` in the engine and every TP worker, before its
`HookRegistry.apply_hooks()`) does nothing unless FUSED_AR_ENGINE_PLUGIN=1; on, it registers AROUND hooks:
- `dispatch_custom_allreduce` -> a factory that builds `SglangCustomAllreduce` for the group, or SGLang's
  own class where fused_ar cannot serve the group (one log line says which and why);
- NVIDIA: `flashinfer_allreduce_residual_rmsnorm` runs fused_ar's fused kernel when the group's `ca_comm`
  is fused_ar's (FlashInfer's or the plain path otherwise), and `flashinfer_ar_fusion_applies` says yes
  for batches fused_ar can take, so the fused path is reached without FlashInfer too.
On AMD, SGLang calls `ca_comm.fused_allreduce_rmsnorm` itself (found by hasattr). SGLang is imported
inside functions only.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from .adapter import EngineAllreduce
from . import check_version, enabled

log = logging.getLogger("fused_ar")

_CA = "sglang.srt.distributed.device_communicators.custom_all_reduce"
_FUSION = "sglang.srt.layers.flashinfer_comm_fusion"
_ADD_NORM = "sglang.srt.layers.layer_boundary.residual.add_norm"
# SGLang's CustomAllreduce._MAX_CAR_SIZE: 8 MiB on CUDA, 16 MiB on ROCm (its measured crossover).
SGLANG_MAX_SIZE = {"cuda": 8192 * 1024, "hip": 2 * 8192 * 1024}


def _is_hip() -> bool:
    import torch

    return bool(getattr(torch.version, "hip", None))


def _deterministic() -> bool:
    """SGLang's rule for a fixed-order all-reduce of any size (HIP: --enable-deterministic-inference or
    SGLANG_USE_1STAGE_ALLREDUCE=1)."""
    if not _is_hip():
        return False
    try:
        from sglang.srt.distributed.device_communicators.custom_all_reduce import _use_amd_deterministic_impl
    except ImportError:
        return False
    return bool(_use_amd_deterministic_impl())


def _full_nvlink(group: Any, device: Any) -> bool:
    """SGLang's topology verdict (custom_all_reduce_utils.is_full_nvlink over the group's physical GPUs, as
    its CustomAllreduce derives it); ranks sharing one GPU count as connected. Collective."""
    import os

    import torch
    import torch.distributed as dist

    world = dist.get_world_size(group=group)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    index = torch.device(device).index or 0
    physical = [int(v) for v in visible.split(",")][index] if visible else index
    ids = [torch.zeros(1, dtype=torch.int) for _ in range(world)]
    dist.all_gather(ids, torch.tensor([physical], dtype=torch.int), group=group)
    physical_ids = [int(t.item()) for t in ids]
    if len(set(physical_ids)) == 1:
        return True
    from sglang.srt.distributed.device_communicators.custom_all_reduce_utils import is_full_nvlink

    return bool(is_full_nvlink(physical_ids, world))


class SglangCustomAllreduce(EngineAllreduce):
    """SGLang's `CustomAllreduce` (srt/distributed/device_communicators/custom_all_reduce.py), backed by
    fused_ar, with the fused methods SGLang's parallel state looks for."""

    engine = "SGLang"
    max_size_inclusive = True  # SGLang: nbytes <= max_size

    def __init__(self, group: Any, device: Any, max_size: Optional[int] = None, *,
                 register_graph_buffers: Optional[bool] = None, name: str = "") -> None:
        import torch

        if isinstance(device, int):
            device = torch.device("cuda", device)
        if max_size is None:
            max_size = SGLANG_MAX_SIZE["hip" if _is_hip() else "cuda"]
        if register_graph_buffers is None:  # SGLang's memory saver keeps graph memory it cannot export
            register_graph_buffers = not _memory_saver()
        self.original_disabled = True
        super().__init__(group, device, max_size, register_graph_buffers=register_graph_buffers, name=name,
                         any_size=_deterministic(), fully_connected=_full_nvlink(group, device))
        self.full_nvlink = self.fully_connected
        self.original_disabled = self.disabled

    def _warmup(self, inp: Any) -> Any:
        """SGLang: a split op of a piecewise graph runs eagerly inside capture and needs the real sum;
        a true warm-up gets zeros."""
        import torch

        try:
            from sglang.srt.model_executor.runner_backend_utils.tc_piecewise_cuda_graph import (
                is_in_tc_piecewise_cuda_graph)
        except ImportError:
            is_in_tc_piecewise_cuda_graph = None
        if is_in_tc_piecewise_cuda_graph is not None and is_in_tc_piecewise_cuda_graph():
            return self.all_reduce(inp)
        return torch.zeros_like(inp)

    def custom_fused_ar_rms_per_group_quant(self, input_: Any, residual: Any, weight: Any, eps: float,
                                            group_size: int = 128, use_1stage: bool = False, emit_bf16: bool = False,
                                            transpose_scale: bool = False) -> Optional[tuple[Any, ...]]:
        """SGLang's AMD per-group FP8 path: (q, residual_out, scales), scales column-major with
        `transpose_scale`; None (SGLang then runs the fused norm and a separate quantization) for
        `emit_bf16`, which would need the T output too, and for what the kernels do not take."""
        if emit_bf16:
            return None
        got = self.fused_allreduce_rmsnorm_fp8(input_, residual, weight, eps, group_size=group_size)
        if got is None:
            return None
        q, residual_out, scales = got
        return q, residual_out, (scales.t().contiguous().t() if transpose_scale else scales)


def _memory_saver() -> bool:
    try:
        from sglang.srt.environ import envs

        return bool(envs.SGLANG_MEMORY_SAVER_CUDA_GRAPH.get())
    except (ImportError, AttributeError):
        return False


def dispatch(original: Callable[..., Any], group: Any, device: Any) -> Callable[..., Any]:
    """AROUND `dispatch_custom_allreduce(group, device)`: the class SGLang would use is kept as the
    fallback of a factory that builds fused_ar's adapter (SGLang calls the result with group= and device=)."""
    theirs = original(group=group, device=device)

    def build(group: Any, device: Any, **kwargs: Any) -> Any:
        ours = SglangCustomAllreduce(group, device)
        if not ours.disabled:
            if ours.rank == 0:
                log.warning("fused_ar: replaced SGLang's custom all-reduce (%s) of a %d-rank group with fused_ar's "
                            "(max_size %d bytes%s)", getattr(theirs, "__name__", type(theirs).__name__),
                            ours.world_size, ours.max_size, ", every size: deterministic mode" if ours.any_size else "")
            return ours
        ours.close()
        if ours.rank == 0:
            log.warning("fused_ar: SGLang keeps its own custom all-reduce: %s", ours.disabled_reason)
        return theirs(group=group, device=device, **kwargs)

    return build


def _fusion_adapter(use_attn_tp_group: bool) -> Optional[SglangCustomAllreduce]:
    """fused_ar's adapter of the group SGLang's fused norm reduces over, if it serves that group."""
    from sglang.srt.layers.flashinfer_comm_fusion import resolve_fusion_group

    try:
        coordinator = resolve_fusion_group(use_attn_tp_group=use_attn_tp_group)[2]
    except Exception:  # no group initialized yet (SGLang asks during start-up)
        return None
    ca = getattr(coordinator, "ca_comm", None)
    return ca if isinstance(ca, SglangCustomAllreduce) and not ca.disabled else None


def fused_residual_rmsnorm(original: Callable[..., Any], input_tensor: Any, residual: Any, weight: Any,
                           eps: float = 1e-6, max_token_num: int = 2048, use_oneshot: Optional[bool] = None,
                           trigger_completion_at_end: bool = False, fp32_acc: bool = True,
                           use_attn_tp_group: bool = True) -> tuple[Any, Any]:
    """AROUND `flashinfer_allreduce_residual_rmsnorm`: fused_ar's kernel where the group's ca_comm is
    fused_ar's and takes the call, else SGLang's function (FlashInfer, or (None, None): SGLang's plain
    path)."""
    adapter = _fusion_adapter(use_attn_tp_group)
    if adapter is not None:
        got = adapter.fused_allreduce_rmsnorm(input_tensor, residual, weight, eps)
        if got is not None:
            return got
    return original(input_tensor, residual, weight, eps=eps, max_token_num=max_token_num, use_oneshot=use_oneshot,
                    trigger_completion_at_end=trigger_completion_at_end, fp32_acc=fp32_acc,
                    use_attn_tp_group=use_attn_tp_group)


def fusion_applies(original: Callable[..., Any], batch_size: int) -> bool:
    """AROUND `flashinfer_ar_fusion_applies(batch_size)`: also yes where fused_ar serves the attention TP
    group and DP attention is off; the fused call itself declines what its buffer cannot hold."""
    if original(batch_size):
        return True
    from sglang.srt.layers.dp_attention import is_dp_attention_enabled

    if is_dp_attention_enabled() or _fusion_adapter(use_attn_tp_group=True) is None:
        return False
    return batch_size > 0  # symbolic under Dynamo: checked last, as SGLang does


HOOKS = ((f"{_CA}.dispatch_custom_allreduce", dispatch, False),
         (f"{_FUSION}.flashinfer_allreduce_residual_rmsnorm", fused_residual_rmsnorm, True),
         (f"{_ADD_NORM}.flashinfer_ar_fusion_applies", fusion_applies, True))


def register() -> None:
    """`sglang.srt.plugins`: registers the hooks (NVIDIA also the FlashInfer fusion ones) when
    FUSED_AR_ENGINE_PLUGIN=1; nothing otherwise. Idempotent across SGLang's repeated plug-in loads."""
    if not enabled():
        return
    import sglang
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    check_version("sglang", getattr(sglang, "__version__", "unknown"))
    for target, hook, nvidia_only in HOOKS:
        if nvidia_only and _is_hip():
            continue
        if any(h is hook for _, h, _ in HookRegistry._hooks.get(target, ())):
            continue
        HookRegistry.register(target, hook, HookType.AROUND)

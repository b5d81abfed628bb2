"""vLLM's compiled graphs: the ops fused_ar places into them and the post-grad pass that places them.

The pass finds vLLM's all-reduce (`torch.ops.vllm.all_reduce(x, group_name)`) feeding its RMSNorm
(`vllm_ir.rms_norm`, or `vllm_ir.fused_add_rms_norm` with a residual), optionally followed by static FP8
quantization (`_C.static_scaled_fp8_quant`), or feeding norm + quantization that vLLM fused already
(`_C.rms_norm_static_fp8_quant`, `_C.fused_add_rms_norm_static_fp8_quant`), and replaces the chain with one
`torch.ops.fused_ar.vllm_allreduce_rmsnorm[_fp8]` call. The op names its group by vLLM's group name (stable
across processes, which share compiled graphs) and finds the adapter serving it at run time; where none
does, or the adapter declines the shape, it runs vLLM's own all-reduce and then fused_ar's add + RMSNorm,
so a rewritten graph is right in any process. Pure fx: no GPU is needed to rewrite a graph.
"""

from __future__ import annotations

import hashlib
import logging
import operator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from .. import torch_ops  # noqa: F401  (fused_ar's namespace is defined there first; these ops extend it)
from .._version import __version__
from ..comm import registry
from ..device.ops import add_rmsnorm, add_rmsnorm_fp8
from . import enabled

log = logging.getLogger("fused_ar")

SCHEMAS = {
    "vllm_allreduce_rmsnorm": "vllm_allreduce_rmsnorm(Tensor x, Tensor? residual, Tensor? weight, float eps, "
                              "str group, float weight_offset=0.0) -> (Tensor, Tensor)",
    # Static FP8: (q, residual_out); the one-element scale is an input.
    "vllm_allreduce_rmsnorm_fp8": "vllm_allreduce_rmsnorm_fp8(Tensor x, Tensor? residual, Tensor? weight, float eps, "
                                  "str group, Tensor scale, float weight_offset=0.0, ScalarType? fp8_dtype=None) "
                                  "-> (Tensor, Tensor)",
}

# vLLM's ops, by schema name (namespace.name)
ALL_REDUCE = "vllm.all_reduce"
RMS_NORM = "vllm_ir.rms_norm"
ADD_RMS_NORM = "vllm_ir.fused_add_rms_norm"
STATIC_FP8 = "_C.static_scaled_fp8_quant"
RMS_NORM_FP8 = "_C.rms_norm_static_fp8_quant"
ADD_RMS_NORM_FP8 = "_C.fused_add_rms_norm_static_fp8_quant"
_SERVED = (torch.float32, torch.float16, torch.bfloat16)
PACK_BYTES = 16


def _allreduce_rmsnorm(x: torch.Tensor, residual: Optional[torch.Tensor], weight: Optional[torch.Tensor], eps: float,
                       group: str, weight_offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    adapter = registry.find_name(group)
    got = None if adapter is None else adapter.fused_allreduce_rmsnorm(x, residual, weight, eps, weight_offset)
    if got is not None:
        return got
    reduced = torch.ops.vllm.all_reduce(x, group)  # vLLM's own chain, then our add + RMSNorm
    return add_rmsnorm(reduced, residual, weight, eps, weight_offset=weight_offset)


def _allreduce_rmsnorm_fp8(x: torch.Tensor, residual: Optional[torch.Tensor], weight: Optional[torch.Tensor],
                           eps: float, group: str, scale: torch.Tensor, weight_offset: float = 0.0,
                           fp8_dtype: Optional[torch.dtype] = None) -> tuple[torch.Tensor, torch.Tensor]:
    adapter = registry.find_name(group)
    got = None if adapter is None else adapter.fused_allreduce_rmsnorm_fp8(
        x, residual, weight, eps, weight_offset=weight_offset, scale=scale, fp8_dtype=fp8_dtype)
    if got is None:
        reduced = torch.ops.vllm.all_reduce(x, group)
        got = add_rmsnorm_fp8(reduced, residual, weight, eps, weight_offset=weight_offset, scale=scale,
                              fp8_dtype=fp8_dtype)
    return got[0], got[1]


def _fake(x: torch.Tensor, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), torch.empty_like(x)


def _fake_fp8(x: torch.Tensor, residual: Any, weight: Any, eps: float, group: str, scale: torch.Tensor,
              weight_offset: float = 0.0, fp8_dtype: Optional[torch.dtype] = None) -> tuple[torch.Tensor, torch.Tensor]:
    # The pass always names the FP8 dtype (the one vLLM's quantization wrote); a direct caller must too.
    return torch.empty(x.shape, dtype=fp8_dtype or torch.float8_e4m3fn, device=x.device), torch.empty_like(x)


_library = torch.library.Library("fused_ar", "FRAGMENT")
for _name, _kernel, _fake_kernel in (("vllm_allreduce_rmsnorm", _allreduce_rmsnorm, _fake),
                                     ("vllm_allreduce_rmsnorm_fp8", _allreduce_rmsnorm_fp8, _fake_fp8)):
    _library.define(SCHEMAS[_name])
    _library.impl(_name, _kernel, "CUDA")
    torch.library.register_fake(f"fused_ar::{_name}", _fake_kernel, lib=_library)


# -- the rewrite ----------------------------------------------------------------------------------------------
def op_name(target: Any) -> str:
    """`namespace.name` of an OpOverload (vllm.all_reduce), "" for anything else."""
    schema = getattr(target, "_schema", None)
    return schema.name.replace("::", ".") if schema is not None else ""


def _functionalized(node: Any) -> str:
    """The op an auto_functionalized node wraps (vLLM's passes work on auto-functionalization v1), or ""."""
    from torch._higher_order_ops.auto_functionalize import auto_functionalized

    if node.op == "call_function" and node.target is auto_functionalized:
        return op_name(node.args[0])
    return ""


def _items(node: Any) -> dict[int, Any]:
    return {u.args[1]: u for u in node.users if u.op == "call_function" and u.target is operator.getitem}


def _val(node: Any) -> Any:
    return node.meta.get("val") if hasattr(node, "meta") else None


@dataclass
class Match:
    norm: Any               # the first node of the chain after the all-reduce: where the fused call goes
    residual: Any
    weight: Any
    eps: float
    out: Any                # whose uses take the fused call's first output (out, or the FP8 q)
    residual_out: Any       # whose uses take its second output (the residual, or the all-reduce itself)
    scale: Any = None       # static FP8
    fp8_dtype: Any = None
    dead: tuple = ()        # the chain's nodes: erased once the outputs have moved (the all-reduce too)


def _weight_ok(weight: Any, dtype: torch.dtype) -> bool:
    if weight is None:
        return True
    val = _val(weight)
    return val is not None and (val.dtype == dtype or (val.dtype == torch.float32 and dtype != torch.float32))


def _served(x: Any) -> bool:
    """x's dtype is one the kernels take and its rows are whole 16-byte packs (a static hidden size)."""
    val = _val(x)
    if val is None or val.dtype not in _SERVED or val.dim() == 0:
        return False
    hidden = val.shape[-1]
    return isinstance(hidden, int) and hidden * val.element_size() % PACK_BYTES == 0


def _static_fp8(node: Any) -> Optional[tuple[Any, Any, Any, Any]]:
    """(quant node, q getitem, scale, FP8 dtype) where `node`'s only use is vLLM's static FP8 quantization."""
    users = list(node.users)
    if len(users) != 1 or _functionalized(users[0]) != STATIC_FP8:
        return None
    quant = users[0]
    kw = quant.kwargs
    if kw.get("input") is not node or kw.get("group_shape") is not None or "result" not in kw:
        return None
    q = _items(quant).get(1)
    result = _val(kw["result"])
    if q is None or result is None:
        return None
    return (quant, q, kw["result"]), q, kw["scale"], result.dtype


def match(ar: Any) -> Optional[Match]:
    """The fusable chain after one all-reduce node, or None."""
    users = list(ar.users)
    x_val = _val(ar.args[0])
    if x_val is None:
        return None
    for n in users:
        kind = op_name(n.target) if n.op == "call_function" else ""
        wrapped = _functionalized(n)
        if kind == ADD_RMS_NORM and len(users) == 1 and n.args[0] is ar and (len(n.args) < 5 or n.args[4] is None):
            items = _items(n)
            if set(n.users) != set(items.values()) or 1 not in items:
                return None
            residual, weight, eps = n.args[1:4]
            out = items.get(0)
            fp8 = _static_fp8(out) if out is not None else None
            if fp8 is not None:
                chain, q, scale, dtype = fp8
                return Match(n, residual, weight, eps, q, items[1], scale, dtype, (*chain, *items.values(), n))
            return Match(n, residual, weight, eps, out, items[1], dead=(*items.values(), n))
        if kind == RMS_NORM and n.args[0] is ar and (len(n.args) < 4 or n.args[3] is None):
            weight, eps = n.args[1:3]
            fp8 = _static_fp8(n)
            if fp8 is not None:
                chain, q, scale, dtype = fp8
                return Match(n, None, weight, eps, q, ar, scale, dtype, (*chain, n))
            return Match(n, None, weight, eps, n, ar, dead=(n,))
        if wrapped in (ADD_RMS_NORM_FP8, RMS_NORM_FP8) and n.kwargs.get("input") is ar:
            kw, items = n.kwargs, _items(n)
            result = _val(kw.get("result"))
            if 1 not in items or result is None:
                return None
            if wrapped == ADD_RMS_NORM_FP8:
                if len(users) != 1 or 2 not in items:
                    return None
                return Match(n, kw["residual"], kw["weight"], kw["epsilon"], items[1], items[2], kw["scale"],
                             result.dtype, (*items.values(), n, kw["result"]))
            return Match(n, None, kw["weight"], kw["epsilon"], items[1], ar, kw["scale"], result.dtype,
                         (*items.values(), n, kw["result"]))
    return None


def _in_order(m: Match, ar: Any, order: dict) -> bool:
    """Every input is defined before the fused call's place, every use of its outputs comes after it."""
    at = order[m.norm]
    inputs = [v for v in (m.residual, m.weight, m.scale) if hasattr(v, "op")]
    if any(order[v] >= at for v in inputs):
        return False
    uses = [u for u in m.residual_out.users if u is not m.norm and u not in m.dead] if m.residual_out is ar else []
    return all(order[u] > at for u in uses)


def rewrite(graph: Any) -> int:
    """Replaces every fusable all-reduce -> RMSNorm (-> static FP8) chain of `graph` with fused_ar's op;
    returns how many."""
    count = 0
    order = {n: i for i, n in enumerate(graph.nodes)}
    for ar in list(graph.nodes):
        if ar.op != "call_function" or op_name(ar.target) != ALL_REDUCE or len(ar.args) != 2 or ar.kwargs:
            continue
        x, group = ar.args
        m = match(ar)
        if m is None or not _served(x) or not isinstance(m.eps, (int, float)) or not _weight_ok(m.weight, _val(x).dtype):
            continue
        if not _in_order(m, ar, order):
            continue
        fused = torch.ops.fused_ar.vllm_allreduce_rmsnorm_fp8.default if m.scale is not None else \
            torch.ops.fused_ar.vllm_allreduce_rmsnorm.default
        args = (x, m.residual, m.weight, float(m.eps), group) + \
            ((m.scale, 0.0, m.fp8_dtype) if m.scale is not None else (0.0,))
        with graph.inserting_before(m.norm):
            call = graph.call_function(fused, args)
            first = graph.call_function(operator.getitem, (call, 0))
            second = graph.call_function(operator.getitem, (call, 1))
        first.meta["val"], second.meta["val"] = _val(m.out), _val(m.residual_out)
        call.meta["val"] = (first.meta["val"], second.meta["val"])
        m.out.replace_all_uses_with(first)
        m.residual_out.replace_all_uses_with(second)
        _erase_unused(graph, (*m.dead, ar))
        count += 1
    return count


def _erase_unused(graph: Any, nodes: tuple) -> None:
    """Erases those of `nodes` left without users, users first, until none is left to erase (a buffer vLLM
    allocated for its quantization is among them)."""
    left = {n for n in nodes if hasattr(n, "op") and n.op == "call_function"}
    while True:
        unused = [n for n in left if not n.users]
        if not unused:
            return
        for node in unused:
            graph.erase_node(node)
            left.discard(node)


# -- the pass -------------------------------------------------------------------------------------------------
_SOURCE_DIGEST = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def fusion_pass(config: Any, adapter: Any) -> Optional[Any]:
    """fused_ar's post-grad pass for this vLLM configuration, or None: plug-in off, vLLM's batch-invariant
    mode (the pass covers small batches only, so a row's path would depend on the batch), no fused_ar
    `adapter` on the TP group (fused_ar.integrations.vllm.tp_adapter), or no model."""
    if not enabled():
        return None
    import vllm.envs as envs
    from vllm.compilation.passes.inductor_pass import InductorPass

    model = getattr(config, "model_config", None)
    if envs.VLLM_BATCH_INVARIANT or adapter is None or model is None:
        return None
    row_bytes = model.get_hidden_size() * torch.empty((), dtype=model.dtype).element_size()
    max_tokens = adapter.max_size // row_bytes
    scheduler = getattr(config, "scheduler_config", None)
    if scheduler is not None:
        max_tokens = min(max_tokens, scheduler.max_num_batched_tokens)

    class FusedArAllReduceFusionPass(InductorPass):
        """all-reduce + RMSNorm (+ static FP8) -> one fused_ar call, for compile ranges up to the tokens
        the adapter's buffer holds (larger inputs would decline to vLLM's path anyway)."""

        def __call__(self, graph: Any) -> None:
            replaced = rewrite(graph)
            log.debug("fused_ar: fused %d all-reduce + RMSNorm chains", replaced)

        def is_applicable_for_range(self, compile_range: Any) -> bool:
            return max_tokens > 0 and compile_range.end <= max_tokens

        def uuid(self) -> str:
            return InductorPass.hash_dict({"fused_ar": __version__, "source": _SOURCE_DIGEST,
                                           "max_tokens": max_tokens})

    return FusedArAllReduceFusionPass()

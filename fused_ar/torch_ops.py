"""torch.ops.fused_ar.*: the ops as torch library ops with fake implementations, so a model compiled with
torch.compile (fullgraph) keeps them as single calls and can be captured into CUDA graphs.

Defined with `torch.library.Library` (schema, a CUDA kernel, a fake kernel) rather than
`torch.library.custom_op`, whose Python-level autograd and aliasing wrappers cost about 20 us per call
(measured against the direct call: the Library route adds about 3 us, the dispatcher's own cost). The ops
are functional (they allocate and return their outputs) and need no autograd.

A communicator is named by its integer `handle` (torch ops take no Python objects); every Communicator
enters fused_ar.comm.registry when created and leaves when closed. Importing this module defines the ops
once per process (`fused_ar.register_torch_ops()` does it explicitly; so does the first use of
`fused_ar.Communicator`).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from .comm.registry import lookup
from .device.ops import add_rmsnorm, add_rmsnorm_fp4, add_rmsnorm_fp8

SCHEMAS = {
    "allreduce_rmsnorm": "allreduce_rmsnorm(Tensor x, Tensor? residual, Tensor? weight, float eps, int comm, "
                         "str path=\"auto\", float weight_offset=0.0) -> (Tensor, Tensor)",
    "allreduce": "allreduce(Tensor x, int comm, str path=\"auto\") -> Tensor",
    "add_rmsnorm": "add_rmsnorm(Tensor x, Tensor? residual, Tensor? weight, float eps, float weight_offset=0.0) "
                   "-> (Tensor, Tensor)",
    # In place, as vLLM's fused_add_rms_norm: out is written over x and residual_out over residual. The alias
    # annotations (a!), (b!) tell torch.compile what they mutate.
    "add_rmsnorm_": "add_rmsnorm_(Tensor(a!) x, Tensor(b!) residual, Tensor? weight, float eps, "
                    "float weight_offset=0.0) -> ()",
    "allreduce_rmsnorm_": "allreduce_rmsnorm_(Tensor(a!) x, Tensor(b!) residual, Tensor? weight, float eps, int comm, "
                          "str path=\"auto\", float weight_offset=0.0) -> ()",
    # FP8 output: (q, residual_out, scales); scales is a new tensor also for a static scale (the kernel copies it).
    "add_rmsnorm_fp8": "add_rmsnorm_fp8(Tensor x, Tensor? residual, Tensor? weight, float eps, float weight_offset=0.0, "
                       "Tensor? scale=None, int? group_size=None, ScalarType? fp8_dtype=None, str scales_format=\"fp32\", "
                       "bool scales_mn_major=False) -> (Tensor, Tensor, Tensor)",
    "allreduce_rmsnorm_fp8": "allreduce_rmsnorm_fp8(Tensor x, Tensor? residual, Tensor? weight, float eps, int comm, "
                             "str path=\"auto\", float weight_offset=0.0, Tensor? scale=None, int? group_size=None, "
                             "ScalarType? fp8_dtype=None, str scales_format=\"fp32\", bool scales_mn_major=False) "
                             "-> (Tensor, Tensor, Tensor)",
    # FP4 output: (values, residual_out, scales).
    "add_rmsnorm_fp4": "add_rmsnorm_fp4(Tensor x, Tensor? residual, Tensor? weight, float eps, float weight_offset=0.0, "
                       "str fp4_format=\"nvfp4\", Tensor? global_scale=None, bool scales_swizzled=False) "
                       "-> (Tensor, Tensor, Tensor)",
    "allreduce_rmsnorm_fp4": "allreduce_rmsnorm_fp4(Tensor x, Tensor? residual, Tensor? weight, float eps, int comm, "
                             "str path=\"auto\", float weight_offset=0.0, str fp4_format=\"nvfp4\", "
                             "Tensor? global_scale=None, bool scales_swizzled=False) -> (Tensor, Tensor, Tensor)",
    # Sequence parallelism: x holds every row, the outputs this rank's (Communicator.shard_rows).
    "reduce_scatter_rmsnorm": "reduce_scatter_rmsnorm(Tensor x, Tensor? residual, Tensor? weight, float eps, int comm, "
                              "float weight_offset=0.0) -> (Tensor, Tensor)",
    "reduce_scatter_rmsnorm_fp8": "reduce_scatter_rmsnorm_fp8(Tensor x, Tensor? residual, Tensor? weight, float eps, "
                                  "int comm, float weight_offset=0.0, Tensor? scale=None, int? group_size=None, "
                                  "ScalarType? fp8_dtype=None, str scales_format=\"fp32\", bool scales_mn_major=False) "
                             "-> (Tensor, Tensor, Tensor)",
    "all_gather": "all_gather(Tensor x, int comm, int rows) -> Tensor",
}


def register_torch_ops() -> None:
    """Defines torch.ops.fused_ar.* (importing this module did; the call documents the intent)."""


def _allreduce_rmsnorm(x: torch.Tensor, residual: Optional[torch.Tensor], weight: Optional[torch.Tensor], eps: float,
                       comm: int, path: str = "auto", weight_offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, residual_out) = Communicator(comm).allreduce_rmsnorm(x, residual, weight, eps, ...)."""
    return lookup(comm).allreduce_rmsnorm(x, residual, weight, eps, weight_offset=weight_offset, path=path)


def _allreduce(x: torch.Tensor, comm: int, path: str = "auto") -> torch.Tensor:
    """Communicator(comm).allreduce(x, path=path)."""
    return lookup(comm).allreduce(x, path=path)


def _add_rmsnorm(x: torch.Tensor, residual: Optional[torch.Tensor], weight: Optional[torch.Tensor], eps: float,
                 weight_offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, residual_out) = fused_ar.add_rmsnorm(x, residual, weight, eps, weight_offset=...)."""
    return add_rmsnorm(x, residual, weight, eps, weight_offset=weight_offset)


def _add_rmsnorm_(x: torch.Tensor, residual: torch.Tensor, weight: Optional[torch.Tensor], eps: float,
                  weight_offset: float = 0.0) -> None:
    add_rmsnorm(x, residual, weight, eps, weight_offset=weight_offset, out=x, residual_out=residual)


def _allreduce_rmsnorm_(x: torch.Tensor, residual: torch.Tensor, weight: Optional[torch.Tensor], eps: float, comm: int,
                        path: str = "auto", weight_offset: float = 0.0) -> None:
    lookup(comm).allreduce_rmsnorm(x, residual, weight, eps, weight_offset=weight_offset, path=path, out=x,
                                   residual_out=residual)


def _scale_copy(scale: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The scales_out of a static scale: an op's output never aliases an input, so the kernel writes the scale's
    value into a new tensor (a copy kernel of its own cost an eager call a launch)."""
    return None if scale is None else torch.empty_like(scale)


def _add_rmsnorm_fp8(x: torch.Tensor, residual: Optional[torch.Tensor], weight: Optional[torch.Tensor], eps: float,
                     weight_offset: float = 0.0, scale: Optional[torch.Tensor] = None, group_size: Optional[int] = None,
                     fp8_dtype: Optional[torch.dtype] = None, scales_format: str = "fp32",
                     scales_mn_major: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, residual_out, scales) = fused_ar.add_rmsnorm_fp8(...)."""
    return add_rmsnorm_fp8(x, residual, weight, eps, weight_offset=weight_offset, scale=scale, group_size=group_size,
                           fp8_dtype=fp8_dtype, scales_format=scales_format, scales_mn_major=scales_mn_major,
                           scales_out=_scale_copy(scale))


def _allreduce_rmsnorm_fp8(x: torch.Tensor, residual: Optional[torch.Tensor], weight: Optional[torch.Tensor], eps: float,
                           comm: int, path: str = "auto", weight_offset: float = 0.0,
                           scale: Optional[torch.Tensor] = None, group_size: Optional[int] = None,
                           fp8_dtype: Optional[torch.dtype] = None, scales_format: str = "fp32",
                           scales_mn_major: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, residual_out, scales) = Communicator(comm).allreduce_rmsnorm_fp8(...)."""
    return lookup(comm).allreduce_rmsnorm_fp8(
        x, residual, weight, eps, weight_offset=weight_offset, scale=scale, group_size=group_size,
        fp8_dtype=fp8_dtype, scales_format=scales_format, scales_mn_major=scales_mn_major, path=path,
        scales_out=_scale_copy(scale))


def _add_rmsnorm_fp4(x: torch.Tensor, residual: Optional[torch.Tensor], weight: Optional[torch.Tensor], eps: float,
                     weight_offset: float = 0.0, fp4_format: str = "nvfp4", global_scale: Optional[torch.Tensor] = None,
                     scales_swizzled: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(values, residual_out, scales) = fused_ar.add_rmsnorm_fp4(...)."""
    return add_rmsnorm_fp4(x, residual, weight, eps, weight_offset=weight_offset, fp4_format=fp4_format,
                           global_scale=global_scale, scales_swizzled=scales_swizzled)


def _allreduce_rmsnorm_fp4(x: torch.Tensor, residual: Optional[torch.Tensor], weight: Optional[torch.Tensor], eps: float,
                           comm: int, path: str = "auto", weight_offset: float = 0.0, fp4_format: str = "nvfp4",
                           global_scale: Optional[torch.Tensor] = None,
                           scales_swizzled: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(values, residual_out, scales) = Communicator(comm).allreduce_rmsnorm_fp4(...)."""
    return lookup(comm).allreduce_rmsnorm_fp4(x, residual, weight, eps, weight_offset=weight_offset, path=path,
                                              fp4_format=fp4_format, global_scale=global_scale,
                                              scales_swizzled=scales_swizzled)


def _reduce_scatter_rmsnorm(x: torch.Tensor, residual: Optional[torch.Tensor], weight: Optional[torch.Tensor],
                            eps: float, comm: int, weight_offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, residual_out) = Communicator(comm).reduce_scatter_rmsnorm(x, residual, weight, eps, ...)."""
    return lookup(comm).reduce_scatter_rmsnorm(x, residual, weight, eps, weight_offset=weight_offset)


def _reduce_scatter_rmsnorm_fp8(x: torch.Tensor, residual: Optional[torch.Tensor], weight: Optional[torch.Tensor],
                                eps: float, comm: int, weight_offset: float = 0.0, scale: Optional[torch.Tensor] = None,
                                group_size: Optional[int] = None, fp8_dtype: Optional[torch.dtype] = None,
                                scales_format: str = "fp32", scales_mn_major: bool = False
                                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, residual_out, scales) = Communicator(comm).reduce_scatter_rmsnorm_fp8(...)."""
    return lookup(comm).reduce_scatter_rmsnorm_fp8(
        x, residual, weight, eps, weight_offset=weight_offset, scale=scale, group_size=group_size,
        fp8_dtype=fp8_dtype, scales_format=scales_format, scales_mn_major=scales_mn_major,
        scales_out=_scale_copy(scale))


def _all_gather(x: torch.Tensor, comm: int, rows: int) -> torch.Tensor:
    """Communicator(comm).all_gather(x, rows)."""
    return lookup(comm).all_gather(x, rows)


def _shard_of(x: torch.Tensor, comm: int) -> torch.Tensor:
    """An empty tensor of x's dtype with this rank's rows of x (symbolic sizes stay symbolic)."""
    c = lookup(comm)
    m = x.shape[0]
    per = (m + c.world_size - 1) // c.world_size
    rows = torch.sym_max(torch.sym_min(m - c.rank * per, per), 0)
    return x.new_empty((rows, x.shape[1]))


def _fake_scatter(x: torch.Tensor, residual: Any, weight: Any, eps: float, comm: int, *rest: Any) -> tuple:
    return _shard_of(x, comm), _shard_of(x, comm)


def _fake_gather(x: torch.Tensor, comm: int, rows: int) -> torch.Tensor:
    return x.new_empty((rows, x.shape[1]))


def _fp8_outputs(x: torch.Tensor, scale: Any, group_size: Any, fp8_dtype: Any, scales_format: Any,
                 scales_mn_major: Any) -> tuple:
    """The (q, residual_out, scales) an FP8 call on rows x returns, as empty tensors of their layouts."""
    from .device.launch import arch_of
    from .jit.spec import DType, native_fp8
    from .device.validate import check_quant

    # the device's native format only where none is named (tracing may run without the device)
    native = native_fp8(arch_of(x.device.index)) if fp8_dtype is None else None
    quant = check_quant(x, x.shape[-1], DType.parse(x.dtype), scale, group_size, fp8_dtype, native, scales_format,
                        scales_mn_major)
    scales = torch.empty_like(scale) if scale is not None else quant.new_scales(x.device)  # as _scale_copy
    return quant.new_out(x), torch.empty_like(x), scales


def _fp4_outputs(x: torch.Tensor, fp4_format: Any, global_scale: Any, scales_swizzled: Any) -> tuple:
    from .device.validate import check_fp4

    quant = check_fp4(x, x.shape[-1], fp4_format, scales_swizzled, global_scale)
    return quant.new_out(x), torch.empty_like(x), quant.new_scales(x.device)


# The fakes take the ops' own signatures: torch passes what the caller passed, defaults left out.
def _fake_fp8(x: torch.Tensor, residual: Any, weight: Any, eps: float, weight_offset: float = 0.0, scale: Any = None,
              group_size: Any = None, fp8_dtype: Any = None, scales_format: str = "fp32",
              scales_mn_major: bool = False) -> tuple:
    return _fp8_outputs(x, scale, group_size, fp8_dtype, scales_format, scales_mn_major)


def _fake_allreduce_fp8(x: torch.Tensor, residual: Any, weight: Any, eps: float, comm: int, path: str = "auto",
                        weight_offset: float = 0.0, scale: Any = None, group_size: Any = None, fp8_dtype: Any = None,
                        scales_format: str = "fp32", scales_mn_major: bool = False) -> tuple:
    return _fp8_outputs(x, scale, group_size, fp8_dtype, scales_format, scales_mn_major)


def _fake_scatter_fp8(x: torch.Tensor, residual: Any, weight: Any, eps: float, comm: int, weight_offset: float = 0.0,
                      scale: Any = None, group_size: Any = None, fp8_dtype: Any = None, scales_format: str = "fp32",
                      scales_mn_major: bool = False) -> tuple:
    return _fp8_outputs(_shard_of(x, comm), scale, group_size, fp8_dtype, scales_format, scales_mn_major)


def _fake_fp4(x: torch.Tensor, residual: Any, weight: Any, eps: float, weight_offset: float = 0.0,
              fp4_format: str = "nvfp4", global_scale: Any = None, scales_swizzled: bool = False) -> tuple:
    return _fp4_outputs(x, fp4_format, global_scale, scales_swizzled)


def _fake_allreduce_fp4(x: torch.Tensor, residual: Any, weight: Any, eps: float, comm: int, path: str = "auto",
                        weight_offset: float = 0.0, fp4_format: str = "nvfp4", global_scale: Any = None,
                        scales_swizzled: bool = False) -> tuple:
    return _fp4_outputs(x, fp4_format, global_scale, scales_swizzled)


def _fake_pair(x: torch.Tensor, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), torch.empty_like(x)


def _fake_one(x: torch.Tensor, *args: Any) -> torch.Tensor:
    return torch.empty_like(x)


def _fake_none(*args: Any) -> None:
    return None


_KERNELS = {"allreduce_rmsnorm": (_allreduce_rmsnorm, _fake_pair), "allreduce": (_allreduce, _fake_one),
            "add_rmsnorm": (_add_rmsnorm, _fake_pair), "add_rmsnorm_": (_add_rmsnorm_, _fake_none),
            "allreduce_rmsnorm_": (_allreduce_rmsnorm_, _fake_none),
            "add_rmsnorm_fp8": (_add_rmsnorm_fp8, _fake_fp8), "allreduce_rmsnorm_fp8": (_allreduce_rmsnorm_fp8, _fake_allreduce_fp8),
            "add_rmsnorm_fp4": (_add_rmsnorm_fp4, _fake_fp4), "allreduce_rmsnorm_fp4": (_allreduce_rmsnorm_fp4, _fake_allreduce_fp4),
            "reduce_scatter_rmsnorm": (_reduce_scatter_rmsnorm, _fake_scatter),
            "reduce_scatter_rmsnorm_fp8": (_reduce_scatter_rmsnorm_fp8, _fake_scatter_fp8),
            "all_gather": (_all_gather, _fake_gather)}

_library = torch.library.Library("fused_ar", "DEF")
for _name, _schema in SCHEMAS.items():
    _kernel, _fake = _KERNELS[_name]
    _library.define(_schema)
    _library.impl(_name, _kernel, "CUDA")
    torch.library.register_fake(f"fused_ar::{_name}", _fake, lib=_library)

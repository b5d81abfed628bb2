"""torch.ops.fused_ar.*: the ops as torch library ops with fake implementations, so a model compiled with
torch.compile (fullgraph) keeps them as single calls and can be captured into CUDA graphs.

Defined with `torch.library.Library` (schema, a CUDA kernel, a fake kernel) rather than
`torch.library.custom_op`, whose Python-level autograd and aliasing wrappers cost about 20 us per call
(measured against the direct call: the Library route adds about 3 us, the dispatcher's own cost). The ops
are functional (they allocate and return their outputs) and need no autograd.

A communicator is named by its integer `handle` (torch ops take no Python objects); every Communicator
registers itself here when created and leaves when closed. Importing this module defines the ops once
per process (`fused_ar.register_torch_ops()` does it explicitly; creating a Communicator does it too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch

from .errors import InputError

if TYPE_CHECKING:
    from .communicator import Communicator

_communicators: dict[int, "Communicator"] = {}

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
}


def register_torch_ops() -> None:
    """Defines torch.ops.fused_ar.* (importing this module did; the call documents the intent)."""


def register(comm: "Communicator") -> None:
    _communicators[comm.handle] = comm


def unregister(comm: "Communicator") -> None:
    _communicators.pop(comm.handle, None)


def lookup(handle: int) -> "Communicator":
    comm = _communicators.get(handle)
    if comm is None:
        raise InputError(f"comm={handle}: no open fused_ar Communicator has this handle (closed, or from "
                         "another process?)")
    return comm


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
    from .ops import add_rmsnorm

    return add_rmsnorm(x, residual, weight, eps, weight_offset=weight_offset)


def _add_rmsnorm_(x: torch.Tensor, residual: torch.Tensor, weight: Optional[torch.Tensor], eps: float,
                  weight_offset: float = 0.0) -> None:
    from .ops import add_rmsnorm

    add_rmsnorm(x, residual, weight, eps, weight_offset=weight_offset, out=x, residual_out=residual)


def _allreduce_rmsnorm_(x: torch.Tensor, residual: torch.Tensor, weight: Optional[torch.Tensor], eps: float, comm: int,
                        path: str = "auto", weight_offset: float = 0.0) -> None:
    lookup(comm).allreduce_rmsnorm(x, residual, weight, eps, weight_offset=weight_offset, path=path, out=x,
                                   residual_out=residual)


def _fake_pair(x: torch.Tensor, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), torch.empty_like(x)


def _fake_one(x: torch.Tensor, *args: Any) -> torch.Tensor:
    return torch.empty_like(x)


def _fake_none(*args: Any) -> None:
    return None


_KERNELS = {"allreduce_rmsnorm": (_allreduce_rmsnorm, _fake_pair), "allreduce": (_allreduce, _fake_one),
            "add_rmsnorm": (_add_rmsnorm, _fake_pair), "add_rmsnorm_": (_add_rmsnorm_, _fake_none),
            "allreduce_rmsnorm_": (_allreduce_rmsnorm_, _fake_none)}

_library = torch.library.Library("fused_ar", "DEF")
for _name, _schema in SCHEMAS.items():
    _kernel, _fake = _KERNELS[_name]
    _library.define(_schema)
    _library.impl(_name, _kernel, "CUDA")
    torch.library.register_fake(f"fused_ar::{_name}", _fake, lib=_library)

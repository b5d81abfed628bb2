"""torch.ops.fused_ar.*: the ops as torch.library custom ops with fake implementations, so a model compiled
with torch.compile (fullgraph) keeps them as single calls and can be captured into CUDA graphs.

A communicator is named by its integer `handle` (torch ops take no Python objects); every Communicator
registers itself here when created and leaves when closed. Importing this module defines the ops once
per process (`fused_ar.register_torch_ops()` does it explicitly; creating a Communicator does it too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .errors import InputError

if TYPE_CHECKING:
    from .communicator import Communicator

_communicators: dict[int, "Communicator"] = {}


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


@torch.library.custom_op("fused_ar::allreduce_rmsnorm", mutates_args=(), device_types="cuda")
def allreduce_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, comm: int,
                      path: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """(out, residual_out) = Communicator(comm).allreduce_rmsnorm(x, residual, weight, eps, path=path)."""
    return lookup(comm).allreduce_rmsnorm(x, residual, weight, eps, path=path)


@allreduce_rmsnorm.register_fake
def _(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, comm: int,
      path: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), torch.empty_like(x)


@torch.library.custom_op("fused_ar::allreduce", mutates_args=(), device_types="cuda")
def allreduce(x: torch.Tensor, comm: int, path: str = "auto") -> torch.Tensor:
    """Communicator(comm).allreduce(x, path=path)."""
    return lookup(comm).allreduce(x, path=path)


@allreduce.register_fake
def _(x: torch.Tensor, comm: int, path: str = "auto") -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("fused_ar::add_rmsnorm", mutates_args=(), device_types="cuda")
def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, residual_out) = fused_ar.add_rmsnorm(x, residual, weight, eps)."""
    from .ops import add_rmsnorm as op

    return op(x, residual, weight, eps)


@add_rmsnorm.register_fake
def _(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
      eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), torch.empty_like(x)

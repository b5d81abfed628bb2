"""`Communicator`: one tensor-parallel group's fused AllReduce + residual add + RMSNorm, and AllReduce.

Owns this rank's IPC memory (fused_ar.ipc), its view of the peers, and the per-call choices (path, grid).
Group I/O happens in two named steps, `_allocate` and `_connect`; `local_group` builds N ranks in one
process on one GPU with the same memory, kernels and launches (only the handle exchange differs).
"""

from __future__ import annotations

import math
import os
import socket
from typing import Any, Optional

from . import env
from .errors import FusedArError, InputError
from .ipc import PeerView, RankMemory, close_peers, export_handles, import_peers
from .kernels import (ALLREDUCE_1STAGE, ALLREDUCE_2STAGE, ALLREDUCE_RMSNORM_1STAGE, ALLREDUCE_RMSNORM_2STAGE,
                      CROSS_GPU_NGPUS, MAX_BLOCKS, TWO_STAGE_BLOCK, add_rmsnorm_block)
from .launch import function, launch, spec_for
from .policy import use_two_stage
from .runtime import current_runtime
from .spec import DEFAULT_PACK, DType, KernelSpec
from .validate import check_devices, check_outputs, check_rmsnorm_inputs, check_rows

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
PLAIN_BLOCK = 256


class Communicator:
    """One per tensor-parallel group per process. All ranks of `group` must construct it together.

    group: a torch.distributed process group (default: the world); handles travel over it (gloo or any
    backend that can all_gather Python objects). device: this rank's GPU (default: the current one).
    max_bytes: the largest input per call, in bytes per rank.
    """

    def __init__(self, group: Any = None, device: Optional[int] = None, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        import torch
        import torch.distributed as dist

        group = group if group is not None else dist.group.WORLD
        self._init_fields(dist.get_rank(group), dist.get_world_size(group),
                          torch.cuda.current_device() if device is None else int(device), max_bytes)
        self._allocate()
        try:
            self._connect(group)
        except BaseException:
            self.close()
            raise

    # -- construction steps ---------------------------------------------------------------------------
    def _init_fields(self, rank: int, world: int, device: int, max_bytes: int) -> None:
        if world not in CROSS_GPU_NGPUS:
            raise InputError(f"group of {world} ranks: the cross-GPU kernels take {CROSS_GPU_NGPUS} ranks")
        if not isinstance(max_bytes, int) or max_bytes <= 0:
            raise InputError(f"max_bytes={max_bytes!r} must be a positive int")
        self.rank, self.world_size, self.device = rank, world, device
        self.max_bytes = max_bytes
        self._runtime = current_runtime()
        self._mem: Optional[RankMemory] = None
        self._view: Optional[PeerView] = None
        self._ranks_per_device = 1
        self._grid_caps: dict[KernelSpec, int] = {}
        self._timeout_ns = int(env.TIMEOUT_S.get() * 1e9)
        self.closed = False

    def _allocate(self) -> None:
        self._mem = RankMemory.allocate(self._runtime, self.device, self.max_bytes)

    def _connect(self, group: Any) -> None:
        """Exchanges (handles, max_bytes, host, device) over `group` and opens the peers' memory."""
        import torch
        import torch.distributed as dist

        me = {"handles": export_handles(self._runtime, self._mem), "max_bytes": self._mem.max_bytes,
              "host": socket.gethostname(), "device": str(torch.cuda.get_device_properties(self.device).uuid),
              "pid": os.getpid()}
        everyone: list[Any] = [None] * self.world_size
        dist.all_gather_object(everyone, me, group=group)
        for peer, info in enumerate(everyone):
            if info["max_bytes"] != me["max_bytes"]:
                raise InputError(f"rank {peer} has max_bytes={info['max_bytes']}, rank {self.rank} "
                                 f"{me['max_bytes']}: all ranks must pass the same max_bytes")
            if info["host"] != me["host"]:
                raise FusedArError(f"rank {peer} is on host {info['host']!r}, rank {self.rank} on {me['host']!r}: "
                                   "the IPC kernels serve one node")
        self._ranks_per_device = sum(1 for info in everyone if info["device"] == me["device"])
        self._set_view(import_peers(self._runtime, self.rank, self._mem, [i["handles"] for i in everyone],
                                    self._mem.max_bytes))

    def _set_view(self, view: PeerView) -> None:
        self._view = view
        self._runtime.copy_to_device(self._mem.table, view.table_bytes(), self.device)

    @classmethod
    def local_group(cls, world_size: int, device: Optional[int] = None,
                    max_bytes: int = DEFAULT_MAX_BYTES) -> list["Communicator"]:
        """N ranks in this process on one GPU, each with its own memory; the caller gives each rank its own
        stream (kernels of all ranks must be in flight together). For tests, demos and benchmarks. Set
        CUDA_DEVICE_MAX_CONNECTIONS to at least N + 1 (32 is the most) before CUDA starts, so no two rank
        streams share a hardware queue (the default 8 can serialize one rank behind another's spin), and
        create every output (out=, residual_out=) before the first rank's call: one thread launches all
        ranks, so a host call that waits on the GPU between two ranks' launches (a fresh device allocation
        can) leaves the launched ranks spinning until FUSED_AR_TIMEOUT_S."""
        import torch

        device = torch.cuda.current_device() if device is None else int(device)
        comms: list[Communicator] = []
        try:
            for rank in range(world_size):
                comm = cls.__new__(cls)
                comm._init_fields(rank, world_size, device, max_bytes)
                comms.append(comm)
                comm._allocate()
            mems = [c._mem for c in comms]
            for comm in comms:
                comm._ranks_per_device = world_size
                comm._set_view(PeerView([m.staging for m in mems], [m.tmp for m in mems],
                                        [m.signal for m in mems]))
        except BaseException:
            for comm in comms:
                comm.close()
            raise
        return comms

    # -- lifetime -----------------------------------------------------------------------------------------
    def close(self) -> None:
        """Releases the memory and the peer mappings. Idempotent; call after all work using it finished."""
        if getattr(self, "closed", True):
            return
        self.closed = True
        if self._view is not None:
            close_peers(self._runtime, self._view, self.device)
        if self._mem is not None:
            self._mem.free(self._runtime)

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"max_bytes={self.max_bytes}"
        return f"Communicator(rank {self.rank}/{self.world_size}, cuda:{self.device}, {state})"

    def error_code(self) -> int:
        """The device error word: 0, or the first barrier wait that timed out (see describe_error)."""
        return self._runtime.read_u32(self._mem.error_word, self.device)

    @staticmethod
    def describe_error(code: int) -> str:
        """Decodes fa_peers.h's error word: which block waited for which rank at which barrier."""
        if not code:
            return "no error"
        phase = ("start", "mid", "end")[(code >> 8) & 0xF] if (code >> 8) & 0xF < 3 else "?"
        return f"block {(code >> 12) & 0xFFF} timed out at the {phase} barrier waiting for rank {code & 0xFF}"

    # -- ops ----------------------------------------------------------------------------------------------
    def allreduce_rmsnorm(self, x: Any, residual: Any, weight: Any, eps: float = 1e-6, *, path: str = "auto",
                          out: Optional[Any] = None, residual_out: Optional[Any] = None) -> tuple[Any, Any]:
        """(out, residual_out) of DESIGN.md section 1: x all-reduced over the group (fp32, rank order),
        rounded to T, plus residual, then RMSNorm * weight. Out-of-place; every rank calls it together
        with the same shape and path. Runs on torch's current stream."""
        import torch

        self._check_open()
        shape, eps = check_rmsnorm_inputs(x, residual, weight, eps)
        check_outputs({"x": x, "residual": residual, "weight": weight}, {"out": out, "residual_out": residual_out}, x)
        outputs = {k: v for k, v in (("out", out), ("residual_out", residual_out)) if v is not None}
        self._check_device(x=x, residual=residual, weight=weight, **outputs)
        nbytes = self._check_size(x)
        two_stage = use_two_stage(path, self._runtime.platform, self.world_size, nbytes)
        out = torch.empty_like(x) if out is None else out
        residual_out = torch.empty_like(x) if residual_out is None else residual_out
        if shape.rows == 0:
            return out, residual_out
        packs = shape.cols * shape.dtype.itemsize // DEFAULT_PACK
        if two_stage:
            spec = spec_for(ALLREDUCE_RMSNORM_2STAGE.op, shape.dtype, self.device, TWO_STAGE_BLOCK, self.world_size)
        else:
            spec = spec_for(ALLREDUCE_RMSNORM_1STAGE.op, shape.dtype, self.device, add_rmsnorm_block(packs),
                            self.world_size)
        stream = torch.cuda.current_stream(self.device).cuda_stream
        self._runtime.copy_async(self._mem.staging, x.data_ptr(), nbytes, stream)
        launch(spec, self.device, min(shape.rows, self._grid_cap(spec)),
               (self._mem.table, self.rank, out.data_ptr(), residual_out.data_ptr(), residual.data_ptr(),
                weight.data_ptr(), shape.rows, shape.cols, eps, self._timeout_ns), stream)
        return out, residual_out

    def allreduce(self, x: Any, *, path: str = "auto", out: Optional[Any] = None) -> Any:
        """T(sum over the group of x, fp32, rank order), any shape with a multiple of 16 bytes in all."""
        import torch

        self._check_open()
        if isinstance(x, torch.Tensor) and not x.is_contiguous():
            raise InputError(f"x with shape {tuple(x.shape)} and strides {x.stride()} is not contiguous")
        if not (isinstance(x, torch.Tensor) and x.numel() == 0):  # an empty x is valid and moves nothing
            check_rows("x", x.reshape(-1) if isinstance(x, torch.Tensor) else x)
        check_outputs({"x": x}, {"out": out}, x)
        self._check_device(x=x, **({"out": out} if out is not None else {}))
        nbytes = self._check_size(x)
        two_stage = use_two_stage(path, self._runtime.platform, self.world_size, nbytes)
        out = torch.empty_like(x) if out is None else out
        if x.numel() == 0:
            return out
        packs = nbytes // DEFAULT_PACK
        op = ALLREDUCE_2STAGE.op if two_stage else ALLREDUCE_1STAGE.op
        spec = spec_for(op, DType.parse(x.dtype), self.device, PLAIN_BLOCK, self.world_size)
        work = math.ceil(packs / self.world_size) if two_stage else packs
        stream = torch.cuda.current_stream(self.device).cuda_stream
        self._runtime.copy_async(self._mem.staging, x.data_ptr(), nbytes, stream)
        launch(spec, self.device, min(math.ceil(work / PLAIN_BLOCK), self._grid_cap(spec)),
               (self._mem.table, self.rank, out.data_ptr(), packs, self._timeout_ns), stream)
        return out

    # -- helpers ------------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise FusedArError(f"{self!r} is closed")

    def _check_device(self, **tensors: Any) -> None:
        check_devices(**tensors)
        first = next(iter(tensors.values()))
        if first.device.index != self.device:
            raise InputError(f"x is on {first.device} but this communicator serves cuda:{self.device}")

    def _check_size(self, x: Any) -> int:
        nbytes = x.numel() * x.element_size()
        if nbytes > self._mem.max_bytes:
            raise InputError(f"x has {nbytes} bytes ({tuple(x.shape)} {x.dtype}), over this communicator's "
                             f"max_bytes={self._mem.max_bytes}; create it with a larger max_bytes")
        return nbytes

    def _grid_cap(self, spec: KernelSpec) -> int:
        """Most blocks per launch: MAX_BLOCKS, and few enough that every rank sharing this GPU has all its
        blocks resident at once (a block spinning at a barrier must never wait for an unscheduled peer)."""
        cap = self._grid_caps.get(spec)
        if cap is None:
            import torch

            per_sm = self._runtime.max_active_blocks(function(spec, self.device), spec.block)
            sms = torch.cuda.get_device_properties(self.device).multi_processor_count
            # Ranks sharing a GPU in one process run concurrently: together they use at most half of it,
            # so kernels of other streams can never take the slots a spinning block's peer needs.
            share = 2 * self._ranks_per_device if self._ranks_per_device > 1 else 1
            cap = max(1, min(MAX_BLOCKS, per_sm * sms // share))
            self._grid_caps[spec] = cap
        return cap


"""`Communicator`: one tensor-parallel group's fused AllReduce + residual add + RMSNorm, and AllReduce.

Owns this rank's IPC memory (fused_ar.comm.ipc), its view of the peers, its graph tables (fused_ar.comm.graphs)
and the per-call choices (path, grid, fallback). Group I/O happens in named steps, `_allocate` and
`_connect`; `local_group` builds N ranks in one process on one GPU with the same memory, kernels and
launches (only the handle exchange differs). Every call first reads this rank's host-visible error
report (no device synchronization): a timeout or mismatch recorded by an earlier kernel raises there.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import os
import socket
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

from .. import env
from ..errors import FusedArError, InputError, UnsupportedShapeError
from .graphs import GraphBuffers, LocalHub
from .ipc import PeerView, RankMemory, close_peers, export_handles, import_peers
from ..jit.kernels import (ALLREDUCE_1STAGE, ALLREDUCE_2STAGE, ALLREDUCE_RMSNORM_1STAGE, ALLREDUCE_RMSNORM_2STAGE,
                      CROSS_GPU_NGPUS, MAX_BLOCKS, TWO_STAGE_BLOCK, allreduce_rmsnorm_block, warm_matrix)
from ..device.launch import arch_of, function, preload, spec_for
from ..device.plans import (CallPlan, allreduce_key, allreduce_pointers_ok, call_inputs, fp4_arguments, fp8_arguments,
                            input_addresses, is_capturing, plain_eps, plain_offset, quant_key, raw_stream, rmsnorm_key)
from . import registry
from .policy import DEFAULT_MAX_BYTES, FallbackLog, Path, choose_path, group_fallback_reason, overrides
from ..device.ops import (add_rmsnorm_into, check_fp8_aliasing, check_quant_values, quant_pointers, quant_tensors,
                          returned_scales)
from .report import pending_exception, read_error_word
from .sequence import SequenceParallel
from ..backends import current_runtime
from ..jit.spec import DEFAULT_PACK, DType, KernelSpec, native_fp8
from .thresholds import SizeRule, Thresholds
from .thresholds import load as load_thresholds
from ..device.validate import (QuantCall, RmsnormCall, check_devices, check_fp8_call, check_outputs,
                       check_rmsnorm_inputs, check_rows, cross_gpu_limit, device_index, require_gpu)

_ids = itertools.count(1)

PLAIN_BLOCK = 256


class Communicator(SequenceParallel):
    """One per tensor-parallel group per process. All ranks of `group` must construct it together.

    group: a torch.distributed process group (default: the world); handles travel over it (gloo or any
    backend that can all_gather Python objects). device_group: the group the fallback all-reduces over
    (NCCL on CUDA, RCCL on ROCm; default: `group`). device: this rank's GPU as torch takes it (an int,
    torch.device or "cuda:N"; default: the current one).
    max_bytes: the largest input per call, in bytes per rank, that takes the IPC kernels.
    fallback: False for a communicator that never hands a call to the collective (an engine adapter, which
    declines instead): what the kernels cannot serve raises UnsupportedShapeError or InputError.
    register_graph_inputs: False copies x into the staging buffer inside captured graphs too, instead of
    registering x's own address with the peers (memory that cannot be exported, as a cuMem graph pool's).

    The IPC kernels serve one node with working peer access (probed for real once, fused_ar.comm.probe); a
    group they cannot serve is served by the fallback for every call, with one log line saying why.
    """

    def __init__(self, group: Any = None, device: Any = None, max_bytes: int = DEFAULT_MAX_BYTES, *,
                 device_group: Any = None, fallback: bool = True, register_graph_inputs: bool = True) -> None:
        import torch.distributed as dist

        require_gpu("fused_ar.Communicator")
        device = device_index(device)
        group = group if group is not None else dist.group.WORLD
        self._init_fields(dist.get_rank(group), dist.get_world_size(group), device, max_bytes)
        self._group = group
        self._device_group = (device_group if device_group is not None else group) if fallback else None
        self._register_graph_inputs = bool(register_graph_inputs)
        try:
            everyone = self._gather_info(group)
            hosts = [info["host"] for info in everyone]
            self._fallback_reason = group_fallback_reason(hosts, self.world_size, CROSS_GPU_NGPUS)
            if self._fallback_reason is None:
                self._fallback_reason = group_fallback_reason(hosts, self.world_size, CROSS_GPU_NGPUS,
                                                              self._probe(group, everyone))
            if self._fallback_reason is None:
                self._allocate()
                self._connect(group, everyone)
        except BaseException:
            self.close()
            raise

    # -- construction steps ---------------------------------------------------------------------------
    def _init_fields(self, rank: int, world: int, device: int, max_bytes: int) -> None:
        if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes <= 0:
            raise InputError(f"max_bytes={max_bytes!r} must be a positive int")
        self.rank, self.world_size, self.device = rank, world, device
        self.max_bytes = max_bytes
        self.handle = next(_ids)  # names this communicator in torch.ops.fused_ar calls (fused_ar.comm.registry)
        registry.register(self)
        self._runtime = current_runtime()
        self._mem: Optional[RankMemory] = None
        self._view: Optional[PeerView] = None
        self._graphs: Optional[GraphBuffers] = None
        self._hub: Optional[LocalHub] = None
        self._group: Any = None
        self._device_group: Any = None
        self._fallback_reason: Optional[str] = None
        self._fallback_log = FallbackLog(rank)
        self._thresholds: Optional[Thresholds] = None
        self._size_rules: dict[tuple[Any, int], SizeRule] = {}
        self._failure: Optional[FusedArError] = None
        self._ranks_per_device = 1
        self._grid_caps: dict[KernelSpec, int] = {}
        self._plans: dict[tuple, CallPlan] = {}
        self._error_word: Optional[ctypes.c_uint32] = None  # this rank's report, read on every call
        self._register_graph_inputs = True
        self._timeout_s = env.TIMEOUT_S.get()
        self._timeout_ns = int(self._timeout_s * 1e9)
        self.closed = False

    def _gather_info(self, group: Any) -> list[dict[str, Any]]:
        import torch
        import torch.distributed as dist

        stored = load_thresholds(arch_of(self.device), self.world_size)
        me = {"max_bytes": self.max_bytes, "host": socket.gethostname(), "pid": os.getpid(),
              "device": str(torch.cuda.get_device_properties(self.device).uuid),
              "thresholds": stored.to_dict() if stored is not None else None}
        everyone: list[Any] = [None] * self.world_size
        dist.all_gather_object(everyone, me, group=group)
        # Rank 0's measured thresholds serve every rank: the path must be the same on all of them.
        if everyone[0]["thresholds"] is not None:
            self._thresholds = Thresholds.from_dict(everyone[0]["thresholds"])
        for peer, info in enumerate(everyone):
            if info["max_bytes"] != me["max_bytes"]:
                raise InputError(f"rank {peer} has max_bytes={info['max_bytes']}, rank {self.rank} "
                                 f"{me['max_bytes']}: all ranks must pass the same max_bytes")
        self._ranks_per_device = sum(1 for info in everyone if info["device"] == me["device"])
        return everyone

    def _probe(self, group: Any, everyone: list[dict[str, Any]]) -> list[tuple[bool, str]]:
        """Each rank probes the group's GPUs it can see (once per node: the verdict is cached on disk);
        every rank gets every verdict."""
        import torch
        import torch.distributed as dist

        from .probe import peer_access

        if not env.PEER_PROBE.get():
            verdict: tuple[bool, str] = (True, "not probed (FUSED_AR_PEER_PROBE=0)")
        else:
            uuids = {info["device"] for info in everyone}
            visible = [d for d in range(torch.cuda.device_count())
                       if str(torch.cuda.get_device_properties(d).uuid) in uuids]
            verdict = peer_access(visible)
        verdicts: list[Any] = [None] * self.world_size
        dist.all_gather_object(verdicts, verdict, group=group)
        return verdicts

    def _allocate(self) -> None:
        self._mem = RankMemory.allocate(self._runtime, self.device, self.max_bytes)
        self._error_word = ctypes.c_uint32.from_address(self._mem.report_host)
        self._graphs = GraphBuffers(self._runtime, self._mem, local=self._group is None)

    def _connect(self, group: Any, everyone: list[dict[str, Any]]) -> None:
        """Exchanges the IPC handles over `group` and opens the peers' memory."""
        import torch.distributed as dist

        handles: list[Any] = [None] * self.world_size
        dist.all_gather_object(handles, export_handles(self._runtime, self._mem), group=group)
        self._set_view(import_peers(self._runtime, self.rank, self._mem, handles, self._mem.max_bytes))

    def _set_view(self, view: PeerView) -> None:
        self._view = view
        self._runtime.copy_to_device(self._mem.table, view.table_bytes(self._mem.report_dev), self.device)
        self._graphs.prefill(view)

    @classmethod
    def local_group(cls, world_size: int, device: Any = None,
                    max_bytes: int = DEFAULT_MAX_BYTES) -> list["Communicator"]:
        """N ranks in this process on one GPU, each with its own memory; the caller gives each rank its own
        stream (kernels of all ranks must be in flight together). For tests, demos and benchmarks. Set
        CUDA_DEVICE_MAX_CONNECTIONS to at least N + 1 (32 is the most) before CUDA starts, so no two rank
        streams share a hardware queue (the default 8 can serialize one rank behind another's spin), and
        create every output (out=, residual_out=) before the first rank's call: one thread launches all
        ranks, so a host call that waits on the GPU between two ranks' launches (a fresh device allocation
        can) leaves the launched ranks spinning until FUSED_AR_TIMEOUT_S. So can a kernel queued on one rank's
        stream between two of its collectives: while the other ranks' blocks spin at the next barrier (spread
        over every SM), a kernel that needs an SM's whole register file never starts; run other kernels after
        every rank's collective (join the streams). Loading a kernel is such a call
        (it waits for the whole device): the group loads every cross-GPU kernel of its size and every
        add_rmsnorm kernel here, before any rank can launch (compiling the ones not in the disk cache;
        `python -m fused_ar warm` ahead makes this quick). A local group has no device group: calls the
        IPC kernels cannot serve raise InputError instead of taking the fallback."""
        if world_size not in CROSS_GPU_NGPUS:
            raise InputError(f"local_group({world_size}): the cross-GPU kernels take {list(CROSS_GPU_NGPUS)} ranks")
        require_gpu("fused_ar.Communicator.local_group")
        device = device_index(device)
        preload(warm_matrix([arch_of(device)], list(DType), [1, world_size]), device)
        hub = LocalHub(world_size)
        stored = load_thresholds(arch_of(device), world_size)
        comms: list[Communicator] = []
        try:
            for rank in range(world_size):
                comm = cls.__new__(cls)
                comm._init_fields(rank, world_size, device, max_bytes)
                comm._ranks_per_device = world_size
                comm._hub = hub
                comm._thresholds = stored
                comms.append(comm)
                comm._allocate()
            mems = [c._mem for c in comms]
            for comm in comms:
                comm._set_view(PeerView([m.staging for m in mems], [m.tmp for m in mems],
                                        [m.signal for m in mems]))
                hub.join(comm.rank, comm._apply_graph_records)
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
        self._error_word = None  # the host memory behind it is freed below
        registry.unregister(self)
        if self._graphs is not None:
            self._graphs.close()
        if self._view is not None:
            close_peers(self._runtime, self._view, self.device)
        if self._mem is not None:
            self._mem.free(self._runtime)

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.closed:
            state = "closed"
        elif self._failure is not None:
            state = "failed"
        elif self._fallback_reason is not None:
            state = "fallback only"
        else:
            state = f"max_bytes={self.max_bytes}"
        return f"Communicator(rank {self.rank}/{self.world_size}, cuda:{self.device}, {state})"

    @property
    def fallback_reason(self) -> Optional[str]:
        """Why every call of this communicator takes the fallback (the group), or None."""
        return self._fallback_reason

    def error_code(self) -> int:
        """This rank's recorded error word (0: none); read from host memory, no device synchronization."""
        return read_error_word(self._mem.report_host) if self._mem is not None else 0

    def check(self) -> None:
        """Raises what this rank's kernels recorded so far (PeerTimeoutError, MismatchError), or that the
        communicator failed earlier or is closed. Calls check on their own; after a synchronize, this
        reports the last call's outcome without waiting for the next one."""
        if self._error_word is not None and not self._error_word.value and self._failure is None and not self.closed:
            return  # the common case, first
        if self.closed:
            raise FusedArError(f"{self!r} is closed")
        if self._failure is not None:
            raise FusedArError(f"{self!r} failed earlier and refuses further calls; create a new one. The "
                               f"failure: {self._failure}") from self._failure
        if self._mem is not None:
            failure = pending_exception(self._mem.report_host, self.rank, self._timeout_s)
            if failure is not None:
                self._failure = failure
                raise failure

    # -- graph capture --------------------------------------------------------------------------------
    @contextmanager
    def capture(self) -> Iterator["Communicator"]:
        """`with comm.capture(): <capture graphs>`: registers the captured calls' inputs with every peer on
        exit (collective: every rank of the group leaves it together). Without it, the first eager call
        after a capture registers them; a graph replayed before registration records an error instead of
        reading unregistered memory."""
        yield self
        self.register_graph_buffers()

    def register_graph_buffers(self) -> None:
        """Exchanges the captured calls' input addresses and writes their peer tables. Collective over the
        group (a local group: once every rank has called it, the last call writes all ranks' tables)."""
        self.check()
        if self._graphs is None:
            return
        records = list(self._graphs.pending)
        if self._hub is not None:
            self._hub.submit(self.rank, records)
            return
        import torch.distributed as dist

        everyone: list[Any] = [None] * self.world_size
        dist.all_gather_object(everyone, records, group=self._group)
        self._apply_graph_records(everyone)

    def _apply_graph_records(self, everyone: list[list[Any]]) -> None:
        self._graphs.apply(self.rank, self._view, everyone)

    def _peer_table(self, x: int, plan: CallPlan, stream: int, stage: bool = False) -> tuple[int, int]:
        """(peer table, stage_src) of this call (x: its input's address): a graph table naming x itself while
        capturing, else the eager one with x in the staging buffer: copied by the kernel itself (stage_src = x)
        where x is contiguous aligned rows, else (`stage`: it is not, or this call writes its output over x,
        which the kernel's blocks would race on) copied here first (stage_src 0). Also while capturing where
        peers cannot map x."""
        if is_capturing():
            table = None if stage or not self._register_graph_inputs else self._graphs.record(x)
            if table is not None:
                return table, 0
        elif self._graphs.pending:
            self.register_graph_buffers()
        if not stage:
            return self._mem.table, x
        rows, row_bytes, pitch = plan.x_layout
        self._stage(self._mem.staging, x, rows, row_bytes, pitch, stream)
        return self._mem.table, 0

    def _stage(self, dst: int, src: int, rows: int, row_bytes: int, pitch: int, stream: int) -> None:
        """Copies `rows` rows of `row_bytes` (`pitch` apart at src) to dst, packed, on `stream`."""
        if pitch == row_bytes:
            self._runtime.copy_async(dst, src, rows * row_bytes, stream)
        else:
            self._runtime.copy_rows(dst, row_bytes, src, pitch, row_bytes, rows, stream)

    # -- ops ----------------------------------------------------------------------------------------------
    def allreduce_rmsnorm(self, x: Any, residual: Optional[Any], weight: Optional[Any], eps: float = 1e-6, *,
                          weight_offset: float = 0.0, path: str = "auto", out: Optional[Any] = None,
                          residual_out: Optional[Any] = None) -> tuple[Any, Any]:
        """(out, residual_out) of docs/design.md sections 1 and 1b: x all-reduced over the group (fp32, rank
        order), rounded to T, plus residual (none: residual_out is the all-reduced x), then RMSNorm * (weight +
        weight_offset). Takes what fused_ar.add_rmsnorm takes (row strides, an fp32 or absent weight, out=x
        and residual_out=residual in place); every rank calls it together with the same shape and path. Runs
        on torch's current stream."""
        out, residual_out, _ = self._rmsnorm(x, residual, weight, eps, weight_offset, path, out, residual_out, None)
        return out, residual_out

    def allreduce_rmsnorm_fp8(self, x: Any, residual: Optional[Any], weight: Optional[Any], eps: float = 1e-6, *,
                              weight_offset: float = 0.0, scale: Optional[Any] = None, group_size: Optional[int] = None,
                              fp8_dtype: Any = None, scales_format: str = "fp32", scales_mn_major: bool = False,
                              path: str = "auto", out: Optional[Any] = None, residual_out: Optional[Any] = None,
                              scales_out: Optional[Any] = None) -> tuple[Any, Any, Any]:
        """(q, residual_out, scales): allreduce_rmsnorm's out quantized to FP8 in the same kernel, with the
        scales of fused_ar.add_rmsnorm_fp8 (static, per row or per group, in its scales formats and layouts)
        and its exactness: q and the scales are bit for bit torch's quantization of the out
        allreduce_rmsnorm returns."""
        fp8 = fp8_arguments(scale, group_size, fp8_dtype, scales_format, scales_mn_major, scales_out)
        return self._rmsnorm(x, residual, weight, eps, weight_offset, path, out, residual_out, fp8)

    def allreduce_rmsnorm_fp4(self, x: Any, residual: Optional[Any], weight: Optional[Any], eps: float = 1e-6, *,
                              fp4_format: str = "nvfp4", global_scale: Optional[Any] = None,
                              scales_swizzled: bool = False, weight_offset: float = 0.0, path: str = "auto",
                              out: Optional[Any] = None, residual_out: Optional[Any] = None,
                              scales_out: Optional[Any] = None) -> tuple[Any, Any, Any]:
        """(values, residual_out, scales): allreduce_rmsnorm's out quantized to FP4 (NVFP4 or MXFP4) in the same
        kernel, as fused_ar.add_rmsnorm_fp4 quantizes (its formats, scale layouts and exactness: the bytes of
        the reference quantization of the out allreduce_rmsnorm returns)."""
        fp8 = fp4_arguments(fp4_format, global_scale, scales_swizzled, scales_out)
        return self._rmsnorm(x, residual, weight, eps, weight_offset, path, out, residual_out, fp8)

    def _rmsnorm_plan(self, checked: Any, x: Any, residual: Any, weight: Any, eps: Any, offset: Any, path: str,
                      out: Any, residual_out: Any, fp8: Optional[dict]) -> tuple[CallPlan, Any, Any, tuple]:
        """(plan, eps, weight offset, input addresses) of an add + RMSNorm op (`checked`: its full checks, which
        make and keep the plan of its key): the kept plan where this call's pointers pass its per-call checks."""
        try:
            key = (rmsnorm_key(x, residual, weight, out, residual_out), path, overrides(),
                   None if fp8 is None else quant_key(fp8), checked.__name__)
            plan = self._plans.get(key)
        except (AttributeError, TypeError):  # not a tensor, or an argument that cannot key: the full checks say so
            key, plan = None, None
        if plan is not None and plain_eps(eps) and plain_offset(offset):
            inputs = call_inputs(plan, x, residual, weight, out, residual_out, *quant_pointers(fp8))
            if inputs is not None:
                return plan, eps, offset, inputs
        plan, eps, offset = checked(key, x, residual, weight, eps, offset, path, out, residual_out, fp8)
        return plan, eps, offset, input_addresses(x, residual, weight)

    @staticmethod
    def _outputs(plan: CallPlan, x: Any, shape: Optional[tuple], out: Any, residual_out: Any,
                 scales: Any) -> tuple[Any, Any, Any]:
        """(out, residual_out, scales) of an add + RMSNorm call of `shape` rows (None: x's own, allocated like x,
        which costs half of torch.empty per call; a valid x is dense only where it is contiguous): those given,
        else new ones (out in T or quantized as the plan says, the scales of its quantization)."""
        import torch

        quant = plan.quant
        if out is None:
            if quant is not None:
                out = quant.new_out(x, None if shape is None else shape[:-1])
            else:
                out = torch.empty_like(x) if shape is None else torch.empty(shape, dtype=x.dtype, device=x.device)
        if residual_out is None:
            residual_out = torch.empty_like(x) if shape is None else torch.empty(shape, dtype=x.dtype, device=x.device)
        if quant is not None and scales is None:
            scales = quant.new_scales(x.device)
        return out, residual_out, scales

    def _rmsnorm(self, x: Any, residual: Any, weight: Any, eps: Any, offset: Any, path: str, out: Any,
                 residual_out: Any, fp8: Optional[dict]) -> tuple[Any, Any, Any]:
        self.check()
        scales = None if fp8 is None else fp8["scales"]
        plan, eps, offset, inputs = self._rmsnorm_plan(self._checked_fused, x, residual, weight, eps, offset, path,
                                                       out, residual_out, fp8)
        out, residual_out, scales = self._outputs(plan, x, None, out, residual_out, scales)
        if plan.fallback:
            if plan.rows:
                self._fallback_rmsnorm(x, residual, weight, eps, offset, out, residual_out, fp8, scales)
            return out, residual_out, returned_scales(fp8, scales, launched=bool(plan.rows))
        if plan.rows:
            stream = raw_stream(self.device)
            xp, rp, wp = inputs
            op, rop = out.data_ptr(), residual_out.data_ptr()
            sp = 0 if scales is None else scales.data_ptr()
            gp = 0 if fp8 is None or fp8["global_scale"] is None else fp8["global_scale"].data_ptr()
            cp = 0 if fp8 is None or fp8["scale_copy"] is None else fp8["scale_copy"].data_ptr()
            # out at x: peers may still read x in place (a captured call) while this rank writes out: stage it
            stage = plan.stage_x or op == xp
            if plan.chunks is None:
                buf = plan.buffer()
                v = buf.values
                v.residual, v.weight, v.out, v.residual_out, v.scales = rp, wp, op, rop, sp
                v.global_scale, v.scale_copy = gp, cp
                v.peers, v.stage_src = self._peer_table(xp, plan, stream, stage)
                v.eps, v.weight_offset = eps, offset
                plan.launch(stream, buf)
            else:
                px, pr, po, pro, ps = plan.pitches
                for lo, sub in plan.chunks:
                    buf = sub.buffer()
                    v = buf.values
                    v.residual, v.weight = rp and rp + lo * pr, wp
                    v.out, v.residual_out, v.scales = op + lo * po, rop + lo * pro, sp and sp + lo * ps
                    v.global_scale, v.scales_row0 = gp, lo  # the swizzled scales' tiles place rows by index
                    v.scale_copy = cp
                    v.peers, v.stage_src = self._peer_table(xp + lo * px, sub, stream, stage)
                    v.eps, v.weight_offset = eps, offset
                    sub.launch(stream, buf)
        return out, residual_out, returned_scales(fp8, scales, launched=bool(plan.rows))

    def allreduce(self, x: Any, *, path: str = "auto", out: Optional[Any] = None) -> Any:
        """T(sum over the group of x, fp32, rank order), any shape with a multiple of 16 bytes in all."""
        import torch

        self.check()
        try:
            plan = self._plans.get((allreduce_key(x, out), path, overrides()))
        except (AttributeError, TypeError):  # not a tensor, or a path that cannot key: the full checks say so
            plan = None
        if plan is None or not allreduce_pointers_ok(plan.x_bytes, x, out):
            plan = self._checked_allreduce(x, path, out)
        out = torch.empty_like(x) if out is None else out
        if not plan.rows:
            return out
        if plan.fallback:
            return self._fallback_allreduce(x, out)
        stream = raw_stream(self.device)
        xp, op = x.data_ptr(), out.data_ptr()
        size = plan.pitches[0]
        for lo, sub in plan.chunks or ((0, plan),):
            buf = sub.buffer()
            buf.values.peers, buf.values.stage_src = self._peer_table(xp + lo * size, sub, stream, stage=op == xp)
            buf.values.out = op + lo * size
            sub.launch(stream, buf)
        return out

    def _checked_fused(self, key: Optional[tuple], x: Any, residual: Any, weight: Any, eps: Any, offset: Any,
                       path: str, out: Any, residual_out: Any, fp8: Optional[dict]) -> tuple[CallPlan, float, float]:
        """Every rule of the call (raising InputError naming the value), the path, and the plan of its key."""
        call = check_rmsnorm_inputs(x, residual, weight, eps, offset)
        quant, q_layout, layouts, unsupported = self._checked_operands(x, x, call, residual, weight, out, residual_out,
                                                                       fp8, None)
        rows, cols = call.x.rows, call.x.cols
        row_bytes = cols * call.x.dtype.itemsize
        if unsupported is None and rows and row_bytes > self.max_bytes:
            unsupported = (f"a row of x has {row_bytes} bytes (n={cols}, {call.x.dtype.value}), over this "
                           f"communicator's max_bytes={self.max_bytes}: each launch stages whole rows")
        chunk_rows = min(rows, self.max_bytes // row_bytes) if row_bytes else rows
        chosen = self._choose(path, x, unsupported, chunk_rows * row_bytes, self.size_rule(call.x.dtype, cols))
        in_place = residual_out is not None and residual is not None and residual_out.data_ptr() == residual.data_ptr()
        tensors = (x, residual, weight, out if fp8 is None else None, residual_out)
        q_tensors = () if fp8 is None else (out, fp8["scales"])
        plan = self._plans.get(key)
        if plan is None or plan.fallback != (chosen is Path.FALLBACK) or plan.in_place != in_place:
            if chosen is Path.FALLBACK:
                plan = CallPlan.fallback_plan(tensors, rows, quant, q_tensors)
            else:
                spec = self._fused_spec(call, chosen, in_place, quant)
                fixed = {**self._peer_args(), "rows": rows, "cols": cols,
                         "residual_stride": call.residual_stride or 0,
                         "out_stride": (q_layout or layouts.get("out") or call.x).row_stride if out is not None else
                         (quant.out_cols if quant else cols),
                         "residual_out_stride": layouts["residual_out"].row_stride if "residual_out" in layouts else cols}
                scale_args, shared_mem = ({}, 0) if quant is None else quant.launch_args(cols)
                fixed.update(scale_args)
                cap = self._grid_cap(spec)
                x_pitch = call.x.row_stride * call.x.dtype.itemsize

                def part(n: int) -> CallPlan:
                    return CallPlan(spec, self.device, min(n, cap), {**fixed, "rows": n}, tensors, n, in_place, quant,
                                    q_tensors, shared_mem=shared_mem, x_layout=(n, row_bytes, x_pitch))
                if chunk_rows >= rows:
                    plan = part(rows)
                else:
                    pitches = (x_pitch, (call.residual_stride or 0) * call.x.dtype.itemsize,
                               fixed["out_stride"] * (1 if quant is not None else call.x.dtype.itemsize),
                               fixed["residual_out_stride"] * call.x.dtype.itemsize,
                               (quant.scale_bytes if quant else 0) * fixed.get("scales_stride", 0))
                    plan = CallPlan.chunked_plan(tensors, rows, in_place, quant, q_tensors,
                                                 _chunks(rows, chunk_rows, part), pitches)
            plan.stage_x = call.x.row_stride != cols or x.data_ptr() % DEFAULT_PACK != 0
            if unsupported is None and key is not None:  # an unaligned call must come back here each time
                self._plans[key] = plan
        return plan, call.eps, call.offset

    def _checked_allreduce(self, x: Any, path: str, out: Any) -> CallPlan:
        import torch

        if isinstance(x, torch.Tensor) and not x.is_contiguous():
            raise InputError(f"x with shape {tuple(x.shape)} and strides {x.stride()} is not contiguous")
        flat = x.reshape(-1) if isinstance(x, torch.Tensor) else x
        if not (isinstance(x, torch.Tensor) and x.numel() == 0):  # an empty x is valid and moves nothing
            check_rows("x", flat)
        check_outputs({"x": x}, {"out": out}, x, in_place={("out", "x")})
        self._check_device(x=x, out=out)
        unsupported = None
        if x.numel():
            unsupported = cross_gpu_limit(flat.numel(), DType.parse(x.dtype), {"x": flat, "out": out})
        size = x.element_size()
        # Chunks of whole 16-byte packs, as many as the staging buffer holds (its size is max_bytes rounded up
        # to a pack, so at least one)
        chunk = max(1, self.max_bytes // DEFAULT_PACK) * DEFAULT_PACK // size
        chosen = self._choose(path, x, unsupported, min(x.numel(), chunk) * size)
        key = (allreduce_key(x, out), path, overrides())
        if chosen is Path.FALLBACK or not x.numel():
            plan = CallPlan.fallback_plan((x, out), x.numel())
        else:
            op = ALLREDUCE_2STAGE.op if chosen is Path.TWO_STAGE else ALLREDUCE_1STAGE.op
            spec = spec_for(op, DType.parse(x.dtype), self.device, PLAIN_BLOCK, self.world_size)
            cols = x.shape[-1] if x.dim() else 1
            cap = self._grid_cap(spec)

            def part(n: int) -> CallPlan:  # n elements, whole packs
                packs = n * size // DEFAULT_PACK
                work = math.ceil(packs / self.world_size) if chosen is Path.TWO_STAGE else packs
                # rows, cols: x's shape in every chunk's descriptor (the same on every rank)
                return CallPlan(spec, self.device, min(math.ceil(work / PLAIN_BLOCK), cap),
                                {**self._peer_args(), "packs": packs, "rows": x.numel() // cols, "cols": cols},
                                (x, out), n, x_layout=(1, n * size, n * size))
            if chunk >= x.numel():
                plan = part(x.numel())
            else:
                plan = CallPlan.chunked_plan((x, out), x.numel(), False, None, (), _chunks(x.numel(), chunk, part),
                                             (size, 0, size, 0, 0))
        if unsupported is None:
            self._plans[key] = plan
        return plan

    def _fused_spec(self, call: RmsnormCall, chosen: Path, in_place: bool, quant: Optional[QuantCall]) -> KernelSpec:
        variant = {"weight": call.weight, "residual": call.residual_stride is not None, "inplace": in_place}
        if quant is not None:
            variant.update(quant=quant.kind, fp8=quant.fmt)
        if chosen is Path.TWO_STAGE:
            return spec_for(ALLREDUCE_RMSNORM_2STAGE.op, call.x.dtype, self.device, TWO_STAGE_BLOCK, self.world_size,
                            **variant)
        packs = call.x.cols * call.x.dtype.itemsize // DEFAULT_PACK
        return spec_for(ALLREDUCE_RMSNORM_1STAGE.op, call.x.dtype, self.device, allreduce_rmsnorm_block(packs),
                        self.world_size, **variant)

    # -- the fallback -------------------------------------------------------------------------------------
    def size_rule(self, dtype: Any, hidden: int) -> SizeRule:
        """The measured thresholds `auto` follows for allreduce_rmsnorm of this dtype and hidden size
        (rank 0's thresholds file, fused_ar.comm.thresholds), or an empty rule: the built-in table serves.
        Looked up once per shape: every call asks."""
        rule = self._size_rules.get((dtype, hidden))
        if rule is None:
            rule = self._thresholds.rule(DType.parse(dtype), hidden) if self._thresholds is not None else SizeRule()
            self._size_rules[(dtype, hidden)] = rule
        return rule

    def _choose(self, path: str, x: Any, unsupported: Optional[str], launch_bytes: int,
                rule: SizeRule = SizeRule()) -> Path:
        chosen, why = choose_path(path, self._runtime.platform, self.world_size, x.numel() * x.element_size(),
                                  launch_bytes, group_reason=self._fallback_reason, unsupported=unsupported, rule=rule,
                                  can_fall_back=self._device_group is not None)
        if chosen is not Path.FALLBACK:
            return chosen
        if self._device_group is None:  # a local group, or fallback=False: nothing to fall back on
            if unsupported is not None:
                raise UnsupportedShapeError(unsupported)
            if self._fallback_reason is not None:
                raise UnsupportedShapeError(f"the IPC kernels cannot serve this group: {self._fallback_reason}")
            raise InputError(f"path={path!r}: this communicator has no device group to fall back on (a local "
                             f"group, or fallback=False)")
        self._fallback_log.note(why)
        return chosen

    def _fallback_allreduce(self, x: Any, out: Any) -> Any:
        """The collective's all-reduce in T (on a contiguous copy where `out` is not contiguous)."""
        import torch
        import torch.distributed as dist

        reduced = out if out.is_contiguous() else torch.empty(x.shape, dtype=x.dtype, device=x.device)
        reduced.copy_(x)
        dist.all_reduce(reduced, group=self._device_group)
        if reduced is not out:
            out.copy_(reduced)
        return out

    def _fallback_rmsnorm(self, x: Any, residual: Any, weight: Any, eps: float, offset: float, out: Any,
                          residual_out: Any, fp8: Optional[dict] = None, scales: Any = None) -> None:
        """The collective's all-reduce in T, then add + RMSNorm (and the FP8 quantization) fused by our kernel,
        which takes every layout."""
        import torch

        ar = self._fallback_allreduce(x, torch.empty(x.shape, dtype=x.dtype, device=x.device))
        add_rmsnorm_into(out, residual_out, ar, residual, weight, eps, offset, fp8, scales)

    # -- helpers ------------------------------------------------------------------------------------------
    def _checked_operands(self, x: Any, rows: Any, call: RmsnormCall, residual: Any, weight: Any, out: Any,
                          residual_out: Any, fp8: Optional[dict],
                          in_place: Optional[set]) -> tuple[Optional[QuantCall], Any, dict, Optional[str]]:
        """The output, quantization, aliasing, device and value rules of an add + RMSNorm call whose outputs
        hold `rows` (x itself, or this rank's shard of it); returns (quant, out's quantized layout, the given
        outputs' layouts, what the cross-GPU kernels cannot take or None)."""
        inputs = {"x": x, "residual": residual, "weight": weight}
        quant, q_layout = None, None
        if fp8 is None:
            layouts = check_outputs(inputs, {"out": out, "residual_out": residual_out}, rows, in_place=in_place)
        else:
            quant, q_layout = check_fp8_call(rows, call, fp8, native_fp8(arch_of(self.device)), out)
            layouts = check_outputs(inputs, {"residual_out": residual_out}, rows, in_place=in_place)
            check_fp8_aliasing(quant, x, residual, weight, residual_out, out, fp8)
        self._check_device(**inputs, out=out, residual_out=residual_out, **quant_tensors(fp8))
        check_quant_values(quant, fp8)
        rows_limited = {"residual": residual, "weight": weight, "residual_out": residual_out}
        if fp8 is None:
            rows_limited["out"] = out
        unsupported = cross_gpu_limit(call.x.cols, call.x.dtype, rows_limited)
        if unsupported is None and q_layout is not None:
            per_access = DEFAULT_PACK // call.x.dtype.itemsize // quant.out_ratio  # out bytes per 16-byte access
            if out.data_ptr() % per_access or q_layout.row_stride % per_access:
                unsupported = (f"out has quantized rows at address {out.data_ptr():#x} with stride "
                               f"{q_layout.row_stride}: the cross-GPU kernels need them {per_access}-byte aligned")
        return quant, q_layout, layouts, unsupported

    def _check_device(self, **tensors: Any) -> None:
        check_devices(**tensors)
        first = next(iter(tensors.values()))
        if first.device.index != self.device:
            raise InputError(f"x is on {first.device} but this communicator serves cuda:{self.device}")

    def _peer_args(self) -> dict[str, int]:
        """The arguments every cross-GPU kernel of this rank takes alike: its signal buffer (the barrier's first
        read, its epoch, one load from a parameter instead of two through the peer table), its rank, the
        barrier timeout, and whether a dependent launch may start before the kernel ends
        (kernels_src/fa_peers.h, fa_peer_release): only where this rank is alone on its GPU."""
        return {"own_signal": self._mem.signal, "rank": self.rank, "timeout_ns": self._timeout_ns,
                "release_early": int(self._ranks_per_device == 1)}

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


def _chunks(total: int, per: int, part: Callable[[int], CallPlan]) -> tuple[tuple[int, CallPlan], ...]:
    """(first item, plan) of each launch of a call of `total` items (rows, or elements of a flat all-reduce)
    in launches of at most `per`: one plan serves every full chunk, a second the shorter last one."""
    full = part(per)
    chunks = [(lo, full) for lo in range(0, total - total % per, per)]
    if total % per:
        chunks.append((total - total % per, part(total % per)))
    return tuple(chunks)

"""What vLLM's and SGLang's custom all-reduce classes have in common, over fused_ar.Communicator.

An engine keeps one custom all-reduce object per tensor-parallel group (`ca_comm`) and asks it, per
tensor, `should_custom_ar(x)` and then `custom_all_reduce(x)`; None means "not mine" and the engine's own
chain (NCCL) runs. This class gives that shape: construction from the engine's CPU group and device, the
size gate, the out-of-place all-reduce (chunked where the engine wants any size), the graph-capture
context and its buffer registration, close; plus the fused all-reduce + add + RMSNorm with the same
decline convention. It never takes fused_ar's own fallback: the communicator is built with
`fallback=False`, and whatever the kernels cannot serve is declined before anything is launched.
The engine-specific classes (fused_ar.integrations.vllm, .sglang) set the engine's names and defaults.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Optional

from ..comm import registry
from ..comm.communicator import Communicator
from ..errors import FusedArError, UnsupportedShapeError
from ..jit.kernels import CROSS_GPU_NGPUS
from ..jit.spec import DEFAULT_PACK

# What the IPC kernels reduce; the engines' own custom all-reduce takes the same three.
SERVED_DTYPES = ("float32", "float16", "bfloat16")


def weakly_contiguous(x: Any) -> bool:
    """The engines' rule: the elements fill one dense span of storage (any order of dimensions)."""
    return x.is_contiguous() or (x.untyped_storage().nbytes() - x.storage_offset() * x.element_size()
                                 == x.numel() * x.element_size())


def flat(x: Any) -> Any:
    """x's elements as one 1-D view in storage order (x weakly contiguous)."""
    return x.as_strided((x.numel(),), (1,), x.storage_offset())


class EngineAllreduce:
    """One tensor-parallel group's custom all-reduce in an engine's shape. All ranks construct it together.

    group: the engine's CPU (gloo) group; device: this rank's GPU (int, str or torch.device); max_size:
    bytes per call that the IPC kernels take (the staging buffer); register_graph_buffers: False copies x
    inside captured graphs instead of registering its address; name: the engine's group name, by which ops
    in compiled graphs find this object; any_size: the engine's deterministic mode, where every size is
    taken (chunked through max_size) so the sum order never depends on the size; fully_connected: the
    engine's verdict on the GPUs' links (groups of more than 2 GPUs are served only when fully connected).
    Unsupported setups leave `disabled` True, say why in `disabled_reason`, and never raise.
    """

    engine = "engine"
    # The engines differ on the size limit: vLLM serves nbytes < max_size, SGLang nbytes <= max_size.
    max_size_inclusive = False

    def __init__(self, group: Any, device: Any, max_size: int, *, register_graph_buffers: bool = True,
                 name: str = "", any_size: bool = False, fully_connected: Optional[bool] = None) -> None:
        import torch
        import torch.distributed as dist

        self._IS_CAPTURING = False
        self.disabled = True
        self.disabled_reason: Optional[str] = None
        self.comm: Optional[Communicator] = None
        self.group = group
        self.name = name
        self.rank = dist.get_rank(group=group)
        self.world_size = dist.get_world_size(group=group)
        self.max_size = int(max_size)
        self.any_size = bool(any_size)
        self.fully_connected = bool(fully_connected) if fully_connected is not None else self.world_size == 2
        if isinstance(device, int):
            device = torch.device("cuda", device)
        self.device = torch.device(device)
        self.disabled_reason = self._unsupported()
        if self.disabled_reason is not None:
            return
        try:
            self.comm = Communicator(group, self.device, self.max_size, fallback=False,
                                     register_graph_inputs=register_graph_buffers)
        except FusedArError as exc:
            self.disabled_reason = str(exc)
            return
        if self.comm.fallback_reason is not None:
            self.disabled_reason = self.comm.fallback_reason
            self.comm.close()
            self.comm = None
            return
        self.disabled = False
        if name:
            registry.register_name(name, self)

    def _unsupported(self) -> Optional[str]:
        import torch

        if self.world_size not in CROSS_GPU_NGPUS:
            return f"a group of {self.world_size} ranks; fused_ar serves {list(CROSS_GPU_NGPUS)}"
        if self.device.type != "cuda" or not torch.cuda.is_available():
            return f"device {self.device} is not a GPU torch can use"
        if self.world_size > 2 and not self.fully_connected:
            return f"{self.world_size} GPUs that are not fully connected"
        if self.max_size < DEFAULT_PACK:
            return f"max_size={self.max_size} is below one {DEFAULT_PACK}-byte pack"
        return None

    # -- the gate -----------------------------------------------------------------------------------------
    def _fits(self, nbytes: int) -> bool:
        if self.any_size:
            return True
        return nbytes <= self.max_size if self.max_size_inclusive else nbytes < self.max_size

    def should_custom_ar(self, inp: Any) -> bool:
        """Whether custom_all_reduce takes `inp`: fp32/fp16/bf16 on this GPU, a whole number of 16-byte
        packs in one dense span starting 16-byte aligned, within max_size (any size in deterministic mode),
        in a group of 2 or of fully connected GPUs."""
        if self.disabled:
            return False
        if str(inp.dtype).rpartition(".")[2] not in SERVED_DTYPES or inp.device != self.device:
            return False
        nbytes = inp.numel() * inp.element_size()
        if nbytes == 0 or nbytes % DEFAULT_PACK or inp.data_ptr() % DEFAULT_PACK or not weakly_contiguous(inp):
            return False
        return (self.world_size == 2 or self.fully_connected) and self._fits(nbytes)

    # -- the all-reduce -----------------------------------------------------------------------------------
    def custom_all_reduce(self, input: Any) -> Optional[Any]:  # noqa: A002 (the engines' keyword)
        """T(sum over the group of input) in a new tensor, or None when should_custom_ar declines. Inside
        capture(), a stream that is not capturing is the engine's warm-up: see `_warmup`."""
        import torch

        if not self.should_custom_ar(input):
            return None
        if self._IS_CAPTURING and not torch.cuda.is_current_stream_capturing():
            return self._warmup(input)
        return self.all_reduce(input)

    def _warmup(self, inp: Any) -> Any:
        """The engine's warm-up run inside its capture context: the allocation, no communication."""
        import torch

        return torch.empty_like(inp)

    def all_reduce(self, inp: Any) -> Any:
        """Out of place, in pieces of at most max_size bytes (each a whole number of 16-byte packs)."""
        import torch

        out = torch.empty_like(inp)
        src, dst = flat(inp), flat(out)
        step = max(DEFAULT_PACK, self.max_size // DEFAULT_PACK * DEFAULT_PACK) // inp.element_size()
        for start in range(0, src.numel(), step):
            self.comm.allreduce(src[start:start + step], out=dst[start:start + step])
        return out

    def _rows_per_call(self, x: Any) -> int:
        """How many rows of x one fused call takes (all of them when x fits max_size; in deterministic mode
        as many as fit), 0 where the kernels do not take x: the engine's own path then serves it."""
        if self.disabled or x.dim() == 0 or x.numel() == 0 or x.device != self.device:
            return 0
        if str(x.dtype).rpartition(".")[2] not in SERVED_DTYPES:
            return 0
        row_bytes = x.shape[-1] * x.element_size()
        if row_bytes % DEFAULT_PACK or not (self.world_size == 2 or self.fully_connected):
            return 0
        rows = x.numel() // x.shape[-1]
        if rows * row_bytes <= self.max_size:
            return rows
        return self.max_size // row_bytes if self.any_size else 0

    def fused_allreduce_rmsnorm(self, x: Any, residual: Optional[Any], weight: Optional[Any], eps: float,
                                weight_offset: float = 0.0) -> Optional[tuple[Any, Any]]:
        """(out, residual_out) of all-reduce + residual add + RMSNorm in one kernel, new tensors; None where
        the kernels do not take the call (the engine then runs its all-reduce and its norm). In the engine's
        deterministic mode rows beyond max_size are taken in pieces (rows are independent: same bits)."""
        import torch

        per_call = self._rows_per_call(x)
        if per_call == 0:
            return None
        rows = x.numel() // x.shape[-1]
        out = torch.empty_like(x)
        residual_out = torch.empty_like(x)
        try:
            if per_call >= rows:
                self.comm.allreduce_rmsnorm(x, residual, weight, eps, weight_offset=weight_offset, out=out,
                                            residual_out=residual_out)
                return out, residual_out
            x2, o2, r2 = x.reshape(rows, -1), out.view(rows, -1), residual_out.view(rows, -1)
            res2 = None if residual is None else residual.reshape(rows, -1)
            for start in range(0, rows, per_call):
                piece = slice(start, start + per_call)
                self.comm.allreduce_rmsnorm(x2[piece], None if res2 is None else res2[piece], weight, eps,
                                            weight_offset=weight_offset, out=o2[piece], residual_out=r2[piece])
        except UnsupportedShapeError:  # an unaligned row layout: the same on every rank, so all decline
            return None
        return out, residual_out

    def fused_allreduce_rmsnorm_fp8(self, x: Any, residual: Optional[Any], weight: Optional[Any], eps: float, *,
                                    weight_offset: float = 0.0, scale: Optional[Any] = None,
                                    group_size: Optional[int] = None,
                                    fp8_dtype: Any = None) -> Optional[tuple[Any, Any, Any]]:
        """(q, residual_out, scales): the fused op with FP8 output (Communicator.allreduce_rmsnorm_fp8), or
        None where the kernels do not take it whole (no pieces: the scales would be per piece)."""
        per_call = self._rows_per_call(x)
        if per_call == 0 or per_call < x.numel() // x.shape[-1]:
            return None
        try:
            return self.comm.allreduce_rmsnorm_fp8(x, residual, weight, eps, weight_offset=weight_offset, scale=scale,
                                                   group_size=group_size, fp8_dtype=fp8_dtype)
        except UnsupportedShapeError:
            return None

    # -- graphs and lifetime ------------------------------------------------------------------------------
    @contextmanager
    def capture(self) -> Iterator[None]:
        """Around the engine's graph captures: on exit, registers the captured inputs with every peer
        (collective over the group)."""
        try:
            self._IS_CAPTURING = True
            yield
        finally:
            self._IS_CAPTURING = False
            if not self.disabled:
                self.register_graph_buffers()

    def register_graph_buffers(self) -> None:
        if self.comm is not None:
            self.comm.register_graph_buffers()

    def close(self) -> None:
        """Releases the communicator's memory. Idempotent."""
        comm, self.comm = getattr(self, "comm", None), None
        registry.unregister_name(self)
        if comm is not None:
            comm.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the driver may already be gone
            pass

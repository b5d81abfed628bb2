"""The paths the benchmark times, as data: name, what it runs, what it needs, and the (base, candidate) pairs
the tables compare. The code that runs each path is fused_ar.bench.steps; this module imports nothing
heavy, so the report can be built anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional

from ..comm.policy import DEFAULT_MAX_BYTES as CHUNK_BUFFER  # fused_chunked's: the communicator's default


class Needs(str, Enum):
    IPC = "ipc"  # our communicator: any group, the single-GPU emulation included
    COLLECTIVE = "collective"  # a torch.distributed device group (NCCL / RCCL): one process per GPU
    SYMM_MEM = "symm_mem"  # torch symmetric memory: one process per GPU, CUDA
    FLASHINFER = "flashinfer"  # the flashinfer package: one process per GPU, CUDA


@dataclass(frozen=True)
class BenchPath:
    name: str
    what: str
    needs: Needs
    exact: bool  # residual_out bit-identical to the rank-order reference (docs/design.md section 1)
    buffer_bytes: Optional[int] = None  # the communicator's max_bytes (None: the whole call fits)
    default: bool = True  # in a run without --paths


PATHS: tuple[BenchPath, ...] = (
    BenchPath("fused_1stage", "fused_ar one-stage all-reduce + add + RMSNorm (path='1stage')", Needs.IPC, True),
    BenchPath("fused_2stage", "fused_ar two-stage all-reduce + add + RMSNorm (path='2stage')", Needs.IPC, True),
    BenchPath("fused_auto", "fused_ar allreduce_rmsnorm, path='auto' (what a serving engine calls)", Needs.IPC, True),
    BenchPath("fused_chunked", f"fused_ar allreduce_rmsnorm, path='auto', through a buffer of {CHUNK_BUFFER >> 20} MiB "
              "(the default max_bytes): a call over it runs in chunks", Needs.IPC, True, buffer_bytes=CHUNK_BUFFER,
              default=False),
    BenchPath("unfused_ours", "fused_ar allreduce, then fused_ar add_rmsnorm (two launches)", Needs.IPC, True),
    BenchPath("nccl_torch", "torch.distributed all_reduce in place (NCCL/RCCL), then torch add + rms_norm: the "
              "unfused baseline serving engines run", Needs.COLLECTIVE, False),
    BenchPath("nccl_ours", "torch.distributed all_reduce in place, then fused_ar add_rmsnorm", Needs.COLLECTIVE, False),
    BenchPath("fallback", "fused_ar path='fallback' as shipped: copy x, all_reduce, fused_ar add_rmsnorm",
              Needs.COLLECTIVE, False),
    BenchPath("symm_mem", "torch symmetric memory one_shot_all_reduce (x copied into its buffer), then fused_ar "
              "add_rmsnorm", Needs.SYMM_MEM, False),
    BenchPath("flashinfer", "FlashInfer allreduce_fusion (TensorRT-LLM kernel), AllReduce + residual + RMSNorm",
              Needs.FLASHINFER, False),
)
BY_NAME: dict[str, BenchPath] = {p.name: p for p in PATHS}
DEFAULT_PATHS: tuple[str, ...] = tuple(p.name for p in PATHS if p.default)

# (base, candidate) pairs of the tables, in the seed's shape (m, base_us, opt_us, speedup); the first pair
# whose base ran is the headline of the summary.
PAIRS: tuple[tuple[str, str], ...] = (
    ("nccl_torch", "fused_auto"),
    ("unfused_ours", "fused_auto"),
    ("flashinfer", "fused_auto"),
    ("symm_mem", "fused_auto"),
    ("fallback", "fused_auto"),
    ("fused_1stage", "fused_2stage"),
    ("fused_auto", "fused_chunked"),
    ("fallback", "fused_chunked"),
)


def parse_paths(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown or not names:
        raise ValueError(f"unknown path(s) {unknown or text!r}; the paths are {', '.join(BY_NAME)}")
    return names

"""Worker functions for the warm tests: importable by the spawned worker processes of fused_ar.jit.warm."""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

from fused_ar.jit.kernels import warm_matrix
from fused_ar.jit.spec import DType
from fused_ar.jit.warm import warm_one

# What `warm --ngpus 1` builds per dtype and arch: every add_rmsnorm kernel (the blocks, the short-row ones).
PER_DTYPE = len(warm_matrix(["sm_90"], [DType.BF16], [1]))


def die_at_block_512(spec_dict: dict, into: Optional[str], compiler_for: Callable[[str], Any]) -> tuple:
    """Kills its worker process (as a crashing compiler would) for the block-512 kernel only."""
    if spec_dict["block"] == 512:
        os._exit(3)
    return warm_one(spec_dict, into, compiler_for)

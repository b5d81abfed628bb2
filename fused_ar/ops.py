"""Public single-GPU ops. `add_rmsnorm` is also the epilogue of the communicator's fallback path.

Validates everything before allocating or launching; semantics are docs/design.md section 1 with N = 1.
"""

from __future__ import annotations

from typing import Any, Optional

from .kernels import add_rmsnorm_block
from .launch import launch, spec_for
from .spec import DEFAULT_PACK, DType, Op
from .validate import check_devices, check_outputs, check_rmsnorm_inputs

# Grid-stride over rows beyond this many blocks: keeps grid * block under 2**32 (a HIP limit) for any m.
MAX_GRID_BLOCKS = 1 << 16


def add_rmsnorm(x: Any, residual: Any, weight: Any, eps: float = 1e-6, *, out: Optional[Any] = None,
                residual_out: Optional[Any] = None) -> tuple[Any, Any]:
    """(out, residual_out): residual_out = T(x + residual), out = T(RMSNorm(residual_out) * weight).

    Out-of-place: x, residual and weight are never written. x and residual share a shape (..., n) and
    dtype (bf16, fp16, fp32); weight is (n,); n is a multiple of 16 bytes. `out` and `residual_out` may
    be given (x's shape and dtype, aliasing nothing) and are then written and returned. Runs on torch's
    current stream of x's device.
    """
    import torch

    shape, eps = check_rmsnorm_inputs(x, residual, weight, eps)
    check_outputs({"x": x, "residual": residual, "weight": weight}, {"out": out, "residual_out": residual_out}, x)
    outputs = {k: v for k, v in (("out", out), ("residual_out", residual_out)) if v is not None}
    check_devices(x=x, residual=residual, weight=weight, **outputs)
    out = torch.empty_like(x) if out is None else out
    residual_out = torch.empty_like(x) if residual_out is None else residual_out
    if shape.rows:
        add_rmsnorm_into(out, residual_out, x, residual, weight, eps)
    return out, residual_out


def add_rmsnorm_into(out: Any, residual_out: Any, x: Any, residual: Any, weight: Any, eps: float) -> None:
    """Launch on already validated, same-shaped contiguous tensors (no checks: callers validate)."""
    cols = x.shape[-1]
    rows = x.numel() // cols
    device = x.device.index
    block = add_rmsnorm_block(cols * x.element_size() // DEFAULT_PACK)
    spec = spec_for(Op.ADD_RMSNORM, DType.parse(x.dtype), device, block)
    launch(spec, device, min(rows, MAX_GRID_BLOCKS),
           (out.data_ptr(), residual_out.data_ptr(), x.data_ptr(), residual.data_ptr(), weight.data_ptr(),
            rows, cols, eps))

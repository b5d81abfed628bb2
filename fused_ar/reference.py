"""The reference of docs/design.md section 1, computed with torch in fp32 / fp64 on any device (tests and examples check against it)."""

from __future__ import annotations

import torch


def add_rmsnorm_reference(xs, residual, weight, eps, weight_offset=0.0):
    """xs: the list of per-rank inputs (one for the local op); residual and weight may be None (none; ones).
    Returns (ar, residual_out, out) of docs/design.md sections 1 and 1b."""
    dtype = xs[0].dtype
    acc = torch.zeros(xs[0].shape, dtype=torch.float32, device=xs[0].device)
    for x in xs:  # fp32, rank order
        acc = acc + x.float()
    ar = acc.to(dtype)
    residual_out = ar if residual is None else (ar.float() + residual.float()).to(dtype)
    ro = residual_out.double()
    inv_rms = torch.rsqrt(ro.square().mean(dim=-1, keepdim=True) + eps)
    factor = torch.ones(ro.shape[-1], dtype=torch.float64, device=ro.device) if weight is None else weight.double()
    out = (ro * inv_rms * (factor + weight_offset if weight_offset else factor)).to(dtype)
    return ar, residual_out, out


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in units in the last place of a's dtype between two same-dtype tensors (NaN -> huge)."""
    assert a.dtype == b.dtype
    int_type = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}[a.dtype]
    ia, ib = a.view(int_type).long(), b.view(int_type).long()
    bits = 8 * a.element_size()
    sign = 1 << (bits - 1)
    # map the sign-magnitude float order onto a monotonic integer line
    ia = torch.where(ia < 0, -(ia + sign), ia)
    ib = torch.where(ib < 0, -(ib + sign), ib)
    d = (ia - ib).abs()
    nan = torch.isnan(a) | torch.isnan(b)
    return torch.where(nan, torch.full_like(d, 1 << 40), d)


def assert_rmsnorm_matches(xs, residual, weight, eps, out, residual_out, weight_offset=0.0):
    """residual_out bit-exact, out within 1 ulp of T, against add_rmsnorm_reference(xs, ...)."""
    _, ref_ro, ref_out = add_rmsnorm_reference(xs, residual, weight, eps, weight_offset)
    assert torch.equal(residual_out, ref_ro), f"residual_out differs in {(residual_out != ref_ro).sum().item()} elements"
    d = ulp_distance(out, ref_out)
    assert d.max().item() <= 1, f"out off by {d.max().item()} ulp ({(d > 1).sum().item()} elements > 1 ulp)"


def allreduce_reference(xs):
    acc = torch.zeros_like(xs[0], dtype=torch.float32)
    for x in xs:
        acc = acc + x.float()
    return acc.to(xs[0].dtype)


def prime_allocator(device: int = 0, small: int = 64, large_mib: int = 512) -> None:
    """Fills torch's caching allocator (small and large pools) so later allocations reuse cached memory.
    Ranks emulated in one process launch from one thread: a fresh cudaMalloc between two ranks' launches
    can wait for the GPU, where the launched ranks spin for the unlaunched ones."""
    keep = [torch.empty(512 * 1024, dtype=torch.uint8, device=f"cuda:{device}") for _ in range(small)]
    keep.append(torch.empty(large_mib << 20, dtype=torch.uint8, device=f"cuda:{device}"))
    del keep

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


# -- 4-bit and power-of-two scaled outputs (docs/design.md section 1b: NVFP4, MXFP4, UE8M0 FP8 groups) ------
# Each quantizes y, the call's own T-rounded out, as a float32 tensor (..., n). Divisions are IEEE (torch
# divides by a Python scalar as a multiplication by its reciprocal, so scalars go in as tensors).

E2M1_MAX = 6.0
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # magnitude of codes 0-7; bit 3 is the sign
# The midpoints between neighbouring magnitudes, and whether a tie there rounds up (to the even code).
_E2M1_TIES = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def _ieee_div(a: torch.Tensor, b: float) -> torch.Tensor:
    return a / torch.full_like(a, b)


def e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8, 0-15) of v: round to nearest, ties to the even code, saturating at 6 (inf too);
    E2M1 has no NaN, so a NaN becomes the largest magnitude, its sign bit kept."""
    v = v.float()
    a = v.abs()
    code = torch.zeros(v.shape, dtype=torch.uint8, device=v.device)
    for mid, up in _E2M1_TIES:
        code += (a >= mid if up else a > mid).to(torch.uint8)
    code = torch.where(torch.isnan(v), torch.full_like(code, 7), code)
    return code | ((v.view(torch.int32) < 0).to(torch.uint8) << 3)


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """The float32 values of E2M1 codes (uint8, 0-15)."""
    table = torch.tensor(E2M1_VALUES + tuple(-x for x in E2M1_VALUES), dtype=torch.float32, device=codes.device)
    return table[codes.long()]


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Two E2M1 codes a byte along the last dimension, the first element in the low nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


def _blocks(y: torch.Tensor, block: int) -> torch.Tensor:
    n = y.shape[-1]
    if n % block:
        raise ValueError(f"n={n} is not a multiple of the block of {block}")
    return y.float().view(*y.shape[:-1], n // block, block)


def nvfp4_reference(y: torch.Tensor, global_scale: torch.Tensor, block: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, scales) of NVFP4: per block of 16, s = e4m3(global_scale * (amax / 6)) (round to nearest even,
    saturating at 448; a NaN amax gives the NaN code), values = e2m1(y * (global_scale / float(s))), 0 where
    s is 0. values: uint8 (..., n / 2), two codes a byte; scales: float8_e4m3fn (..., n / 16), row-major."""
    b = _blocks(y, block)
    amax = b.abs().amax(-1)
    sf = (global_scale.float().reshape(()) * _ieee_div(amax, E2M1_MAX)).clamp(max=448.0).to(torch.float8_e4m3fn)
    s = sf.float()
    out_scale = torch.where(s == 0, torch.zeros_like(s), global_scale.float().reshape(()) / s)
    codes = e2m1_codes(b * out_scale.unsqueeze(-1)).view(*y.shape)
    return pack_fp4(codes), sf


def swizzle_nvfp4_scales(scales: torch.Tensor) -> torch.Tensor:
    """Row-major (m, k) block scales in the layout the NVFP4 GEMMs read: m padded to 128 rows and k to 4
    columns (padding 0), tiles of 128 x 4 in row-major tile order, each tile 512 bytes ordered
    [row % 32][(row % 128) // 32][col % 4]."""
    m, k = scales.shape
    mp, kp = -(-m // 128) * 128, -(-k // 4) * 4
    padded = torch.zeros((mp, kp), dtype=torch.uint8, device=scales.device)
    padded[:m, :k] = scales.view(torch.uint8)
    tiles = padded.view(mp // 128, 4, 32, kp // 4, 4)  # [m tile][(row % 128) // 32][row % 32][k tile][col % 4]
    return tiles.permute(0, 3, 2, 1, 4).reshape(-1).view(scales.dtype)


def _floor_log2(a: torch.Tensor) -> torch.Tensor:
    """floor(log2(a)) of positive finite float32 a, exactly (denormals too)."""
    _, e = torch.frexp(a)
    return e - 1


MXFP4_ROUNDINGS = ("floor", "rceil", "even")


def mxfp4_reference(y: torch.Tensor, block: int = 32, rounding: str = "floor") -> tuple[torch.Tensor, torch.Tensor]:
    """(values, scales) of MXFP4: per block of 32 a shared exponent X, the scale byte X + 127 (UE8M0), 255 (NaN)
    where the block holds a NaN or an inf, and values = e2m1(y / 2^X). X by `rounding`:
    - "floor", OCP Microscaling v1.0 section 6.3: X = floor(log2(amax)) - 2 (2: E2M1's largest exponent),
      clamped to [-127, 127] (amax 0: -127);
    - "rceil", AMD aiter's default (MxScaleRoundMode::RoundUp in its csrc/include/mx_quant_utils.h; NVIDIA's
      and FlashInfer's RCEIL): the biased exponent of s = amax * fp32(1/6), plus one where s's mantissa is
      not 0 (the smallest power of two >= s; a subnormal s gives 2^-126);
    - "even", AMD Quark's EVEN (the same header's MxScaleRoundMode::Even): amax's biased exponent after adding
      half of its second mantissa bit (+0x200000) and dropping the mantissa, minus 2, at least 0.
    values: uint8 (..., n / 2); scales: uint8 (..., n / 32)."""
    if rounding not in MXFP4_ROUNDINGS:
        raise ValueError(f"rounding={rounding!r}: one of {MXFP4_ROUNDINGS}")
    b = _blocks(y, block)
    amax = b.abs().amax(-1)
    finite = torch.isfinite(amax)
    if rounding == "floor":
        positive = finite & (amax > 0)
        x = torch.where(positive, _floor_log2(torch.where(positive, amax, torch.ones_like(amax))) - 2,
                        torch.full_like(amax, -127, dtype=torch.int32)).clamp(-127, 127)
    elif rounding == "rceil":
        bits = (amax * torch.tensor(1 / 6, dtype=torch.float32)).view(torch.int32)
        x = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(torch.int32) - 127
    else:
        x = ((((amax.view(torch.int32) + 0x200000) >> 23) & 0xFF) - 2).clamp(min=0) - 127
    x = torch.where(finite, x, torch.full_like(x, -127))
    scale = torch.ldexp(torch.ones_like(amax), x)
    codes = e2m1_codes(b / scale.unsqueeze(-1)).view(*y.shape)
    byte = torch.where(finite, (x + 127).to(torch.uint8), torch.full_like(x, 255, dtype=torch.uint8))
    return pack_fp4(codes), byte


def pow2_ceil(s: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2(s)) of positive float32 s, exactly (an exact power of two stays; NaN and inf stay)."""
    m, e = torch.frexp(s)
    up = torch.where(m == 0.5, s, torch.ldexp(torch.ones_like(s), e))
    return torch.where(torch.isfinite(s), up, s)


def ue8m0_bytes(s: torch.Tensor) -> torch.Tensor:
    """The UE8M0 byte (biased exponent) of power-of-two float32 scales; NaN gives 255."""
    return ((s.float().view(torch.int32) >> 23) & 0xFF).to(torch.uint8)


def fp8_group_ue8m0_reference(y: torch.Tensor, group: int = 128, fp8_dtype: torch.dtype = torch.float8_e4m3fn,
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scales) of per-group FP8 with power-of-two scales: s = 2^ceil(log2(max(amax / M, 1 / (512 M)))),
    q = fp8(clamp(y * (1 / s), -M, M)) (1 / s exact); scales float32 (..., n / group)."""
    big = torch.finfo(fp8_dtype).max
    b = _blocks(y, group)
    amax = b.abs().amax(-1)
    s = pow2_ceil(torch.clamp(_ieee_div(amax, big), min=1 / (512 * big)))
    q = (b * (1.0 / s).unsqueeze(-1)).clamp(-big, big).to(fp8_dtype).view(*y.shape)
    return q, s


def pack_ue8m0(s: torch.Tensor, mn_major: bool = False) -> torch.Tensor:
    """Power-of-two scales (m, g) as UE8M0 bytes four to an int32 (group j in byte j % 4 of word j // 4, the
    missing bytes of the last word 0): (m, ceil(g / 4)) row-major, or with `mn_major` the same shape with
    strides (1, m rounded up to 4): the rows contiguous and each column 16-byte aligned, as block-FP8 GEMMs
    read it."""
    m, g = s.shape
    words = -(-g // 4)
    raw = torch.zeros((m, words * 4), dtype=torch.uint8, device=s.device)
    raw[:, :g] = ue8m0_bytes(s)
    packed = raw.view(torch.int32)  # little-endian: byte j % 4 of each word
    if not mn_major:
        return packed
    mp = -(-m // 4) * 4
    storage = torch.zeros((words, mp), dtype=torch.int32, device=s.device)
    storage[:, :m] = packed.t()
    return storage.t()[:m]

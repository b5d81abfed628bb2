"""The references of the 4-bit and power-of-two scaled outputs (docs/design.md section 1b), on the CPU: E2M1
rounding (nearest, ties to even, saturating; NaN), nibble order, the NVFP4 scales and their swizzled layout,
MXFP4's shared exponent, power-of-two FP8 group scales and their packed UE8M0 layouts, each checked by an
independent derivation (tables, exhaustive nearest-value search, index formulas)."""

from __future__ import annotations

import math

import pytest
import torch

from fused_ar.reference import (E2M1_VALUES, e2m1_codes, e2m1_values, fp8_group_ue8m0_reference, mxfp4_reference,
                                nvfp4_reference, pack_fp4, pack_ue8m0, pow2_ceil, swizzle_nvfp4_scales, ue8m0_bytes,
                                unpack_fp4)


def _nearest_even(v: float) -> int:
    """The E2M1 code of v by search: the nearest magnitude, of two equally near the even code, at most 6."""
    a = min(abs(v), 6.0)
    best = min(range(8), key=lambda c: (abs(E2M1_VALUES[c] - a), c % 2))
    return best | (8 if math.copysign(1.0, v) < 0 else 0)


def test_e2m1_rounds_to_nearest_even_and_saturates():
    grid = [i / 16 for i in range(0, 16 * 8)] + [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.5, 1e30, float("inf")]
    values = torch.tensor(grid + [-v for v in grid], dtype=torch.float32)
    codes = e2m1_codes(values)
    assert codes.tolist() == [_nearest_even(v) for v in values.tolist()]
    ties = e2m1_codes(torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]))
    assert e2m1_values(ties).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert e2m1_codes(torch.tensor([float("nan"), -float("nan"), -0.0])).tolist() == [7, 15, 8]
    exact = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES))
    assert torch.equal(e2m1_values(e2m1_codes(exact)), exact)


def test_two_codes_a_byte_first_in_the_low_nibble():
    codes = torch.tensor([[1, 2, 15, 0]], dtype=torch.uint8)
    packed = pack_fp4(codes)
    assert packed.tolist() == [[0x21, 0x0F]] and torch.equal(unpack_fp4(packed), codes)


def test_nvfp4_scales_values_and_edges():
    g = torch.Generator().manual_seed(0)
    y = torch.randn(3, 64, generator=g) * 3
    y[1, 16:32] = 0.0                       # an all-zero block
    y[2, 0] = 1e6                           # one huge value: its block's scale saturates at 448
    gs = torch.tensor([2.0])
    packed, sf = nvfp4_reference(y.bfloat16(), gs)
    assert packed.shape == (3, 32) and packed.dtype == torch.uint8
    assert sf.shape == (3, 4) and sf.dtype == torch.float8_e4m3fn
    yb = y.bfloat16().float().view(3, 4, 16)
    amax = yb.abs().amax(-1)
    assert torch.equal(sf, (2.0 * (amax / torch.full_like(amax, 6.0))).clamp(max=448).to(torch.float8_e4m3fn))
    assert sf[1, 1].float() == 0 and (unpack_fp4(packed)[1, 16:32] == 0).all()
    assert sf[2, 0].float() == 448
    s = sf.float()
    scaled = yb * torch.where(s == 0, torch.zeros_like(s), 2.0 / s).unsqueeze(-1)
    codes = unpack_fp4(packed).view(3, 4, 16)
    assert codes.flatten().tolist() == [_nearest_even(v) for v in scaled.flatten().tolist()]
    with pytest.raises(ValueError, match="n=40 is not a multiple of the block of 16"):
        nvfp4_reference(torch.zeros(1, 40), gs)


def test_nvfp4_swizzled_scales_follow_the_128x4_tiles():
    m, k = 130, 6
    sf = torch.arange(m * k, dtype=torch.int32).remainder(251).to(torch.uint8).view(m, k).view(torch.float8_e4m3fn)
    flat = swizzle_nvfp4_scales(sf).view(torch.uint8)
    kp = 8
    assert flat.numel() == 256 * kp
    for r in range(m):
        for c in range(k):
            at = ((r // 128) * (kp // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
            assert flat[at] == sf.view(torch.uint8)[r, c]
    assert int(flat.sum()) == int(sf.view(torch.uint8).long().sum())  # the padding is 0


def test_mxfp4_shared_exponent():
    y = torch.zeros(6, 32)
    y[0, :3] = torch.tensor([6.0, -3.0, 0.5])   # amax 6: X = 0
    y[1, 0] = 1.0                                # amax 1: X = -2, values y * 4
    y[2, 0] = 7.9                                # X = 0: 7.9 saturates to 6
    y[4, 0] = 1e-40                              # a denormal amax: X clamps at -127
    y[5, 0] = float("nan")
    packed, scales = mxfp4_reference(y)
    assert scales.flatten().tolist() == [127, 125, 127, 0, 0, 255]
    values = e2m1_values(unpack_fp4(packed))
    assert values[0, :3].tolist() == [6.0, -3.0, 0.5] and values[1, 0] == 4.0 and values[2, 0] == 6.0
    assert (values[3] == 0).all()


def test_mxfp4_rceil_is_the_smallest_power_of_two_over_amax_times_a_sixth():
    """aiter's RoundUp: 2^X >= fp32(amax * fp32(1/6)), the smallest such (a subnormal product gives 2^-126)."""
    amax = torch.tensor([1.0, 6.0, 7.0, 12.0, 0.3, 3e38, 1e-40, 0.0, float("inf")])
    y = torch.zeros(len(amax), 32)
    y[:, 5] = amax
    packed, scales = mxfp4_reference(y, rounding="rceil")
    assert scales.flatten().tolist() == [125, 127, 128, 128, 123, 253, 1, 0, 255]
    sixth = amax * torch.tensor(1 / 6, dtype=torch.float32)
    for a, s, b in zip(amax[:6].tolist(), sixth[:6].tolist(), scales.flatten()[:6].tolist()):
        assert 2.0 ** (b - 127) >= s > 2.0 ** (b - 128), (a, b)
    values = e2m1_values(unpack_fp4(packed))
    assert values[2, 5] == 4.0 and values[3, 5] == 6.0  # 7 / 2 = 3.5: the tie goes to 4; 12 / 2 = 6: no clipping


def test_mxfp4_even_rounds_amax_at_its_second_mantissa_bit():
    """Quark's EVEN: amax's exponent after + 0x200000 (1.75 * 2^k and up round to 2^(k+1)), minus 2."""
    amax = torch.tensor([1.0, 1.5, 1.74, 1.75, 7.0, 0.0, 1e-40, float("nan")])
    y = torch.zeros(len(amax), 32)
    y[:, 0] = amax
    _, scales = mxfp4_reference(y, rounding="even")
    assert scales.flatten().tolist() == [125, 125, 125, 126, 128, 0, 0, 255]
    with pytest.raises(ValueError, match="rounding='up'"):
        mxfp4_reference(y, rounding="up")


def test_pow2_ceil_is_exact_around_powers_of_two():
    for k in (-20, -1, 0, 3, 30):
        p = 2.0 ** k
        above = torch.nextafter(torch.tensor([p]), torch.tensor([math.inf]))
        below = torch.nextafter(torch.tensor([p]), torch.tensor([0.0]))
        assert pow2_ceil(torch.tensor([p])).item() == p
        assert pow2_ceil(above).item() == 2 * p and pow2_ceil(below).item() == p
    assert ue8m0_bytes(torch.tensor([1.0, 0.5, 2.0 ** -126, float("nan")])).tolist() == [127, 126, 1, 255]


def test_fp8_group_ue8m0_scales_and_codes():
    g = torch.Generator().manual_seed(1)
    y = (torch.randn(5, 384, generator=g) * 10).bfloat16().float()
    y[3, :128] = 0.0
    q, s = fp8_group_ue8m0_reference(y, 128)
    amax = y.view(5, 3, 128).abs().amax(-1)
    lower = torch.clamp(amax / torch.full_like(amax, 448.0), min=1 / (512 * 448.0))
    frac, _ = torch.frexp(s)
    assert (frac == 0.5).all() and (s >= lower).all() and (s < 2 * lower).all()
    assert s[3, 0] == pow2_ceil(torch.tensor(1 / (512 * 448.0)))
    ref = (y.view(5, 3, 128) / s.unsqueeze(-1)).clamp(-448, 448).to(torch.float8_e4m3fn).view(5, 384)
    assert torch.equal(q.view(torch.uint8), ref.view(torch.uint8))  # 1 / s is exact: division gives the same codes


def test_packed_ue8m0_row_and_mn_major():
    s = torch.ldexp(torch.ones(5, 6), torch.arange(30, dtype=torch.int32).view(5, 6) - 10)
    rows = pack_ue8m0(s)
    assert rows.shape == (5, 2) and rows.dtype == torch.int32
    as_bytes = rows.contiguous().view(torch.uint8).view(5, 8)
    assert torch.equal(as_bytes[:, :6], ue8m0_bytes(s)) and (as_bytes[:, 6:] == 0).all()
    mn = pack_ue8m0(s, mn_major=True)
    assert mn.shape == (5, 2) and mn.stride() == (1, 8) and torch.equal(mn, rows)
    assert (mn.stride(1) * 4) % 16 == 0

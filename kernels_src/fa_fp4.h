// fa_fp4.h: 4-bit E2M1 values and their block scales (docs/design.md section 1b): NVFP4 (an E4M3 scale per
// 16 values under a global fp32 scale) and MXFP4 (OCP Microscaling: a UE8M0 power of two per 32 values).
// Every rounding is exact and IEEE (no approximate reciprocal), so the bytes are those of the torch
// references in fused_ar/reference.py.
#pragma once
#include "fa_fp8.h"

// E2M1 code of v: the nearest of 0, 0.5, 1, 1.5, 2, 3, 4, 6, ties to the even code, saturating at 6 (an
// infinity too); a NaN, which E2M1 cannot hold, becomes the largest magnitude. Bit 3 is v's sign bit.
// Branch-free, with the FPU's own rounding: a = min(|v|, 6) (a NaN compares false: 6) added to
// c = 2^(E + 22), E = max(floor(log2 a), 0), lands on a multiple k of ulp(c) = 2^(E - 1), rounded to nearest
// even by the add itself; k is the low bits of a + c (c's mantissa is 0), and the code is k + 2E (same parity
// as k, so ties go to the even code). About 8 instructions against a chain of compares.
FA_INLINE fa_u32 fa_e2m1(float v) {
  const fa_u32 sign = (fa_float_as_u32(v) >> 28) & 8u;
  const float abs_v = fa_abs(v);
  const float a = abs_v < 6.0f ? abs_v : 6.0f;
  fa_u32 exponent = fa_float_as_u32(a) & 0x7f800000u;
  exponent = exponent > 0x3f800000u ? exponent : 0x3f800000u;  // 2^E, E >= 0
  const fa_u32 c = exponent + (22u << 23);
  const fa_u32 k = fa_float_as_u32(a + fa_u32_as_float(c)) - c;
  return sign | (k + ((exponent - 0x3f800000u) >> 22));
}

// The value of an E4M3FN code of a non-negative number (0x7f: NaN). Selects, not branches: a branch here
// splits every block's lanes.
FA_INLINE float fa_e4m3_value(fa_u32 code) {
  const fa_u32 e = (code >> 3) & 15u, m = code & 7u;
  const float subnormal = (float)m * (1.0f / 512.0f);  // m * 2^-9, exact
  const float normal = fa_u32_as_float(((e + 127u - 7u) << 23) | (m << 20));
  return code == 0x7fu ? fa_u32_as_float(0x7fc00000u) : (e == 0 ? subnormal : normal);
}

// NVFP4's block scale code: e4m3(min(global * (amax / 6), 448)), a NaN amax giving the NaN code.
FA_INLINE fa_u32 fa_nvfp4_scale(float global, float amax) {
  const float s = global * fa_div(amax, 6.0f);
  return fa_fp8(s > FA_FP8_MAX ? FA_FP8_MAX : s);
}

// MXFP4's scale byte (UE8M0: X + 127 for the scale 2^X; 255, NaN, for a non-finite amax) by
// FA_MXFP4_ROUNDING (docs/design.md section 1b): 0, OCP's X = floor(log2(amax)) - 2, clamped to [-127, 127];
// 1, AMD aiter's default (RoundUp, also NVIDIA's and FlashInfer's "RCEIL"): the biased exponent of
// s = amax * fp32(1/6), one up where s's mantissa is not 0; 2, AMD Quark's EVEN: the biased exponent of amax
// rounded at its second mantissa bit (+0x200000, mantissa dropped), minus 2, at least 0. `inverse` is 2^-X, a
// normal float (X <= 126 for a finite amax; 2^127 for byte 0 and 255), so y * 2^-X is exactly y / 2^X: one
// rounding of the same real number.
FA_INLINE fa_u32 fa_mxfp4_scale(float amax, float& inverse) {
  const fa_u32 bits = fa_float_as_u32(amax);
  const fa_u32 e = (bits >> 23) & 0xffu;
#if FA_MXFP4_ROUNDING == 1
  const fa_u32 s = fa_float_as_u32(amax * (1.0f / 6.0f));
  const fa_u32 se = (s >> 23) & 0xffu;
  const fa_u32 byte = e == 255u ? 255u : se + (fa_u32)((s & 0x7fffffu) != 0u && se < 255u);
#elif FA_MXFP4_ROUNDING == 2
  const fa_u32 rounded = ((bits + 0x200000u) >> 23) & 0xffu;
  const fa_u32 byte = e == 255u ? 255u : (rounded >= 2u ? rounded - 2u : 0u);
#else
  const fa_u32 byte = e == 255u ? 255u : (e >= 2u ? e - 2u : 0u);
#endif
  inverse = fa_u32_as_float((byte >= 254u ? 254u : 254u - byte) << 23);
  return byte;
}

// A pack's values as E2M1 codes of v * s, two a byte, the first in the low nibble.
template <int N>
FA_INLINE void fa_store_fp4_pack(fa_u8* row, int pack, const float (&v)[N], float s) {
  static_assert(N == 2 || N == 4 || N == 8, "FP4 packs are whole bytes of 1, 2 or 4");
  fa_u32 word = 0;
#pragma unroll
  for (int i = 0; i < N; ++i) word |= fa_e2m1(v[i] * s) << (4 * i);
  if constexpr (N == 8) {
    reinterpret_cast<fa_u32*>(row)[pack] = word;
  } else if constexpr (N == 4) {
    reinterpret_cast<unsigned short*>(row)[pack] = (unsigned short)word;
  } else {
    row[pack] = (fa_u8)word;
  }
}

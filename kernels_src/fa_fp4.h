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

// MXFP4's shared exponent X = floor(log2(amax)) - 2, clamped to [-127, 127]: -127 for 0, subnormals and a
// non-finite amax (whose byte is 255). Returns the UE8M0 byte; `inverse` is 2^-X, a normal float (X <= 125
// for a finite amax), so y * 2^-X is exactly y / 2^X: one rounding of the same real number.
FA_INLINE fa_u32 fa_mxfp4_scale(float amax, float& inverse) {
  const int e = (int)((fa_float_as_u32(amax) >> 23) & 0xffu);
  const int x = (e == 0 || e == 255) ? -127 : (e - 129 < -127 ? -127 : e - 129);
  inverse = fa_u32_as_float((fa_u32)(127 - x) << 23);
  return e == 255 ? 255u : (fa_u32)(x + 127);
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

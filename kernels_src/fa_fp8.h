// fa_fp8.h: float -> FP8 E4M3, round to nearest even, for values clamped to +-M (docs/design.md section 1b;
// NVIDIA's cvt.rn.satfinite saturates by itself, so there the caller leaves the clamp to it), in the two
// formats serving uses: E4M3FN (OCP: bias 7, max 448, NaN 0x7f/0xff, a -0) and E4M3FNUZ (bias 8, max 240,
// NaN 0x80, no -0). Rendering defines FA_FP8_FNUZ (the format) and FA_FP8_HW (1: the target converts this
// format in hardware: sm_89+ E4M3FN with cvt.rn.satfinite, gfx942 E4M3FNUZ and gfx950 E4M3FN with
// v_cvt_pk_fp8_f32). Both ways give the same bits: the exact rounding below.
#pragma once
#include "fa_platform.h"

typedef unsigned char fa_u8;

#if FA_FP8_FNUZ
#define FA_FP8_MAX 240.0f
#define FA_FP8_BIAS 8
#else
#define FA_FP8_MAX 448.0f
#define FA_FP8_BIAS 7
#endif

// The software conversion: exact round-to-nearest-even of |v| <= FA_FP8_MAX (a NaN gives the format's NaN).
FA_INLINE fa_u8 fa_fp8_software(float v) {
  const fa_u32 bits = fa_float_as_u32(v);
  const fa_u32 sign = (bits >> 24) & 0x80u;
  const fa_u32 mag = bits & 0x7fffffffu;
  if (mag > 0x7f800000u) {  // NaN
#if FA_FP8_FNUZ
    return (fa_u8)0x80u;
#else
    return (fa_u8)(sign | 0x7fu);
#endif
  }
  const float a = fa_u32_as_float(mag);
  fa_u32 code;
  // Below the smallest normal (2^(1 - bias)), values are multiples of 2^(-2 - bias): round |v| / 2^(-2 - bias)
  // to an integer, nearest even (exact: a power-of-two scaling, then rint); 8 is the smallest normal's code.
  if (a < fa_u32_as_float((fa_u32)(127 + 1 - FA_FP8_BIAS) << 23)) {
    code = (fa_u32)fa_rint(a * fa_u32_as_float((fa_u32)(127 + 2 + FA_FP8_BIAS) << 23));
  } else {
    // Keep 3 of the 23 mantissa bits, nearest even (a carry moves into the exponent), then rebias.
    const fa_u32 rounded = mag + 0x7ffffu + ((mag >> 20) & 1u);
    code = ((rounded >> 20) - ((fa_u32)(127 - FA_FP8_BIAS) << 3)) & 0x7fu;
  }
#if FA_FP8_FNUZ
  return (fa_u8)(code == 0 ? 0u : (sign | code));  // no -0 in FNUZ: its code is the NaN
#else
  return (fa_u8)(sign | code);
#endif
}

// Two values (lo, hi) as two FP8 bytes of a 16-bit word, lo in the low byte.
FA_INLINE fa_u32 fa_fp8x2(float lo, float hi) {
#if FA_FP8_HW && FA_NVIDIA
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
#elif FA_FP8_HW && FA_AMD
  return (fa_u32)__builtin_amdgcn_cvt_pk_fp8_f32(lo, hi, 0, false) & 0xffffu;
#else
  return (fa_u32)fa_fp8_software(lo) | ((fa_u32)fa_fp8_software(hi) << 8);
#endif
}

FA_INLINE fa_u8 fa_fp8(float v) { return (fa_u8)(fa_fp8x2(v, 0.0f) & 0xffu); }

// fa_rmsnorm.h: the residual add + RMSNorm epilogue of docs/design.md section 1, one pack at a time.
// Shared by the local add_rmsnorm kernel and the fused all-reduce kernels, which feed it their
// all-reduced values; it never touches a peer's memory.
#pragma once
#include "fa_types.h"

// residual_out = T(ar + residual), returned as a pack; sumsq accumulates float(residual_out)^2.
// Callers keep the T pack, not floats, for the scaling pass: half the registers for 16-bit T.
FA_INLINE fa_pack_t fa_residual_add(const float (&ar)[FA_PACK_ELEMS], const fa_pack_t& residual, fa_norm_t& sumsq) {
  float v[FA_PACK_ELEMS];
  fa_unpack(residual, v);
#pragma unroll
  for (int i = 0; i < FA_PACK_ELEMS; ++i) {
    v[i] = fa_round_to_elem(ar[i] + v[i]);
    sumsq += (fa_norm_t)v[i] * (fa_norm_t)v[i];
  }
  return fa_pack(v);
}

// 1 / sqrt(mean + eps) from the row's sum of squares, with IEEE division and square root in fa_norm_t.
FA_INLINE fa_norm_t fa_inv_rms(fa_norm_t sumsq, int cols, float eps) {
  const fa_norm_t mean = sumsq / (fa_norm_t)cols;
  return (fa_norm_t)1 / fa_sqrt(mean + (fa_norm_t)eps);
}

// out = T(residual_out * inv_rms * weight).
FA_INLINE fa_pack_t fa_normalize(const fa_pack_t& residual_out, const fa_pack_t& weight, fa_norm_t inv_rms) {
  float v[FA_PACK_ELEMS];
  float w[FA_PACK_ELEMS];
  fa_unpack(residual_out, v);
  fa_unpack(weight, w);
#pragma unroll
  for (int i = 0; i < FA_PACK_ELEMS; ++i) {
    v[i] = (float)((fa_norm_t)v[i] * inv_rms * (fa_norm_t)w[i]);
  }
  return fa_pack(v);
}

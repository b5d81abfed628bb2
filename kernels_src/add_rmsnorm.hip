// add_rmsnorm: residual_out = T(x + residual); out = RMSNorm(residual_out) * weight (docs/design.md section 1
// with N = 1). One block per row, rows taken grid-stride; each thread keeps up to FA_REG_PACKS packs in
// registers, so x and residual are read once and both outputs written once for rows up to
// FA_BLOCK * FA_REG_PACKS packs; wider rows re-read their own residual_out (this thread's writes).
#include "fa_rmsnorm.h"
#include "fa_reduce.h"

extern "C" __global__ FA_LAUNCH_BOUNDS(FA_BLOCK) void FA_KERNEL_NAME(
    fa_elem_t* __restrict__ out, fa_elem_t* __restrict__ residual_out, const fa_elem_t* __restrict__ x,
    const fa_elem_t* __restrict__ residual, const fa_elem_t* __restrict__ weight, int rows, int cols,
    float eps) {
  const int packs = cols / FA_PACK_ELEMS;
  const int tid = fa_thread_id();
  for (int row = fa_block_id(); row < rows; row += fa_grid_blocks()) {
    const fa_i64 base = (fa_i64)row * packs;
    // All loads of the row (weight too) are issued before the first store, so they are in flight together.
    fa_pack_t xs[FA_REG_PACKS];
    fa_pack_t rs[FA_REG_PACKS];
    fa_pack_t ws[FA_REG_PACKS];
#pragma unroll
    for (int k = 0; k < FA_REG_PACKS; ++k) {
      const int p = tid + k * FA_BLOCK;
      if (p < packs) {
        xs[k] = fa_load_pack(x, base + p);
        rs[k] = fa_load_pack(residual, base + p);
        ws[k] = fa_load_pack(weight, p);
      }
    }
    fa_norm_t sumsq = 0;
#pragma unroll
    for (int k = 0; k < FA_REG_PACKS; ++k) {
      const int p = tid + k * FA_BLOCK;
      if (p < packs) {
        float ar[FA_PACK_ELEMS];
        fa_unpack(xs[k], ar);
        rs[k] = fa_residual_add(ar, rs[k], sumsq);  // rs[k] now holds residual_out
        fa_store_pack(residual_out, base + p, rs[k]);
      }
    }
    for (int p = tid + FA_REG_PACKS * FA_BLOCK; p < packs; p += FA_BLOCK) {
      float ar[FA_PACK_ELEMS];
      fa_unpack(fa_load_pack(x, base + p), ar);
      fa_store_pack(residual_out, base + p, fa_residual_add(ar, fa_load_pack(residual, base + p), sumsq));
    }

    const fa_norm_t inv_rms = fa_inv_rms(fa_block_reduce_sum<FA_BLOCK>(sumsq), cols, eps);

#pragma unroll
    for (int k = 0; k < FA_REG_PACKS; ++k) {
      const int p = tid + k * FA_BLOCK;
      if (p < packs) fa_store_pack(out, base + p, fa_normalize(rs[k], ws[k], inv_rms));
    }
    for (int p = tid + FA_REG_PACKS * FA_BLOCK; p < packs; p += FA_BLOCK) {
      fa_store_pack(out, base + p, fa_normalize(fa_load_pack(residual_out, base + p), fa_load_pack(weight, p), inv_rms));
    }
  }
}

// allreduce_rmsnorm: ar = T(sum over ranks of x_r, fp32, rank order); residual_out = T(ar + residual);
// out = RMSNorm(residual_out) * weight (docs/design.md section 1). Block b owns rows b, b + grid, ... on every
// rank. FA_TWO_STAGE 0 (one-stage, small m): every rank reads whole rows from all N inputs.
// FA_TWO_STAGE 1: stage 1 reduces this rank's 1/N of each owned row's packs and stores the T result into
// every rank's tmp; a barrier; stage 2 runs add + RMSNorm on the complete rows in the local tmp.
// Both end with a barrier, so no rank starts overwriting buffers (input, tmp) that a peer still reads.
#include "fa_rmsnorm.h"
#include "fa_reduce.h"
#include "fa_peers.h"

// Packs per thread kept in registers between the sum of squares and the scaling (as in add_rmsnorm).
FA_INLINE void fa_rmsnorm_rows_from(const fa_peers_t* peers, const fa_elem_t* local_tmp, fa_elem_t* out,
                                    fa_elem_t* residual_out, const fa_elem_t* residual, const fa_elem_t* weight,
                                    int row, int packs, int cols, float eps) {
  const int tid = fa_thread_id();
  const fa_i64 base = (fa_i64)row * packs;
  fa_pack_t ros[FA_REG_PACKS];
  fa_norm_t sumsq = 0;
#pragma unroll
  for (int k = 0; k < FA_REG_PACKS; ++k) {
    const int p = tid + k * FA_BLOCK;
    if (p < packs) {
      float ar[FA_PACK_ELEMS];
#if FA_TWO_STAGE
      fa_unpack(fa_load_pack_peer(local_tmp, base + p), ar);  // already T(sum over ranks)
#else
      fa_allreduce_pack(peers, base + p, ar);
#endif
      ros[k] = fa_residual_add(ar, fa_load_pack(residual, base + p), sumsq);
      fa_store_pack(residual_out, base + p, ros[k]);
    }
  }
  for (int p = tid + FA_REG_PACKS * FA_BLOCK; p < packs; p += FA_BLOCK) {
    float ar[FA_PACK_ELEMS];
#if FA_TWO_STAGE
    fa_unpack(fa_load_pack_peer(local_tmp, base + p), ar);
#else
    fa_allreduce_pack(peers, base + p, ar);
#endif
    fa_store_pack(residual_out, base + p, fa_residual_add(ar, fa_load_pack(residual, base + p), sumsq));
  }
  const fa_norm_t inv_rms = fa_inv_rms(fa_block_reduce_sum<FA_BLOCK>(sumsq), cols, eps);
#pragma unroll
  for (int k = 0; k < FA_REG_PACKS; ++k) {
    const int p = tid + k * FA_BLOCK;
    if (p < packs) fa_store_pack(out, base + p, fa_normalize(ros[k], fa_load_pack(weight, p), inv_rms));
  }
  for (int p = tid + FA_REG_PACKS * FA_BLOCK; p < packs; p += FA_BLOCK) {
    fa_store_pack(out, base + p, fa_normalize(fa_load_pack(residual_out, base + p), fa_load_pack(weight, p), inv_rms));
  }
}

extern "C" __global__ FA_REGISTER_BOUNDS(FA_BLOCK) void FA_KERNEL_NAME(
    const fa_peers_t* __restrict__ peers, int rank, fa_elem_t* __restrict__ out,
    fa_elem_t* __restrict__ residual_out, const fa_elem_t* __restrict__ residual,
    const fa_elem_t* __restrict__ weight, int rows, int cols, float eps, fa_i64 timeout_ns) {
  const int packs = cols / FA_PACK_ELEMS;
  __shared__ fa_block_state_t state;
  const fa_barrier_t bar = fa_barrier_begin(peers, rank, timeout_ns, rows, cols, &state);
  if (!fa_barrier(bar, FA_PHASE_START)) return;  // every rank's input is in place, and the same call
#if FA_TWO_STAGE
  fa_elem_t* const local_tmp = (fa_elem_t*)peers->tmp[rank];
  int lo, hi;
  fa_rank_range(packs, rank, lo, hi);
  for (int row = fa_block_id(); row < rows; row += fa_grid_blocks()) {
    const fa_i64 base = (fa_i64)row * packs;
    for (int p = lo + fa_thread_id(); p < hi; p += FA_BLOCK) {
      float ar[FA_PACK_ELEMS];
      fa_allreduce_pack(peers, base + p, ar);
      const fa_pack_t reduced = fa_pack(ar);
#pragma unroll
      for (int r = 0; r < FA_NGPUS; ++r) fa_store_pack_peer((fa_elem_t*)peers->tmp[r], base + p, reduced);
    }
  }
  if (!fa_barrier(bar, FA_PHASE_MID)) return;  // every rank's share of this block's rows is in the local tmp
#else
  const fa_elem_t* const local_tmp = nullptr;
#endif
  for (int row = fa_block_id(); row < rows; row += fa_grid_blocks()) {
    fa_rmsnorm_rows_from(peers, local_tmp, out, residual_out, residual, weight, row, packs, cols, eps);
  }
  if (fa_barrier(bar, FA_PHASE_END)) fa_barrier_end(bar);  // no peer still reads this rank's input or writes its tmp
}

// allreduce_rmsnorm: ar = T(sum over ranks of x_r, fp32, rank order); residual_out = T(ar + residual);
// out = RMSNorm(residual_out) * (weight + offset), in T or FP8 (docs/design.md sections 1 and 1b); residual
// and the outputs have their own row strides (elements), the inputs are contiguous (staged or registered).
// Block b owns rows b, b + grid, ... on every rank. FA_TWO_STAGE 0 (one-stage, small m): every rank reads whole rows from all N inputs.
// FA_TWO_STAGE 1: stage 1 reduces this rank's 1/N of each owned row's packs and stores the T result into
// every rank's tmp; a barrier; stage 2 runs add + RMSNorm on the complete rows in the local tmp.
// Both end with a barrier, so no rank starts overwriting buffers (input, tmp) that a peer still reads.
// stage_src (eager calls, contiguous x; else 0): x itself, which each block copies into the staging buffer
// before the start barrier (fa_stage_packs); 0: the inputs are staged or registered already. scale_copy (static
// FP8; else 0): this rank's copy of the static scale, written by one thread (the scales a torch op returns).
// FA_SCATTER 1 (reduce_scatter_rmsnorm, one-stage): this rank reduces only its `rows` rows, which start at
// row `first_row` of the inputs, and writes them from row 0 of its outputs; the descriptor names the whole
// call's `all_rows`, and every rank runs the same grid (its shard may be shorter, or empty).
#include "fa_rmsnorm.h"
#include "fa_reduce.h"
#include "fa_peers.h"

#if FA_INPLACE  // residual_out may be residual: no __restrict__ on the two
#define FA_RESTRICT
#else
#define FA_RESTRICT __restrict__
#endif

// Where a row's values come from: every rank's input, summed in fp32 in rank order and rounded to T
// (one-stage), or this rank's tmp buffer, which stage 1 filled with those sums (two-stage). Rows are
// whole packs (the communicator routes other widths to the fallback).
struct fa_peer_source_t {
  static constexpr bool has_tail = false;
  const void* const* input;  // the block state's copy of the table's input pointers
  const fa_elem_t* local_tmp;
  fa_i64 base;  // the row's first pack in the contiguous inputs / tmp
  FA_INLINE fa_pack_t load(int pack) const {
#if FA_TWO_STAGE
    return fa_load_pack_peer(local_tmp, base + pack);  // already T(sum over ranks)
#else
    float ar[FA_PACK_ELEMS];
    fa_allreduce_pack(input, base + pack, ar);
    return fa_pack(ar);
#endif
  }
  FA_INLINE float load_elem(int) const { return 0.0f; }
};

extern "C" __global__ FA_REGISTER_BOUNDS(FA_BLOCK) void FA_KERNEL_NAME(
    const fa_peers_t* __restrict__ peers, fa_signal_t* own_signal, int rank, fa_out_t* __restrict__ out,
    fa_elem_t* FA_RESTRICT residual_out, const fa_elem_t* FA_RESTRICT residual,
    const fa_weight_t* __restrict__ weight, int rows, int cols, float eps, float weight_offset,
    fa_i64 residual_stride, fa_i64 out_stride, fa_i64 residual_out_stride, fa_scale_t* __restrict__ scales, int group,
    fa_i64 scales_stride, fa_i64 scales_col_stride,
    const float* __restrict__ global_scale, int scales_row0, float* __restrict__ scale_copy, fa_i64 timeout_ns,
    int release_early,
    const fa_elem_t* __restrict__ stage_src
#if FA_SCATTER
    , int first_row, int all_rows
#endif
    ) {
  fa_grid_dependency_wait();  // before any global access: the previous kernel's writes are ours to read
  fa_peer_release(release_early);
  const float static_scale = fa_static_scale_for_copy(scales, scale_copy);
  const int packs = cols / FA_PACK_ELEMS;
  __shared__ fa_block_state_t state;
#if FA_SCATTER
  const fa_barrier_t bar = fa_barrier_begin(peers, own_signal, rank, timeout_ns, all_rows, cols, &state);
  const fa_i64 source_row = first_row;
#else
  const fa_barrier_t bar = fa_barrier_begin(peers, own_signal, rank, timeout_ns, rows, cols, &state);
  const fa_i64 source_row = 0;
  if (stage_src) {  // an eager call: this block's rows into the staging buffer (the scatter op's host stages them)
    for (int row = fa_block_id(); row < rows; row += fa_grid_blocks())
      fa_stage_packs(peers, rank, stage_src, (fa_i64)row * packs + fa_thread_id(), (fa_i64)(row + 1) * packs, FA_BLOCK);
  }
#endif
  const bool started = fa_barrier(bar, FA_PHASE_START);  // every rank's input is in place, and the same call
  fa_copy_static_scale(scale_copy, static_scale);  // this rank's own copy: every rank returns its scales
  if (!started) return;
#if FA_TWO_STAGE
  fa_elem_t* const local_tmp = (fa_elem_t*)state.tmp[rank];
  int lo, hi;
  fa_rank_range(packs, rank, lo, hi);
  for (int row = fa_block_id(); row < rows; row += fa_grid_blocks()) {
    const fa_i64 base = (fa_i64)row * packs;
    for (int p = lo + fa_thread_id(); p < hi; p += FA_BLOCK) {
      float ar[FA_PACK_ELEMS];
      fa_allreduce_pack(state.input, base + p, ar);
      const fa_pack_t reduced = fa_pack(ar);
#pragma unroll
      for (int r = 0; r < FA_NGPUS; ++r) fa_store_pack_peer((fa_elem_t*)state.tmp[r], base + p, reduced);
    }
  }
  if (!fa_barrier(bar, FA_PHASE_MID)) return;  // every rank's share of this block's rows is in the local tmp
#else
  const fa_elem_t* const local_tmp = nullptr;
#endif
  for (int row = fa_block_id(); row < rows; row += fa_grid_blocks()) {
    const fa_peer_source_t src = {state.input, local_tmp, (source_row + row) * packs};
    const fa_row_io_t io = {out + row * out_stride, residual_out + row * residual_out_stride,
                            residual + row * residual_stride, weight, scales + row * scales_stride, group,
                            scales_col_stride, global_scale, scales_row0 + row};
    fa_add_rmsnorm_row(src, io, cols, eps, weight_offset);
  }
  if (fa_barrier(bar, FA_PHASE_END)) fa_barrier_end(bar);  // no peer still reads this rank's input or writes its tmp
}

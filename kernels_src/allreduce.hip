// allreduce: out = T(sum over ranks of x_r, fp32, rank order), flat over all packs (docs/design.md section 1).
// Block b, thread t take packs b * FA_BLOCK + t + k * grid * FA_BLOCK on every rank, so the pairwise block
// barriers order exactly what block b exchanges. FA_TWO_STAGE 0: each rank reduces every pack from all N
// inputs. FA_TWO_STAGE 1: stage 1 reduces this rank's 1/N of the packs into every rank's tmp; a barrier;
// stage 2 copies all N shares from the local tmp to out. Both end with a barrier. stage_src: as in
// allreduce_rmsnorm.hip (x itself for an eager call, copied into the staging buffer by the kernel; else 0).
#include "fa_types.h"
#include "fa_peers.h"

extern "C" __global__ FA_REGISTER_BOUNDS(FA_BLOCK) void FA_KERNEL_NAME(
    const fa_peers_t* __restrict__ peers, fa_signal_t* own_signal, int rank, fa_elem_t* __restrict__ out,
    fa_i64 packs, int rows, int cols, fa_i64 timeout_ns, int release_early, const fa_elem_t* __restrict__ stage_src) {
  fa_grid_dependency_wait();  // before any global access: the previous kernel's writes are ours to read
  fa_peer_release(release_early);
  const fa_i64 first = (fa_i64)fa_block_id() * FA_BLOCK + fa_thread_id();
  const fa_i64 stride = (fa_i64)fa_grid_blocks() * FA_BLOCK;
  __shared__ fa_block_state_t state;
  // rows, cols: x's shape
  const fa_barrier_t bar = fa_barrier_begin(peers, own_signal, rank, timeout_ns, rows, cols, &state);
#if FA_TWO_STAGE
  const fa_i64 share = (packs + FA_NGPUS - 1) / FA_NGPUS;  // rank r owns [r * share, min((r + 1) * share, packs))
  if (stage_src) {  // an eager call: what this block index reads of every rank's share
#pragma unroll
    for (int r = 0; r < FA_NGPUS; ++r) {
      const fa_i64 lo = share * r;
      fa_stage_packs(peers, rank, stage_src, lo + first, lo + share < packs ? lo + share : packs, stride);
    }
  }
#else
  if (stage_src) fa_stage_packs(peers, rank, stage_src, first, packs, stride);  // an eager call: what this block reads
#endif
  if (!fa_barrier(bar, FA_PHASE_START)) return;  // every rank's input is in place, and the same call
#if FA_TWO_STAGE
  {
    const fa_i64 lo = share * rank;
    const fa_i64 hi = lo + share < packs ? lo + share : packs;
    for (fa_i64 p = lo + first; p < hi; p += stride) {
      float ar[FA_PACK_ELEMS];
      fa_allreduce_pack(state.input, p, ar);
      const fa_pack_t reduced = fa_pack(ar);
#pragma unroll
      for (int r = 0; r < FA_NGPUS; ++r) fa_store_pack_peer((fa_elem_t*)state.tmp[r], p, reduced);
    }
  }
  if (!fa_barrier(bar, FA_PHASE_MID)) return;  // every rank's share written by this block index is in the local tmp
  const fa_elem_t* local_tmp = (const fa_elem_t*)state.tmp[rank];
#pragma unroll
  for (int r = 0; r < FA_NGPUS; ++r) {
    const fa_i64 lo = share * r;
    const fa_i64 hi = lo + share < packs ? lo + share : packs;
    for (fa_i64 p = lo + first; p < hi; p += stride) fa_store_pack(out, p, fa_load_pack_peer(local_tmp, p));
  }
#else
  for (fa_i64 p = first; p < packs; p += stride) {
    float ar[FA_PACK_ELEMS];
    fa_allreduce_pack(state.input, p, ar);
    fa_store_pack(out, p, fa_pack(ar));
  }
#endif
  if (fa_barrier(bar, FA_PHASE_END)) fa_barrier_end(bar);  // no peer still reads this rank's input or writes its tmp
}

// fa_peers.h: what one rank sees of its group: the peer pointer table, the signal buffer layout, the
// block barrier, and the fp32 rank-order sum of one pack over every rank's input.
// FA_NGPUS, FA_MAX_BLOCKS and FA_MAX_RANKS come from rendering (fused_ar/kernels.py defines the latter two).
#pragma once
#include "fa_types.h"

#define FA_PHASE_START 0
#define FA_PHASE_MID 1
#define FA_PHASE_END 2
#define FA_PHASES 3

// One per rank, in that rank's signal allocation (uncached on AMD), zeroed at creation.
struct fa_signal_t {
  fa_u32 flags[FA_PHASES][FA_MAX_BLOCKS][FA_MAX_RANKS];  // [phase][block][rank that arrived]
  fa_u32 epoch[FA_MAX_BLOCKS];  // calls this rank has completed per block index; only this rank writes it
  fa_u32 error;                 // 0, or the first spin that gave up: see FA_ERROR_*
};

// error = FA_ERROR_TIMEOUT | block << 12 | phase << 8 | peer (fused_ar/communicator.py decodes it)
#define FA_ERROR_TIMEOUT 0x1000000u

// Device-side table of this rank's view of the group (addresses valid in this process).
struct fa_peers_t {
  const void* input[FA_MAX_RANKS];  // each rank's staged input (or registered graph input)
  void* tmp[FA_MAX_RANKS];          // each rank's two-stage buffer
  fa_signal_t* signal[FA_MAX_RANKS];
};

struct fa_barrier_t {
  fa_signal_t* const* signal;
  int rank;
  fa_u32 flag;
  fa_u64 deadline_ns;
};

// Every call of a kernel uses flag = epoch + 1 for all its phases; flags only ever compare for equality,
// so the 32-bit counter may wrap.
FA_INLINE fa_barrier_t fa_barrier_begin(const fa_peers_t* peers, int rank, fa_i64 timeout_ns) {
  fa_barrier_t b;
  b.signal = peers->signal;
  b.rank = rank;
  b.flag = peers->signal[rank]->epoch[fa_block_id()] + 1u;
  b.deadline_ns = fa_timer_ns() + (fa_u64)timeout_ns;
  return b;
}

// Block b of this rank meets block b of every rank. Kernels give block b the same work on every rank
// (same grid, same index mapping), so this pairwise meeting orders exactly the data block b exchanges.
FA_INLINE void fa_barrier(const fa_barrier_t& b, int phase) {
  const int t = fa_thread_id();
  const int block = fa_block_id();
  fa_sync_block();  // every thread's earlier reads and writes happen before thread t's release below
  if (t < FA_NGPUS) {
    // Tell rank t that this block reached `phase`, releasing this block's writes to rank t.
    fa_store_release_sys(&b.signal[t]->flags[phase][block][b.rank], b.flag);
    const fa_u32* arrived = &b.signal[b.rank]->flags[phase][block][t];
    // Acquire rank t's writes made before it reached `phase`; bounded, never a hang.
    while (fa_load_acquire_sys(arrived) != b.flag) {
      if (fa_timer_ns() > b.deadline_ns) {
        // The first timeout is the cause; later ones (past the same deadline) would hide it.
        fa_cas_sys(&b.signal[b.rank]->error, 0u,
                   FA_ERROR_TIMEOUT | ((fa_u32)block << 12) | ((fa_u32)phase << 8) | (fa_u32)t);
        break;
      }
    }
  }
  fa_sync_block();  // thread t's acquire orders rank t's writes before every thread's reads after this
}

// After the last phase: this block's call is complete on every rank, so the next call may use flag + 1.
FA_INLINE void fa_barrier_end(const fa_barrier_t& b) {
  if (fa_thread_id() == 0) b.signal[b.rank]->epoch[fa_block_id()] = b.flag;
}

// acc = sum over ranks 0..N-1, in that order, of float(input_r[pack]); all N loads issued first.
FA_INLINE void fa_sum_ranks(const fa_peers_t* peers, fa_i64 pack, float (&acc)[FA_PACK_ELEMS]) {
  fa_pack_t in[FA_NGPUS];
#pragma unroll
  for (int r = 0; r < FA_NGPUS; ++r) in[r] = fa_load_pack_peer((const fa_elem_t*)peers->input[r], pack);
#pragma unroll
  for (int i = 0; i < FA_PACK_ELEMS; ++i) acc[i] = 0.0f;  // 0 + x0 as the reference does (-0 becomes +0)
#pragma unroll
  for (int r = 0; r < FA_NGPUS; ++r) {
    float v[FA_PACK_ELEMS];
    fa_unpack(in[r], v);
#pragma unroll
    for (int i = 0; i < FA_PACK_ELEMS; ++i) acc[i] += v[i];
  }
}

// ar = T(sum over ranks), as floats.
FA_INLINE void fa_allreduce_pack(const fa_peers_t* peers, fa_i64 pack, float (&ar)[FA_PACK_ELEMS]) {
  fa_sum_ranks(peers, pack, ar);
#pragma unroll
  for (int i = 0; i < FA_PACK_ELEMS; ++i) ar[i] = fa_round_to_elem(ar[i]);
}

// This rank's share [lo, hi) of `count` items split over FA_NGPUS ranks; the remainder is spread.
FA_INLINE void fa_rank_range(int count, int rank, int& lo, int& hi) {
  lo = (int)(((fa_i64)count * rank) / FA_NGPUS);
  hi = (int)(((fa_i64)count * (rank + 1)) / FA_NGPUS);
}

// fa_peers.h: what one rank sees of its group: the peer pointer table, the signal buffer layout, the
// block barrier, and the fp32 rank-order sum of one pack over every rank's input.
// FA_NGPUS, FA_MAX_BLOCKS and FA_MAX_RANKS come from rendering (fused_ar/kernels.py defines the latter two).
#pragma once
#include "fa_types.h"

#define FA_PHASE_START 0
#define FA_PHASE_MID 1
#define FA_PHASE_END 2
#define FA_PHASES 3

// FA_CHECKS 1 (always, outside scripts/check_cost.py, which measures their cost): every spin is bounded
// by the timeout and gives up as soon as another block of this rank recorded an error (FA_CHECK_WAITS),
// and the start barrier compares the call descriptors of all ranks (FA_CHECK_DESC). The two halves
// exist apart only so that their costs can be told apart.
#ifndef FA_CHECKS
#define FA_CHECKS 1
#endif
#ifndef FA_CHECK_WAITS
#define FA_CHECK_WAITS FA_CHECKS
#endif
#ifndef FA_CHECK_DESC
#define FA_CHECK_DESC FA_CHECKS
#endif
#ifndef FA_CHECK_SPINS
#define FA_CHECK_SPINS 64
#endif

// What a call is, as every rank publishes it with its start flag (FA_DESC_WORDS words): op and dtype
// codes and the grid, rows, cols. Ranks that disagree stop before touching any data
// (fused_ar.MismatchError). FA_OP_CODE, FA_DTYPE_CODE, FA_DESC_WORDS and the FA_ERROR_* codes are
// rendered from fused_ar/kernels.py, which decodes what the kernels record.

// One per rank, in that rank's signal allocation (uncached on AMD), zeroed at creation.
struct fa_signal_t {
  fa_u32 flags[FA_PHASES][FA_MAX_BLOCKS][FA_MAX_RANKS];      // [phase][block][rank that arrived]
  fa_u32 desc[FA_MAX_BLOCKS][FA_MAX_RANKS][FA_DESC_WORDS];   // that rank's call, with its start flag
  fa_u32 epoch[FA_MAX_BLOCKS];  // calls this rank has completed per block index; only this rank writes it
  fa_u32 error;  // device copy of the first error: once set, every spin of this rank gives up at once
};

// An error word: FA_ERROR_TIMEOUT, _MISMATCH or _UNREGISTERED | block << 12 | phase << 8 | peer.

// The host-visible report of this rank (mapped pinned host memory): read by the host on every call
// without a device synchronization. The first error fills it; `ready` says the fields are complete.
struct fa_report_t {
  fa_u32 error;     // first error code, as in fa_signal_t::error
  fa_u32 missing;   // bit r: a block of this rank gave up waiting for rank r
  fa_u32 mine[FA_DESC_WORDS];
  fa_u32 theirs[FA_DESC_WORDS];  // the disagreeing peer's descriptor (FA_ERROR_MISMATCH)
  fa_u32 ready;
};

// Device-side table of this rank's view of the group (addresses valid in this process). One per
// communicator for eager calls (inputs: the staging buffers) and one per graph-captured call (inputs:
// the captured tensors, filled in when the graph's buffers are registered).
struct fa_peers_t {
  const void* input[FA_MAX_RANKS];  // each rank's staged input (or registered graph input)
  void* tmp[FA_MAX_RANKS];          // each rank's two-stage buffer
  fa_signal_t* signal[FA_MAX_RANKS];
  fa_report_t* report;              // this rank's host-visible report
  fa_u64 registered;                // 0 in a graph table whose inputs are not known yet
};

// The host writes and reads these by the sizes fused_ar/kernels.py renders in: a layout change that
// forgets one side fails to compile.
static_assert(sizeof(fa_signal_t) == FA_SIGNAL_BYTES, "fa_signal_t differs from fused_ar.kernels.SIGNAL_BYTES");
static_assert(sizeof(fa_report_t) == 4 * FA_REPORT_WORDS, "fa_report_t differs from fused_ar.kernels.REPORT_WORDS");
static_assert(sizeof(fa_peers_t) == FA_PEER_TABLE_BYTES, "fa_peers_t differs from fused_ar.kernels.PEER_TABLE_BYTES");

// What the barriers of one call need besides the peer table, per block in shared memory: values kept
// in registers would be live through the whole kernel body, and at 1024 threads (64 registers each on
// sm_90) ptxas spills them. Threads 0..N-1 write it at the begin; threads that give up set `failed`;
// every read follows a block sync.
// The table's pointers are copied here too, before the start barrier, and nothing reads the table after
// it: each barrier's acquire empties the SM's L1 (CCTL.IVALL on sm_90), so a pointer read from the table
// after one is an L2 round trip in front of the load or store it addresses (every thread's first peer load,
// each barrier's flag stores), on the path of every call.
struct fa_block_state_t {
  const void* input[FA_NGPUS];  // the table's, for the reads after the start barrier
  void* tmp[FA_NGPUS];
  fa_signal_t* signal[FA_NGPUS];
  fa_signal_t* own;  // signal[rank]
  fa_report_t* report;
  fa_i64 timeout_ns;
  fa_u32 flag;      // this call's flag: epoch + 1
  int failed;       // set by any thread of the block that gave up
  int rows, cols;   // with the op, dtype and grid: this call's descriptor (fa_desc)
};

struct fa_barrier_t {
  int rank;
  fa_block_state_t* state;  // the kernel's __shared__ one
};

// Word i of this call's descriptor.
FA_INLINE fa_u32 fa_desc(const fa_barrier_t& b, int i) {
  return i == 0 ? (fa_u32)FA_OP_CODE | (fa_u32)FA_DTYPE_CODE << 8 | (fa_u32)fa_grid_blocks() << 16
                : (fa_u32)(i == 1 ? b.state->rows : b.state->cols);
}

// The first error of this rank fills the report; later ones only add the peer they waited for. `own`: this
// rank's signal buffer.
FA_INLINE void fa_record_in(const fa_barrier_t& b, fa_signal_t* own, fa_report_t* report, fa_u32 code,
                            const fa_u32* theirs, int peer) {
  fa_or_sys(&report->missing, code & FA_ERROR_TIMEOUT ? 1u << peer : 0u);
  if (fa_cas_sys(&own->error, 0u, code) == 0u) {
#pragma unroll
    for (int i = 0; i < FA_DESC_WORDS; ++i) {
      fa_store_relaxed_sys(&report->mine[i], fa_desc(b, i));
      fa_store_relaxed_sys(&report->theirs[i], theirs ? fa_load_relaxed_sys(&theirs[i]) : 0u);
    }
    fa_store_relaxed_sys(&report->error, code);
    fa_store_release_sys(&report->ready, 1u);
  }
  b.state->failed = 1;
}

FA_INLINE void fa_record(const fa_barrier_t& b, fa_u32 code, const fa_u32* theirs, int peer) {
  fa_record_in(b, b.state->own, b.state->report, code, theirs, peer);
}

// Programmatic dependent launch: the next kernel on this rank's stream may become resident (and wait there)
// once every block of this one has called fa_grid_launch_dependents. A rank alone on its GPU lets it at
// once (release_early 1): all of this kernel's blocks are resident by then, so the dependent cannot keep
// any of them from its barrier. Ranks sharing one GPU let it only at exit (0): a dependent of one rank,
// resident and waiting for that rank's spinning kernel, would hold SM slots that another rank's blocks of
// the same call still need (a hang until the timeout).
FA_INLINE void fa_peer_release(int release_early) {
  if (release_early) fa_grid_launch_dependents();
}

// Every call of a kernel uses flag = epoch + 1 for all its phases; flags only ever compare for equality,
// so the 32-bit counter may wrap. `state` is a __shared__ fa_block_state_t of the kernel; the first
// fa_barrier's block sync publishes what threads 0..N-1 write here (until then, each reads the table).
FA_INLINE fa_barrier_t fa_barrier_begin(const fa_peers_t* peers, fa_signal_t* own, int rank, fa_i64 timeout_ns,
                                        int rows, int cols, fa_block_state_t* state) {
  fa_barrier_t b;
  b.rank = rank;
  b.state = state;
  if (fa_thread_id() < FA_NGPUS) {  // rank t's entries by thread t: the loads in flight together
    state->input[fa_thread_id()] = peers->input[fa_thread_id()];
    state->tmp[fa_thread_id()] = peers->tmp[fa_thread_id()];
    state->signal[fa_thread_id()] = peers->signal[fa_thread_id()];
  }
  if (fa_thread_id() == 0) {
    state->own = own;
    state->report = peers->report;
    state->timeout_ns = timeout_ns;
    state->rows = rows;
    state->cols = cols;
    state->flag = own->epoch[fa_block_id()] + 1u;
    state->failed = 0;
    if (!peers->registered) {  // a graph replayed before its buffers were registered: touch nothing
      state->failed = 1;
      if (fa_block_id() == 0) fa_record_in(b, own, peers->report, FA_ERROR_UNREGISTERED, nullptr, rank);
    }
  }
  return b;
}

// Block b of this rank meets block b of every rank; each wait gives up after the timeout. Kernels give
// block b the same work on every rank (same grid, same index mapping), so this pairwise meeting orders
// exactly the data block b exchanges.
// Returns false (in every thread of the block) if this rank gave up: a timeout, a mismatch, or an error
// another block recorded; the caller then returns without touching data.
FA_INLINE bool fa_barrier(const fa_barrier_t& b, int phase) {
  const int t = fa_thread_id();
  const int block = fa_block_id();
  fa_sync_block();  // every thread's earlier reads and writes happen before thread t's release below
  if (t < FA_NGPUS && !b.state->failed) {
    const fa_u32 flag = b.state->flag;
    fa_signal_t* peer = b.state->signal[t];
    fa_signal_t* own = b.state->own;
#if FA_CHECK_DESC
    if (phase == FA_PHASE_START) {
#pragma unroll
      for (int i = 0; i < FA_DESC_WORDS; ++i) fa_store_relaxed_sys(&peer->desc[block][b.rank][i], fa_desc(b, i));
    }
#endif
    // Tell rank t that this block reached `phase`, releasing this block's writes to rank t.
    fa_store_release_sys(&peer->flags[phase][block][b.rank], flag);
    const fa_u32* arrived = &own->flags[phase][block][t];
    // Acquire rank t's writes made before it reached `phase`; bounded, never a hang.
    // Checked every FA_CHECK_SPINS polls: a peer that is already there costs nothing, and a long wait
    // (ranks sharing one GPU spin a lot) adds one load and one timer read per FA_CHECK_SPINS polls.
    fa_u64 deadline_ns = 0;
    for (fa_u32 spins = 0; fa_load_acquire_sys(arrived) != flag; ++spins) {
#if FA_CHECK_WAITS
      if (spins % FA_CHECK_SPINS == FA_CHECK_SPINS - 1) {
        if (fa_load_relaxed_sys(&own->error) != 0u) {
          b.state->failed = 1;
          break;
        }
        const fa_u64 now = fa_timer_ns();
        if (spins == FA_CHECK_SPINS - 1) deadline_ns = now + (fa_u64)b.state->timeout_ns;
        if (now > deadline_ns) {
          fa_record(b, FA_ERROR_TIMEOUT | ((fa_u32)block << 12) | ((fa_u32)phase << 8) | (fa_u32)t, nullptr, t);
          break;
        }
      }
#endif
    }
#if FA_CHECK_DESC
    if (phase == FA_PHASE_START && !b.state->failed) {
      // Rank t wrote its descriptor before releasing the flag just acquired (in global memory, so the
      // record below reads it from there: no local array). All words are loaded before any compares:
      // `same && load` would wait one memory round trip per word on the path of every call.
      const fa_u32* theirs = own->desc[block][t];
      fa_u32 words[FA_DESC_WORDS];
#pragma unroll
      for (int i = 0; i < FA_DESC_WORDS; ++i) words[i] = fa_load_relaxed_sys(&theirs[i]);
      fa_u32 differ = 0u;
#pragma unroll
      for (int i = 0; i < FA_DESC_WORDS; ++i) differ |= words[i] ^ fa_desc(b, i);
      if (differ != 0u) fa_record(b, FA_ERROR_MISMATCH | ((fa_u32)block << 12) | (fa_u32)t, theirs, t);
    }
#endif
  }
  fa_sync_block();  // thread t's acquire orders rank t's writes before every thread's reads after this
  return !b.state->failed;
}

// After the last phase: this block's call is complete on every rank, so the next call may use flag + 1.
FA_INLINE void fa_barrier_end(const fa_barrier_t& b) {
  if (fa_thread_id() == 0) b.state->own->epoch[fa_block_id()] = b.state->flag;
}

// An eager call's input copied into this rank's staging buffer (the eager table's own input) by the kernel
// itself, before its start barrier: packs lo, lo + step, ... below hi of `src` (contiguous, 16-byte aligned).
// Each block copies exactly the packs that block index reads on any rank, so the start barrier's release
// publishes them to the peers that read them. The buffer is free: this kernel starts after the previous
// call's kernel on this stream ended, which every block did only after its end barrier met every peer's
// block of its index, so no peer still reads any of it (whatever rows each block index owned then). One
// launch instead of a copy and a launch.
FA_INLINE void fa_stage_packs(const fa_peers_t* peers, int rank, const fa_elem_t* src, fa_i64 lo, fa_i64 hi,
                              fa_i64 step) {
  fa_elem_t* const staging = (fa_elem_t*)peers->input[rank];
  for (fa_i64 p = lo; p < hi; p += step) fa_store_pack_peer(staging, p, fa_load_pack(src, p));
}

// Rank r's input pointer from the block state's copy (shared memory), read afresh at each use: kept in registers
// across a row's packs, N of them pushed the 8-rank fp32 kernels of 512 threads past their 128 registers (spills).
FA_INLINE const fa_elem_t* fa_peer_input(const void* const* input, int r) {
  return (const fa_elem_t*)((const void* const volatile*)input)[r];
}

// acc = sum over ranks 0..N-1, in that order, of float(input_r[pack]); all N loads issued first. `input`: the
// block state's copy of the table's input pointers.
FA_INLINE void fa_sum_ranks(const void* const* input, fa_i64 pack, float (&acc)[FA_PACK_ELEMS]) {
  fa_pack_t in[FA_NGPUS];
#pragma unroll
  for (int r = 0; r < FA_NGPUS; ++r) in[r] = fa_load_pack_peer(fa_peer_input(input, r), pack);
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
FA_INLINE void fa_allreduce_pack(const void* const* input, fa_i64 pack, float (&ar)[FA_PACK_ELEMS]) {
  fa_sum_ranks(input, pack, ar);
#pragma unroll
  for (int i = 0; i < FA_PACK_ELEMS; ++i) ar[i] = fa_round_to_elem(ar[i]);
}

// This rank's share [lo, hi) of `count` items split over FA_NGPUS ranks; the remainder is spread.
FA_INLINE void fa_rank_range(int count, int rank, int& lo, int& hi) {
  lo = (int)(((fa_i64)count * rank) / FA_NGPUS);
  hi = (int)(((fa_i64)count * (rank + 1)) / FA_NGPUS);
}

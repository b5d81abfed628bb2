// all_gather: out (all_rows rows of cols, contiguous) = every rank's shard in rank order; rank r's shard is
// rows [r * shard_rows, min((r + 1) * shard_rows, all_rows)) of out (the last shards may be shorter, or
// empty). One launch moves rows [first, first + count) of every shard: rank r's are at row `source_first`
// of its input (0 where the input is the staged chunk, `first` where it is the registered shard itself).
// Block b, thread t take packs b * FA_BLOCK + t + k * grid * FA_BLOCK of each shard on every rank, so the
// pairwise block barriers order exactly what block b reads; the end barrier keeps every input in place
// until no peer reads it.
#include "fa_types.h"
#include "fa_peers.h"

extern "C" __global__ FA_REGISTER_BOUNDS(FA_BLOCK) void FA_KERNEL_NAME(
    const fa_peers_t* __restrict__ peers, fa_signal_t* own_signal, int rank, fa_elem_t* __restrict__ out,
    int all_rows, int cols, int shard_rows, int first, int count, int source_first, fa_i64 timeout_ns,
    int release_early) {
  fa_grid_dependency_wait();  // before any global access: the previous kernel's writes are ours to read
  fa_peer_release(release_early);
  const fa_i64 packs = cols / FA_PACK_ELEMS;
  const fa_i64 start = (fa_i64)fa_block_id() * FA_BLOCK + fa_thread_id();
  const fa_i64 stride = (fa_i64)fa_grid_blocks() * FA_BLOCK;
  __shared__ fa_block_state_t state;
  const fa_barrier_t bar = fa_barrier_begin(peers, own_signal, rank, timeout_ns, all_rows, cols, &state);
  if (!fa_barrier(bar, FA_PHASE_START)) return;  // every rank's shard is in place, and the same call
#pragma unroll
  for (int r = 0; r < FA_NGPUS; ++r) {
    fa_i64 shard = (fa_i64)all_rows - (fa_i64)r * shard_rows;  // rows of shard r
    shard = shard < 0 ? 0 : (shard > shard_rows ? shard_rows : shard);
    fa_i64 rows = shard - first;  // of them, this launch's
    rows = rows < 0 ? 0 : (rows > count ? count : rows);
    const fa_i64 n = rows * packs;
    const fa_elem_t* src = (const fa_elem_t*)state.input[r];
    fa_elem_t* dst = out + ((fa_i64)r * shard_rows + first) * cols;
    for (fa_i64 p = start; p < n; p += stride) fa_store_pack(dst, p, fa_load_pack_peer(src, source_first * packs + p));
  }
  if (fa_barrier(bar, FA_PHASE_END)) fa_barrier_end(bar);  // no peer still reads this rank's input
}

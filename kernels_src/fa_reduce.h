// fa_reduce.h: the one reduction every kernel uses, per wave and per block: a sum, or a max (of non-negative
// values: the FP8 scales' amax, where lanes outside a DPP row mask contribute 0).
// AMD: a DPP tree (quad_perm, row_ror, row_bcast15/31, readlane), no LDS traffic; ds_bpermute only
// where DPP cannot express the lane pattern. NVIDIA: a __shfl_xor_sync butterfly.
// Every lane returns the same bits, so every rank that runs the same code gets the same sum.
#pragma once
#include "fa_platform.h"

#if FA_AMD
// DPP_CTRL encodings of the GCN/CDNA ISA.
#define FA_DPP_QUAD_PERM(a, b, c, d) ((a) | ((b) << 2) | ((c) << 4) | ((d) << 6))
#define FA_DPP_ROW_ROR(n) (0x120 + (n))
#define FA_DPP_ROW_MIRROR 0x140
#define FA_DPP_ROW_HALF_MIRROR 0x141
#define FA_DPP_ROW_BCAST15 0x142
#define FA_DPP_ROW_BCAST31 0x143
#define FA_DPP_ALL_ROWS 0xf
#define FA_DPP_ALL_BANKS 0xf

// A value moved across lanes one 32-bit word at a time (DPP and readlane move words; T may be a double).
template <typename T>
struct fa_words {
  static_assert(sizeof(T) % 4 == 0, "lane moves work on whole 32-bit words");
  int w[sizeof(T) / 4];
};

// Op(v, v moved by CTRL). Rows outside ROW_MASK keep the old value 0 (+0.0), the identity of both ops.
template <int CTRL, int ROW_MASK, class Op, typename T>
FA_INLINE T fa_dpp_combine(T v) {
  const fa_words<T> in = __builtin_bit_cast(fa_words<T>, v);
  fa_words<T> moved;
#pragma unroll
  for (int i = 0; i < (int)(sizeof(T) / 4); ++i) {
    moved.w[i] = __builtin_amdgcn_update_dpp(0, in.w[i], CTRL, ROW_MASK, FA_DPP_ALL_BANKS, false);
  }
  return Op::apply(v, __builtin_bit_cast(T, moved));
}

template <typename T>
FA_INLINE T fa_readlane(T v, int lane) {
  fa_words<T> words = __builtin_bit_cast(fa_words<T>, v);
#pragma unroll
  for (int i = 0; i < (int)(sizeof(T) / 4); ++i) words.w[i] = __builtin_amdgcn_readlane(words.w[i], lane);
  return __builtin_bit_cast(T, words);
}

template <typename T>
FA_INLINE T fa_bpermute(T v, int src_lane) {
  fa_words<T> words = __builtin_bit_cast(fa_words<T>, v);
#pragma unroll
  for (int i = 0; i < (int)(sizeof(T) / 4); ++i) words.w[i] = __builtin_amdgcn_ds_bpermute(src_lane * 4, words.w[i]);
  return __builtin_bit_cast(T, words);
}
#endif

struct fa_sum_op {
  template <typename T>
  static FA_INLINE T apply(T a, T b) { return a + b; }
};

// The larger; a NaN in either wins (as torch's amax), so a NaN row gets a NaN scale.
struct fa_max_op {
  template <typename T>
  static FA_INLINE T apply(T a, T b) { return (a > b || a != a) ? a : b; }
};

// Op over one wave, T = float or double. Every lane returns the same bits.
template <class Op, typename T>
FA_INLINE T fa_wave_reduce(T v) {
#if FA_AMD && FA_WAVE_SIZE == 64
  v = fa_dpp_combine<FA_DPP_QUAD_PERM(1, 0, 3, 2), FA_DPP_ALL_ROWS, Op>(v);  // lane pairs
  v = fa_dpp_combine<FA_DPP_QUAD_PERM(2, 3, 0, 1), FA_DPP_ALL_ROWS, Op>(v);  // quads of 4
  v = fa_dpp_combine<FA_DPP_ROW_ROR(4), FA_DPP_ALL_ROWS, Op>(v);             // 8 lanes
  v = fa_dpp_combine<FA_DPP_ROW_ROR(8), FA_DPP_ALL_ROWS, Op>(v);             // rows of 16
  v = fa_dpp_combine<FA_DPP_ROW_BCAST15, 0xa, Op>(v);  // rows 1 and 3 take in lane 15 of rows 0 and 2
  v = fa_dpp_combine<FA_DPP_ROW_BCAST31, 0xc, Op>(v);  // rows 2 and 3 take in lane 31: lane 63 holds it all
  // One lane's value for all lanes: the row results above differ in association from lane to lane.
  return fa_readlane(v, 63);
#elif FA_AMD
  // Wave sizes without row broadcasts: an xor butterfly through ds_bpermute.
#pragma unroll
  for (int offset = FA_WAVE_SIZE / 2; offset > 0; offset >>= 1) v = Op::apply(v, fa_bpermute(v, fa_lane() ^ offset));
  return v;
#else
  // Op(a, b) == Op(b, a) bit for bit, so both partners of every butterfly step hold the same value.
#pragma unroll
  for (int offset = FA_WAVE_SIZE / 2; offset > 0; offset >>= 1) {
    v = Op::apply(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
#endif
}

template <typename T>
FA_INLINE T fa_wave_reduce_sum(T v) {
  return fa_wave_reduce<fa_sum_op>(v);
}

// Op over the whole block; every thread of the block must call it. Returns the same bits to all threads.
template <int BLOCK, class Op, typename T>
FA_INLINE T fa_block_reduce(T v) {
  constexpr int kWaves = (BLOCK + FA_WAVE_SIZE - 1) / FA_WAVE_SIZE;
  static_assert(BLOCK % FA_WAVE_SIZE == 0, "block size must be a whole number of waves");
  static_assert(kWaves <= FA_WAVE_SIZE, "one wave must be able to hold every wave's partial result");
  v = fa_wave_reduce<Op>(v);
  if constexpr (kWaves == 1) {
    return v;
  } else {
    __shared__ T partial[kWaves];
    if (fa_lane() == 0) partial[fa_wave_id()] = v;
    fa_sync_block();  // every wave's partial is in LDS before any wave reads them
    const T t = fa_lane() < kWaves ? partial[fa_lane()] : T(0);
    fa_sync_block();  // every read is done before a later call (the next row) overwrites partial[]
    return fa_wave_reduce<Op>(t);
  }
}

// The sum over the block of K values a thread, value k of thread t standing for item t + k * BLOCK of a row
// (a pack): each wave sums each of its K values, and the waves' sums, at slot k * (BLOCK / wave size) + wave
// (the item's own wave: item / wave size), are summed as one wave (slots no item reaches add zeros). So the
// order is that of the items alone: a row of at most K * BLOCK items gets the same bits from any BLOCK and K.
// Every thread of the block must call it; all get the same bits.
template <int BLOCK, int K, typename T>
FA_INLINE T fa_block_reduce_items_sum(const T (&v)[K]) {
  constexpr int kWaves = BLOCK / FA_WAVE_SIZE;
  static_assert(BLOCK % FA_WAVE_SIZE == 0, "block size must be a whole number of waves");
  static_assert(K * kWaves <= FA_WAVE_SIZE, "one wave must be able to hold every item wave's sum");
  T waves[K];
#pragma unroll
  for (int k = 0; k < K; ++k) waves[k] = fa_wave_reduce_sum(v[k]);
  __shared__ T partial[K * kWaves];
  if (fa_lane() == 0) {
#pragma unroll
    for (int k = 0; k < K; ++k) partial[k * kWaves + fa_wave_id()] = waves[k];
  }
  fa_sync_block();  // every wave's sums are in LDS before any wave reads them
  const T t = fa_lane() < K * kWaves ? partial[fa_lane()] : T(0);
  fa_sync_block();  // every read is done before a later call (the next row) overwrites partial[]
  return fa_wave_reduce_sum(t);
}

// The max over each aligned run of `lanes` consecutive lanes (a power of two up to the wave size, the same
// in every lane of the wave) of an abs max (v >= 0, or a NaN with its sign clear), returned to every lane of
// the run. Every lane of the wave calls it together (NVIDIA's shuffle names the whole warp, so the compiler
// adds no convergence checks).
// Max is exact whatever the order, so each lane may combine in its own order. AMD: after the pair and quad
// steps every lane holds its quad's max, so the half-row mirror (lane i takes 7 - i) completes runs of 8
// and the row mirror (15 - i) runs of 16; runs of 32 and 64 combine the rows' maxima read with readlane
// (which reads a lane whatever its activity: a run's own rows are active).
FA_INLINE float fa_lanes_max(float v, int lanes) {
#if FA_AMD
  if (lanes >= 2) v = fa_dpp_combine<FA_DPP_QUAD_PERM(1, 0, 3, 2), FA_DPP_ALL_ROWS, fa_max_op>(v);
  if (lanes >= 4) v = fa_dpp_combine<FA_DPP_QUAD_PERM(2, 3, 0, 1), FA_DPP_ALL_ROWS, fa_max_op>(v);
  if (lanes >= 8) v = fa_dpp_combine<FA_DPP_ROW_HALF_MIRROR, FA_DPP_ALL_ROWS, fa_max_op>(v);
  if (lanes >= 16) v = fa_dpp_combine<FA_DPP_ROW_MIRROR, FA_DPP_ALL_ROWS, fa_max_op>(v);
  if (lanes >= 32) {
    const float low = fa_max_op::apply(fa_readlane(v, 0), fa_readlane(v, 16));
#if FA_WAVE_SIZE == 64
    const float high = fa_max_op::apply(fa_readlane(v, 32), fa_readlane(v, 48));
    v = lanes == 64 ? fa_max_op::apply(low, high) : (fa_lane() < 32 ? low : high);
#else
    v = low;
#endif
  }
  return v;
#else
  // v is an abs max (non-negative or a NaN with its sign clear): an integer max of the bit patterns orders it
  // as fa_max_op does, one instruction a step.
  fa_u32 bits = fa_float_as_u32(v);
  for (int offset = 1; offset < lanes; offset <<= 1) {
    const fa_u32 other = __shfl_xor_sync(0xffffffffu, bits, offset);
    bits = other > bits ? other : bits;
  }
  return fa_u32_as_float(bits);
#endif
}

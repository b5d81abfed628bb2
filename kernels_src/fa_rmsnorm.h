// fa_rmsnorm.h: the residual add + RMSNorm of one row (docs/design.md sections 1 and 1b), shared by the
// local add_rmsnorm kernel and the fused all-reduce kernels, which differ only in where a row's values come
// from (a Source: x itself, every rank's input, the local two-stage buffer). It never touches a peer's
// memory itself. Rendering defines FA_WEIGHT (FA_WEIGHT_SAME | FP32 | NONE), FA_RESIDUAL (0: no residual
// add, residual_out = the row's values), FA_QUANT (FA_QUANT_NONE: out in T; STATIC | TOKEN | GROUP: out in
// FP8 with a given, per-row or per-group scale), FA_SCALE_POW2 (per-group scales rounded up to a power of
// two), FA_SCALE_UE8M0 (those scales stored as their exponent byte, four to a 32-bit word), FA_GROUP_SHARED
// (the per-group amax may go through shared memory) and FA_REG_PACKS.
#pragma once
#include "fa_types.h"
#include "fa_reduce.h"
#include "fa_fp4.h"

#define FA_QUANT_NONE 0
#define FA_QUANT_STATIC 1
#define FA_QUANT_TOKEN 2
#define FA_QUANT_GROUP 3
#define FA_QUANT_NVFP4 4
#define FA_QUANT_MXFP4 5
#define FA_QUANT_FP4 (FA_QUANT == FA_QUANT_NVFP4 || FA_QUANT == FA_QUANT_MXFP4)

#if FA_QUANT == FA_QUANT_NONE
typedef fa_elem_t fa_out_t;
#else
typedef fa_u8 fa_out_t;
#endif
#if FA_QUANT_FP4
typedef fa_u8 fa_scale_t;  // one byte a block: E4M3 (NVFP4) or UE8M0 (MXFP4)
#else
typedef float fa_scale_t;  // fp32 scales, or UE8M0 bytes four to a 32-bit word
#endif

#define FA_WEIGHT_SAME 0  // weight has x's dtype
#define FA_WEIGHT_FP32 1  // fp32 weight with a 16-bit T (Gemma checkpoints in vLLM)
#define FA_WEIGHT_NONE 2  // no weight: a weight of ones, never read

#if FA_WEIGHT == FA_WEIGHT_FP32 && FA_ELEM_BYTES == 2
typedef float fa_weight_t;
// One pack's weights: FA_PACK_ELEMS floats, loaded in 16-byte (or narrower) accesses.
struct alignas(FA_PACK_ELEMS * 4 < 16 ? FA_PACK_ELEMS * 4 : 16) fa_wpack_t {
  float v[FA_PACK_ELEMS];
};
FA_INLINE void fa_unpack_weight(const fa_wpack_t& p, float (&w)[FA_PACK_ELEMS]) {
#pragma unroll
  for (int i = 0; i < FA_PACK_ELEMS; ++i) w[i] = p.v[i];
}
FA_INLINE float fa_weight_elem(const fa_weight_t* weight, int col) { return weight[col]; }
#elif FA_WEIGHT == FA_WEIGHT_NONE
typedef fa_elem_t fa_weight_t;
struct fa_wpack_t {};
FA_INLINE void fa_unpack_weight(const fa_wpack_t&, float (&w)[FA_PACK_ELEMS]) {
#pragma unroll
  for (int i = 0; i < FA_PACK_ELEMS; ++i) w[i] = 1.0f;
}
FA_INLINE float fa_weight_elem(const fa_weight_t*, int) { return 1.0f; }
#else
typedef fa_elem_t fa_weight_t;
typedef fa_pack_t fa_wpack_t;
FA_INLINE void fa_unpack_weight(const fa_wpack_t& p, float (&w)[FA_PACK_ELEMS]) { fa_unpack(p, w); }
FA_INLINE float fa_weight_elem(const fa_weight_t* weight, int col) { return fa_load_elem(weight, col); }
#endif

FA_INLINE fa_wpack_t fa_load_wpack(const fa_weight_t* weight, int pack) {
#if FA_WEIGHT == FA_WEIGHT_NONE
  return fa_wpack_t{};
#else
  return reinterpret_cast<const fa_wpack_t*>(weight)[pack];
#endif
}

// residual_out = T(ar + residual) (T(ar) without a residual), as floats; sumsq accumulates its squares.
FA_INLINE void fa_residual_add(float (&v)[FA_PACK_ELEMS], const fa_pack_t& residual, fa_norm_t& sumsq) {
#if FA_RESIDUAL
  float r[FA_PACK_ELEMS];
  fa_unpack(residual, r);
#endif
#pragma unroll
  for (int i = 0; i < FA_PACK_ELEMS; ++i) {
#if FA_RESIDUAL
    v[i] = fa_round_to_elem(v[i] + r[i]);
#endif
    sumsq += (fa_norm_t)v[i] * (fa_norm_t)v[i];
  }
}

// 1 / sqrt(mean + eps) from the row's sum of squares, with IEEE division and square root in fa_norm_t.
FA_INLINE fa_norm_t fa_inv_rms(fa_norm_t sumsq, int cols, float eps) {
  const fa_norm_t mean = sumsq / (fa_norm_t)cols;
  return (fa_norm_t)1 / fa_sqrt(mean + (fa_norm_t)eps);
}

// residual_out * inv_rms * (weight + offset), before rounding to T; offset 0 multiplies by the weight
// itself (a -0 weight keeps its sign, as in the unfused pipeline).
FA_INLINE float fa_scale(float ro, float w, fa_norm_t inv_rms, float offset) {
  const fa_norm_t factor = offset == 0.0f ? (fa_norm_t)w : (fa_norm_t)w + (fa_norm_t)offset;
  return (float)((fa_norm_t)ro * inv_rms * factor);
}

FA_INLINE fa_pack_t fa_normalize(const fa_pack_t& residual_out, const fa_wpack_t& weight, fa_norm_t inv_rms,
                                 float offset) {
  float v[FA_PACK_ELEMS];
  float w[FA_PACK_ELEMS];
  fa_unpack(residual_out, v);
  fa_unpack_weight(weight, w);
#pragma unroll
  for (int i = 0; i < FA_PACK_ELEMS; ++i) v[i] = fa_scale(v[i], w[i], inv_rms, offset);
  return fa_pack(v);
}

FA_INLINE fa_pack_t fa_load_residual(const fa_elem_t* residual, int pack) {
#if FA_RESIDUAL
  return fa_load_pack(residual, pack);
#else
  return fa_pack_t{};
#endif
}

// Where the rows of the local add_rmsnorm come from: x itself, with its own row stride. Any number of
// columns: packs, then a tail of fewer than FA_PACK_ELEMS columns, one per thread.
struct fa_local_source_t {
  static constexpr bool has_tail = true;
  const fa_elem_t* row;
  FA_INLINE fa_pack_t load(int pack) const { return fa_load_pack(row, pack); }
  FA_INLINE float load_elem(int col) const { return fa_load_elem(row, col); }
};

// The output side of one row: the rows it reads or writes, already offset by their row strides.
struct fa_row_io_t {
  fa_out_t* out;  // T, or FP8 codes (FA_QUANT)
  fa_elem_t* residual_out;
  const fa_elem_t* residual;
  const fa_weight_t* weight;
  // FA_QUANT_STATIC: the scale (read); TOKEN: this row's scale; GROUP and FP4: this row's first scale (FP4
  // with FA_SCALE_SWIZZLED: the first of all rows')
  fa_scale_t* scales;
  int group;      // FA_QUANT_GROUP: columns per group (a whole number of packs)
  fa_i64 scales_col_stride;  // FA_QUANT_GROUP: 32-bit words from one group's scale (UE8M0: 4 groups' word) to the next
  const float* global_scale;  // FA_QUANT_NVFP4: the caller's fp32 global scale (read)
  int row;        // FA_SCALE_SWIZZLED: the row's index in the scales' tiles
  float* scale_copy;  // FA_QUANT_STATIC: where thread 0 writes the scale's value (one row of the grid; else null)
};

// y = float(T(residual_out * inv_rms * (weight + offset))): the call's own unquantized out, as a float.
FA_INLINE void fa_normalized(const fa_pack_t& residual_out, const fa_wpack_t& weight, fa_norm_t inv_rms, float offset,
                             float (&y)[FA_PACK_ELEMS]) {
  float w[FA_PACK_ELEMS];
  fa_unpack(residual_out, y);
  fa_unpack_weight(weight, w);
#pragma unroll
  for (int i = 0; i < FA_PACK_ELEMS; ++i) y[i] = fa_round_to_elem(fa_scale(y[i], w[i], inv_rms, offset));
}

// clamp(y * inv, -M, M) as FP8 codes (a NaN stays NaN: no fmin/fmax), stored as one access of a pack's bytes.
// NVIDIA's hardware conversion (cvt.rn.satfinite) saturates to +-M itself, infinities too, and keeps a NaN a
// NaN: the same codes as the clamp, so there the clamp is left to it.
#if FA_FP8_HW && FA_NVIDIA
FA_INLINE float fa_fp8_clamp(float v) { return v; }
#else
FA_INLINE float fa_fp8_clamp(float v) { return v < -FA_FP8_MAX ? -FA_FP8_MAX : (v > FA_FP8_MAX ? FA_FP8_MAX : v); }
#endif

FA_INLINE void fa_store_fp8_pack(fa_u8* row, int pack, const float (&y)[FA_PACK_ELEMS], float inv) {
#if FA_PACK_ELEMS == 1
  row[pack] = fa_fp8(fa_fp8_clamp(y[0] * inv));
#else
  fa_u32 words[(FA_PACK_ELEMS + 3) / 4] = {};
#pragma unroll
  for (int i = 0; i < FA_PACK_ELEMS; i += 2) {
    words[i / 4] |= fa_fp8x2(fa_fp8_clamp(y[i] * inv), fa_fp8_clamp(y[i + 1] * inv)) << (8 * (i % 4));
  }
#if FA_PACK_ELEMS == 2
  reinterpret_cast<unsigned short*>(row)[pack] = (unsigned short)words[0];
#elif FA_PACK_ELEMS == 4
  reinterpret_cast<fa_u32*>(row)[pack] = words[0];
#else
  reinterpret_cast<fa_u64*>(row)[pack] = (fa_u64)words[0] | ((fa_u64)words[1] << 32);
#endif
#endif
}

// max |y| of a pack (a NaN wins). Non-negative floats order as their bit patterns, and a NaN's (sign cleared)
// lie above infinity's: one integer max per element instead of a compare and a select.
FA_INLINE float fa_abs_max(const float (&y)[FA_PACK_ELEMS]) {
  fa_u32 m = 0u;
#pragma unroll
  for (int i = 0; i < FA_PACK_ELEMS; ++i) {
    const fa_u32 a = fa_float_as_u32(y[i]) & 0x7fffffffu;
    m = a > m ? a : m;
  }
  return fa_u32_as_float(m);
}

// y of one tail column (a row that is not a whole number of packs), from this thread's residual_out.
FA_INLINE float fa_tail_y(const fa_row_io_t& io, int col, fa_norm_t inv_rms, float offset) {
  const float ro = fa_load_elem(io.residual_out, col);
  return fa_round_to_elem(fa_scale(ro, fa_weight_elem(io.weight, col), inv_rms, offset));
}

// The scale of an amax: max(amax / M, 1 / (512 M)), in fp32 IEEE (the minimum rounded from double, as torch
// rounds the Python scalar of its clamp).
FA_INLINE float fa_fp8_scale(float amax) {
  return fa_max_op::apply(fa_div(amax, FA_FP8_MAX), (float)(1.0 / (512.0 * (double)FA_FP8_MAX)));
}

// A per-group scale from the group's amax: fa_fp8_scale's, with FA_SCALE_POW2 rounded up to a power of two
// (exact: the scale is a normal float, inf or NaN, which stay; 2^127 rounds up to inf as in torch).
FA_INLINE float fa_group_scale(float amax) {
  const float s = fa_fp8_scale(amax);
#if FA_SCALE_POW2
  const fa_u32 bits = fa_float_as_u32(s);
  if ((bits & 0x7f800000u) != 0x7f800000u && (bits & 0x7fffffu) != 0) return fa_u32_as_float((bits & 0x7f800000u) + 0x800000u);
#endif
  return s;
}

// Stores group g's scale of a row of `groups`: a float, or (FA_SCALE_UE8M0) its exponent byte, byte g % 4 of
// word g / 4; the last group also zeroes the rest of its word, so a row's words hold no stale bytes.
FA_INLINE void fa_store_group_scale(const fa_row_io_t& io, int g, int groups, float s) {
#if FA_SCALE_UE8M0
  fa_u8* word = reinterpret_cast<fa_u8*>(io.scales + (g >> 2) * io.scales_col_stride);
  word[g & 3] = (fa_u8)((fa_float_as_u32(s) >> 23) & 0xffu);
  if (g == groups - 1) {
    for (int j = (g & 3) + 1; j < 4; ++j) word[j] = 0;
  }
#else
  (void)groups;
  io.scales[g * io.scales_col_stride] = s;
#endif
}

// Stores block b's FP4 scale code of a row of `blocks`: at the row's byte b, or (FA_SCALE_SWIZZLED) in the
// NVFP4 GEMMs' layout: tiles of 128 rows x 4 blocks in row-major tile order (the blocks padded to a multiple
// of 4), each tile's 512 bytes ordered [row % 32][(row % 128) / 32][block % 4]. The last block also zeroes
// the padding blocks of its tile row, which the GEMM reads.
FA_INLINE void fa_store_block_scale(const fa_row_io_t& io, int b, int blocks, fa_u32 code) {
#if FA_SCALE_SWIZZLED
  const int padded = (blocks + 3) & ~3;
  fa_scale_t* at = io.scales + (fa_i64)(io.row >> 7) * (padded >> 2) * 512 + (fa_i64)(b >> 2) * 512 +
                   (io.row & 31) * 16 + ((io.row & 127) >> 5) * 4;
  at[b & 3] = (fa_u8)code;
  if (b == blocks - 1) {
    for (int j = (b & 3) + 1; j < 4; ++j) at[j] = 0;
  }
#else
  (void)blocks;
  io.scales[b] = (fa_u8)code;
#endif
}

// A static FP8 scale's value into `copy` (a float the caller allocated; 0: none asked), by one thread of the
// grid: the torch op returns its scales as a new tensor, and this write spares it a copy kernel of its own.
// The all-reduce kernels load the value first and store it after their start barrier: a store right after
// its load held that thread (thread 0 of block 0, which begins the barrier) for a memory round trip.
FA_INLINE float fa_static_scale_for_copy(const fa_scale_t* scales, const float* copy) {
#if FA_QUANT == FA_QUANT_STATIC
  return copy != nullptr && fa_block_id() == 0 && fa_thread_id() == 0 ? (float)scales[0] : 0.0f;
#else
  (void)scales;
  (void)copy;
  return 0.0f;
#endif
}

FA_INLINE void fa_copy_static_scale(float* copy, float value) {
#if FA_QUANT == FA_QUANT_STATIC
  if (copy != nullptr && fa_block_id() == 0 && fa_thread_id() == 0) copy[0] = value;
#else
  (void)copy;
  (void)value;
#endif
}

// Whether a group's packs lie in one run of lanes of a wave, for every pack of the row: adjacent packs go to
// adjacent threads and the block is a whole number of waves, so a group of a power-of-two number of packs
// up to the wave size fills one aligned run.
FA_INLINE bool fa_group_in_lanes(int packs_per_group) {
  return packs_per_group <= FA_WAVE_SIZE && (packs_per_group & (packs_per_group - 1)) == 0;
}

// One row: residual_out = T(ar + residual), out = T(residual_out * inv_rms * (weight + offset)), ar the
// Source's values (already T). All loads of a thread's first FA_REG_PACKS packs (values, residual, weight)
// are issued before its first store, so they are in flight together whatever the compiler may assume about
// aliasing; those packs stay in registers until the scaling. Wider rows re-read their own residual_out (this
// thread's writes). Each element is read before it is written, by the same thread, so residual_out may be
// residual and (locally) out may be x: kernels built for that (FA_INPLACE) only drop __restrict__.
template <class Source>
FA_INLINE void fa_add_rmsnorm_row(const Source& src, const fa_row_io_t& io, int cols, float eps, float offset) {
  const int tid = fa_thread_id();
  const int packs = cols / FA_PACK_ELEMS;
  fa_pack_t vs[FA_REG_PACKS];
  fa_pack_t rs[FA_REG_PACKS];
  fa_wpack_t ws[FA_REG_PACKS];
  // A given scale is read with the row, not where it is used: a load after the block reduction would stall
  // every thread for a memory latency (the whole kernel's time at decode sizes).
#if FA_QUANT == FA_QUANT_STATIC
  const float static_scale = io.scales[0];
#elif FA_QUANT == FA_QUANT_NVFP4
  const float global_scale = io.global_scale[0];
#endif
#pragma unroll
  for (int k = 0; k < FA_REG_PACKS; ++k) {
    const int p = tid + k * FA_BLOCK;
    if (p < packs) {
      vs[k] = src.load(p);
      rs[k] = fa_load_residual(io.residual, p);
      ws[k] = fa_load_wpack(io.weight, p);
    }
  }
#if FA_QUANT == FA_QUANT_STATIC
  // The division waits only for the scale's load, under the row's: after the reduction it would lengthen the
  // serial tail that decode sizes pay in full.
  const float static_inv = fa_div(1.0f, static_scale);
  // Here, after the row's loads: the copy's store waits for the scale's load, and a warp issues in order, so
  // before them it held the warp a memory round trip (the whole call at decode sizes); here the row's own loads,
  // issued with the scale's, take as long.
  if (io.scale_copy != nullptr && tid == 0) io.scale_copy[0] = static_scale;
#endif
  // The row's sum of squares: a partial sum for each of the first kSums register packs, summed in the order
  // of the packs (fa_block_reduce_items_sum), kSums * FA_BLOCK at most the wave size squared. So a row of at
  // most kSums * FA_BLOCK packs (NVIDIA: up to 1024, bf16 n <= 8192) gets the same bits whatever the block
  // and the packs a thread keeps (a quantized call's kernel may keep more than its T call's), and a thread
  // runs kSums short chains of adds where it ran one long one (H100, bf16 256 x 8192: 4.2 us against 5.3).
  // Further packs add to the last partial.
  constexpr int kSums = FA_REG_PACKS * FA_BLOCK <= FA_WAVE_SIZE * FA_WAVE_SIZE
                            ? FA_REG_PACKS : FA_WAVE_SIZE * FA_WAVE_SIZE / FA_BLOCK;
  fa_norm_t sumsq[kSums] = {};
#pragma unroll
  for (int k = 0; k < FA_REG_PACKS; ++k) {
    const int p = tid + k * FA_BLOCK;
    if (p < packs) {
      float v[FA_PACK_ELEMS];
      fa_unpack(vs[k], v);
      fa_residual_add(v, rs[k], sumsq[k < kSums ? k : kSums - 1]);
      rs[k] = fa_pack(v);  // rs[k] now holds residual_out
      fa_store_pack(io.residual_out, p, rs[k]);
    }
  }
  for (int p = tid + FA_REG_PACKS * FA_BLOCK; p < packs; p += FA_BLOCK) {
    float v[FA_PACK_ELEMS];
    fa_unpack(src.load(p), v);
    fa_residual_add(v, fa_load_residual(io.residual, p), sumsq[kSums - 1]);
    fa_store_pack(io.residual_out, p, fa_pack(v));
  }
  // The tail: column packs * FA_PACK_ELEMS + tid, for the threads below its width. Its residual_out is
  // re-read after the reduction (this thread's own write) rather than held across it: holding it made
  // ptxas spill.
  if constexpr (Source::has_tail) {
    const int tail_col = packs * FA_PACK_ELEMS + tid;
    if (tail_col < cols) {
      float v = src.load_elem(tail_col);
#if FA_RESIDUAL
      v = fa_round_to_elem(v + fa_load_elem(io.residual, tail_col));
#endif
      sumsq[0] += (fa_norm_t)v * (fa_norm_t)v;  // after pack tid: the same item in any block
      fa_store_elem(io.residual_out, tail_col, v);
    }
  }

  const fa_norm_t inv_rms = fa_inv_rms(fa_block_reduce_items_sum<FA_BLOCK>(sumsq), cols, eps);

#if FA_QUANT == FA_QUANT_NONE
#pragma unroll
  for (int k = 0; k < FA_REG_PACKS; ++k) {
    const int p = tid + k * FA_BLOCK;
    if (p < packs) fa_store_pack(io.out, p, fa_normalize(rs[k], ws[k], inv_rms, offset));
  }
  for (int p = tid + FA_REG_PACKS * FA_BLOCK; p < packs; p += FA_BLOCK) {
    fa_store_pack(io.out, p, fa_normalize(fa_load_pack(io.residual_out, p), fa_load_wpack(io.weight, p), inv_rms,
                                          offset));
  }
  if constexpr (Source::has_tail) {
    const int tail_col = packs * FA_PACK_ELEMS + tid;
    if (tail_col < cols) {
      const float ro = fa_load_elem(io.residual_out, tail_col);
      fa_store_elem(io.out, tail_col, fa_scale(ro, fa_weight_elem(io.weight, tail_col), inv_rms, offset));
    }
  }
#else
  // FP8: y = float(out) as above; scales from its amax (none for a static scale); then q = F8(clamp(y / s)).
  // y is computed twice, the same arithmetic both times, rather than held across the amax reduction.
  // FA_EACH_Y(BODY) runs BODY with p (the pack) and y (its values): the register packs, then the rest re-read.
#define FA_EACH_Y(BODY)                                                                                     \
  _Pragma("unroll") for (int k = 0; k < FA_REG_PACKS; ++k) {                                               \
    const int p = tid + k * FA_BLOCK;                                                                      \
    if (p < packs) {                                                                                       \
      float y[FA_PACK_ELEMS];                                                                              \
      fa_normalized(rs[k], ws[k], inv_rms, offset, y);                                                     \
      BODY                                                                                                 \
    }                                                                                                      \
  }                                                                                                        \
  for (int p = tid + FA_REG_PACKS * FA_BLOCK; p < packs; p += FA_BLOCK) {                                  \
    float y[FA_PACK_ELEMS];                                                                                \
    fa_normalized(fa_load_pack(io.residual_out, p), fa_load_wpack(io.weight, p), inv_rms, offset, y);      \
    BODY                                                                                                   \
  }
  // FA_EACH_Y_CONVERGED(BODY): the same packs, but every thread of the block runs BODY equally often (packs
  // past the row's end with `valid` false and y zero), so a lane shuffle in BODY runs on whole waves: without
  // a run mask, which made the compiler check convergence (MATCH, REDUX and a divergent branch) every time.
  // A register pack past the row for the whole block (rows narrower than the kernel's registers) is skipped:
  // the same test in every thread, so the block stays converged.
#define FA_EACH_Y_CONVERGED(BODY)                                                                           \
  _Pragma("unroll") for (int k = 0; k < FA_REG_PACKS; ++k) {                                               \
    if (k * FA_BLOCK >= packs) break;                                                                      \
    const int p = tid + k * FA_BLOCK;                                                                      \
    const bool valid = p < packs;                                                                          \
    float y[FA_PACK_ELEMS] = {};                                                                           \
    if (valid) fa_normalized(rs[k], ws[k], inv_rms, offset, y);                                            \
    BODY                                                                                                   \
  }                                                                                                        \
  for (int first = FA_REG_PACKS * FA_BLOCK; first < packs; first += FA_BLOCK) {                            \
    const int p = first + tid;                                                                             \
    const bool valid = p < packs;                                                                          \
    float y[FA_PACK_ELEMS] = {};                                                                           \
    if (valid) fa_normalized(fa_load_pack(io.residual_out, p), fa_load_wpack(io.weight, p), inv_rms, offset, y); \
    BODY                                                                                                   \
  }
  const int tail_col = packs * FA_PACK_ELEMS + tid;
#if FA_QUANT == FA_QUANT_GROUP
  const int packs_per_group = io.group / FA_PACK_ELEMS;
  const int groups = cols / io.group;
  (void)tail_col;  // groups are whole packs: a row with a tail has no groups
  // Short-row kernels (FA_GROUP_SHARED 0) carry only the shuffle: under their register bound the shared-memory
  // path's code spilled (ptxas), and the host gives them only groups that fill a run of lanes.
  if (!FA_GROUP_SHARED || fa_group_in_lanes(packs_per_group)) {
    // One pass: the group's amax is a shuffle within its run of lanes (no shared memory, no barrier), and
    // each thread quantizes the y it holds. A power of two: the group of a pack is a shift (a division by
    // a runtime value would cost registers the short-row kernels do not have).
    const int shift = fa_log2_pow2(packs_per_group);
    FA_EACH_Y_CONVERGED({
      const float scale = fa_group_scale(fa_lanes_max(fa_abs_max(y), packs_per_group));
      if (valid) {
        if ((p & (packs_per_group - 1)) == 0) fa_store_group_scale(io, p >> shift, groups, scale);
        fa_store_fp8_pack(io.out, p, y, fa_div(1.0f, scale));
      }
    })
  } else {
    extern __shared__ fa_u32 fa_group_amax[];  // one word per group of the row: the launch sizes it
    for (int g = tid; g < groups; g += FA_BLOCK) fa_group_amax[g] = 0u;
    fa_sync_block();  // zeroed before any thread takes a max into it
    FA_EACH_Y({ fa_shared_max_u32(&fa_group_amax[p / packs_per_group], fa_float_as_u32(fa_abs_max(y))); })
    fa_sync_block();  // every group's amax is complete
    for (int g = tid; g < groups; g += FA_BLOCK) {
      fa_store_group_scale(io, g, groups, fa_group_scale(fa_u32_as_float(fa_group_amax[g])));
    }
    FA_EACH_Y({
      fa_store_fp8_pack(io.out, p, y, fa_div(1.0f, fa_group_scale(fa_u32_as_float(fa_group_amax[p / packs_per_group]))));
    })
    fa_sync_block();  // every read of this row's group amax is done before the next row zeroes them
  }
#elif FA_QUANT_FP4
  // Blocks of FA_FP4_BLOCK columns, each a power-of-two run of lanes (the host takes n a multiple of the block
  // and 16-byte packs): the block's amax is a shuffle, each thread writes its pack's codes and the block's
  // first lane its scale.
  constexpr int kPacksPerBlock = FA_FP4_BLOCK / FA_PACK_ELEMS;
  static_assert(FA_FP4_BLOCK % FA_PACK_ELEMS == 0 && kPacksPerBlock <= 32 &&
                (kPacksPerBlock & (kPacksPerBlock - 1)) == 0, "an FP4 block is a power-of-two run of lanes");
  const int blocks = cols / FA_FP4_BLOCK;
  (void)tail_col;  // blocks are whole packs: no tail
  FA_EACH_Y_CONVERGED({
    const float amax = fa_lanes_max(fa_abs_max(y), kPacksPerBlock);
    if (!valid) continue;
#if FA_QUANT == FA_QUANT_NVFP4
    const fa_u32 code = fa_nvfp4_scale(global_scale, amax);
    const float s = fa_e4m3_value(code);
    const float mul = s == 0.0f ? 0.0f : fa_div(global_scale, s);  // values = e2m1(y * (global / s))
    fa_store_fp4_pack(io.out, p, y, mul);
#else
    float inverse;
    const fa_u32 code = fa_mxfp4_scale(amax, inverse);  // values = e2m1(y / 2^X) = e2m1(y * 2^-X)
    fa_store_fp4_pack(io.out, p, y, inverse);
#endif
    if (p % kPacksPerBlock == 0) fa_store_block_scale(io, p / kPacksPerBlock, blocks, code);
  })
#else
#if FA_QUANT == FA_QUANT_TOKEN
  float amax = 0.0f;
  FA_EACH_Y({ amax = fa_max_op::apply(amax, fa_abs_max(y)); })
  if constexpr (Source::has_tail) {
    if (tail_col < cols) amax = fa_max_op::apply(amax, fa_abs(fa_tail_y(io, tail_col, inv_rms, offset)));
  }
  const float scale = fa_fp8_scale(fa_block_reduce<FA_BLOCK, fa_max_op>(amax));
  if (tid == 0) io.scales[0] = scale;
  const float inv = fa_div(1.0f, scale);
#else
  const float inv = static_inv;
#endif
  FA_EACH_Y({ fa_store_fp8_pack(io.out, p, y, inv); })
  if constexpr (Source::has_tail) {
    if (tail_col < cols) io.out[tail_col] = fa_fp8(fa_fp8_clamp(fa_tail_y(io, tail_col, inv_rms, offset) * inv));
  }
#endif
#undef FA_EACH_Y
#undef FA_EACH_Y_CONVERGED
#endif
}

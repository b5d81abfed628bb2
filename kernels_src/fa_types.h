// fa_types.h: the element type T and the pack (FA_PACK_BYTES per thread access) of one specialization.
// Rendering defines FA_DTYPE and FA_PACK_BYTES; everything else derives from them.
#pragma once
#include "fa_platform.h"

#define FA_DTYPE_FP32 0
#define FA_DTYPE_FP16 1
#define FA_DTYPE_BF16 2

#if FA_DTYPE == FA_DTYPE_FP32
typedef float fa_elem_t;
#define FA_ELEM_BYTES 4
// fp32 rows sum their squares and scale in double: the row's mean is then exact to far below an fp32
// ulp and out is the correctly rounded product of its fp32 factors (within 1 ulp of the reference).
typedef double fa_norm_t;
#elif FA_DTYPE == FA_DTYPE_FP16 || FA_DTYPE == FA_DTYPE_BF16
typedef fa_u16 fa_elem_t;
#define FA_ELEM_BYTES 2
// fp32 carries 13+ more mantissa bits than a 16-bit T: sum and product lose nothing that T would keep.
typedef float fa_norm_t;
#else
#error "FA_DTYPE must be FA_DTYPE_FP32, FA_DTYPE_FP16 or FA_DTYPE_BF16"
#endif

#if FA_PACK_BYTES < FA_ELEM_BYTES || FA_PACK_BYTES > 16 || (FA_PACK_BYTES % 4 != 0 && FA_PACK_BYTES != 2)
#error "FA_PACK_BYTES must be 2 (one 16-bit element), 4, 8 or 16"
#endif
#define FA_PACK_ELEMS (FA_PACK_BYTES / FA_ELEM_BYTES)

#if FA_PACK_BYTES >= 4
#define FA_PACK_WORDS (FA_PACK_BYTES / 4)
// A pack is held as 32-bit words so that one load or store of it is one FA_PACK_BYTES-wide access.
struct alignas(FA_PACK_BYTES) fa_pack_t {
  fa_u32 w[FA_PACK_WORDS];
};
#else
// One 16-bit element: the pack of rows whose starts are only 2-byte aligned (add_rmsnorm, any layout).
struct fa_pack_t {
  fa_u16 h;
};
#endif

FA_INLINE float fa_elem_to_float(fa_u32 bits) {
#if FA_DTYPE == FA_DTYPE_FP32
  return fa_u32_as_float(bits);
#elif FA_DTYPE == FA_DTYPE_FP16
  return fa_half_bits_to_float((fa_u16)bits);
#else
  return fa_bf16_bits_to_float((fa_u16)bits);
#endif
}

FA_INLINE fa_u32 fa_float_to_elem(float v) {
#if FA_DTYPE == FA_DTYPE_FP32
  return fa_float_as_u32(v);
#elif FA_DTYPE == FA_DTYPE_FP16
  return fa_float_to_half_bits(v);
#else
  return fa_float_to_bf16_bits(v);
#endif
}

// float(T(v)): the value v takes once stored as T.
FA_INLINE float fa_round_to_elem(float v) { return fa_elem_to_float(fa_float_to_elem(v)); }

FA_INLINE void fa_unpack(const fa_pack_t& p, float (&v)[FA_PACK_ELEMS]) {
#if FA_PACK_BYTES == 2
  v[0] = fa_elem_to_float(p.h);
#else
#pragma unroll
  for (int i = 0; i < FA_PACK_ELEMS; ++i) {
#if FA_ELEM_BYTES == 4
    v[i] = fa_elem_to_float(p.w[i]);
#else
    v[i] = fa_elem_to_float((p.w[i / 2] >> (16 * (i % 2))) & 0xffffu);
#endif
  }
#endif
}

FA_INLINE fa_pack_t fa_pack(const float (&v)[FA_PACK_ELEMS]) {
  fa_pack_t p;
#if FA_PACK_BYTES == 2
  p.h = (fa_u16)fa_float_to_elem(v[0]);
#else
#pragma unroll
  for (int i = 0; i < FA_PACK_WORDS; ++i) {
#if FA_ELEM_BYTES == 4
    p.w[i] = fa_float_to_elem(v[i]);
#else
    p.w[i] = fa_float_to_elem(v[2 * i]) | (fa_float_to_elem(v[2 * i + 1]) << 16);
#endif
  }
#endif
  return p;
}

// One element of a row, as a float, and back (the tail of a row that is not a whole number of packs).
FA_INLINE float fa_load_elem(const fa_elem_t* base, fa_i64 index) {
#if FA_ELEM_BYTES == 4
  return base[index];
#else
  return fa_elem_to_float(base[index]);
#endif
}

FA_INLINE void fa_store_elem(fa_elem_t* base, fa_i64 index, float v) {
#if FA_ELEM_BYTES == 4
  base[index] = v;
#else
  base[index] = (fa_u16)fa_float_to_elem(v);
#endif
}

FA_INLINE fa_pack_t fa_load_pack(const fa_elem_t* base, fa_i64 pack_index) {
  return reinterpret_cast<const fa_pack_t*>(base)[pack_index];
}

FA_INLINE void fa_store_pack(fa_elem_t* base, fa_i64 pack_index, const fa_pack_t& p) {
  reinterpret_cast<fa_pack_t*>(base)[pack_index] = p;
}

#if FA_PACK_BYTES >= 4  // the cross-GPU kernels take whole 4-byte words
// Packs in a peer's buffer (another GPU's or process's memory, or the local tmp buffer peers write):
// explicitly global and cached in L2 only, since the pointers come from a table (the compiler cannot
// infer their address space) and L1 is not coherent with writes made by other GPUs.
FA_INLINE fa_pack_t fa_load_pack_peer(const fa_elem_t* base, fa_i64 pack_index) {
#if FA_AMD
  typedef fa_u32 words_t __attribute__((ext_vector_type(FA_PACK_WORDS)));
  typedef const __attribute__((address_space(1))) words_t global_words;
  const words_t u = ((global_words*)base)[pack_index];
  fa_pack_t v;
#pragma unroll
  for (int i = 0; i < FA_PACK_WORDS; ++i) v.w[i] = u[i];
  return v;
#else
  const fa_pack_t* p = reinterpret_cast<const fa_pack_t*>(base) + pack_index;
  fa_pack_t v;
#if FA_PACK_WORDS == 4
  const uint4 u = __ldcg(reinterpret_cast<const uint4*>(p));
  v.w[0] = u.x, v.w[1] = u.y, v.w[2] = u.z, v.w[3] = u.w;
#elif FA_PACK_WORDS == 2
  const uint2 u = __ldcg(reinterpret_cast<const uint2*>(p));
  v.w[0] = u.x, v.w[1] = u.y;
#else
  v.w[0] = __ldcg(reinterpret_cast<const unsigned int*>(p));
#endif
  return v;
#endif
}

FA_INLINE void fa_store_pack_peer(fa_elem_t* base, fa_i64 pack_index, const fa_pack_t& v) {
#if FA_AMD
  typedef fa_u32 words_t __attribute__((ext_vector_type(FA_PACK_WORDS)));
  typedef __attribute__((address_space(1))) words_t global_words;
  words_t u;
#pragma unroll
  for (int i = 0; i < FA_PACK_WORDS; ++i) u[i] = v.w[i];
  ((global_words*)base)[pack_index] = u;
#else
  fa_pack_t* p = reinterpret_cast<fa_pack_t*>(base) + pack_index;
#if FA_PACK_WORDS == 4
  __stcg(reinterpret_cast<uint4*>(p), make_uint4(v.w[0], v.w[1], v.w[2], v.w[3]));
#elif FA_PACK_WORDS == 2
  __stcg(reinterpret_cast<uint2*>(p), make_uint2(v.w[0], v.w[1]));
#else
  __stcg(reinterpret_cast<unsigned int*>(p), v.w[0]);
#endif
#endif
}
#endif

// fa_platform.h: the one place where vendor differences live.
// Maps thread indices, barriers, lane shuffles, bit casts, fp16 conversions and launch bounds onto the
// builtins of each compiler, so every kernel file compiles unchanged under hiprtc (AMD), NVRTC (NVIDIA)
// and a plain `clang -x hip --offload-arch=gfx942 -nogpulib -nogpuinc` (no ROCm headers at all).
#pragma once

#if defined(__AMDGCN__)
#define FA_AMD 1
#define FA_NVIDIA 0
#elif defined(__CUDACC_RTC__) || defined(__CUDACC__)
#define FA_AMD 0
#define FA_NVIDIA 1
#else
#error "fused_ar kernels compile for AMDGCN (hiprtc, clang -x hip) or NVIDIA (NVRTC) device code only"
#endif

typedef unsigned short fa_u16;
typedef unsigned int fa_u32;
typedef unsigned long long fa_u64;
typedef long long fa_i64;

#if FA_AMD
// Without ROCm headers (-nogpuinc) the HIP keywords do not exist; hiprtc pre-includes them.
#ifndef __global__
#define __global__ __attribute__((global))
#endif
#ifndef __device__
#define __device__ __attribute__((device))
#endif
#ifndef __shared__
#define __shared__ __attribute__((shared))
#endif
#define FA_LAUNCH_BOUNDS(threads) __attribute__((amdgpu_flat_work_group_size(1, threads)))
#define FA_REGISTER_BOUNDS(threads) FA_LAUNCH_BOUNDS(threads)
#define FA_OCCUPANCY_BOUNDS(threads, blocks) FA_LAUNCH_BOUNDS(threads)
// CDNA (gfx9) runs 64 lanes per wave; the compiler says so for any target it knows.
#if defined(__AMDGCN_WAVEFRONT_SIZE__)
#define FA_WAVE_SIZE __AMDGCN_WAVEFRONT_SIZE__
#elif defined(__AMDGCN_WAVEFRONT_SIZE)
#define FA_WAVE_SIZE __AMDGCN_WAVEFRONT_SIZE
#else
#define FA_WAVE_SIZE 64
#endif
#define FA_INLINE __device__ inline __attribute__((always_inline))

FA_INLINE int fa_thread_id() { return (int)__builtin_amdgcn_workitem_id_x(); }
FA_INLINE int fa_block_id() { return (int)__builtin_amdgcn_workgroup_id_x(); }
FA_INLINE int fa_grid_blocks() {
  return (int)(__builtin_amdgcn_grid_size_x() / __builtin_amdgcn_workgroup_size_x());
}

// Programmatic dependent launch is NVIDIA's (sm_90+): nothing to wait for or release here.
FA_INLINE void fa_grid_dependency_wait() {}
FA_INLINE void fa_grid_launch_dependents() {}

// Workgroup barrier with the fences HIP's __syncthreads carries: LDS writes before it are seen after it.
FA_INLINE void fa_sync_block() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

FA_INLINE float fa_u32_as_float(fa_u32 u) { return __builtin_bit_cast(float, u); }
FA_INLINE fa_u32 fa_float_as_u32(float f) { return __builtin_bit_cast(fa_u32, f); }

FA_INLINE float fa_half_bits_to_float(fa_u16 h) { return (float)__builtin_bit_cast(_Float16, h); }
FA_INLINE fa_u16 fa_float_to_half_bits(float f) { return __builtin_bit_cast(fa_u16, (_Float16)f); }

FA_INLINE float fa_sqrt(float x) { return __builtin_sqrtf(x); }
FA_INLINE double fa_sqrt(double x) { return __builtin_sqrt(x); }
FA_INLINE float fa_rint(float x) { return __builtin_rintf(x); }  // nearest even
FA_INLINE float fa_abs(float x) { return __builtin_fabsf(x); }
FA_INLINE float fa_div(float a, float b) { return a / b; }      // IEEE: no fast-math flag is ever given
FA_INLINE int fa_log2_pow2(int x) { return __builtin_ctz((unsigned)x); }  // x a power of two

// Max of non-negative floats as their bit patterns (NaN's bits exceed every number's, so it wins), into LDS.
FA_INLINE void fa_shared_max_u32(fa_u32* p, fa_u32 v) {
  __hip_atomic_fetch_max(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_WORKGROUP);
}

// Cross-GPU flags: release/acquire at system scope (emit buffer_wbl2 / buffer_inv on gfx90a and gfx942), so
// data written before a flag store is visible to the peer GPU that acquires the flag. __hip_atomic_* with
// __HIP_MEMORY_SCOPE_SYSTEM exist in every hiprtc from ROCm 5.x on and in upstream clang for HIP;
// __scoped_atomic_* would need clang >= 18 (ROCm >= 6.2).
FA_INLINE void fa_store_release_sys(fa_u32* p, fa_u32 v) {
  __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
}
FA_INLINE fa_u32 fa_load_acquire_sys(const fa_u32* p) {
  return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
}
// Returns the old value; only stores `desired` if the word held `expected`.
FA_INLINE fa_u32 fa_cas_sys(fa_u32* p, fa_u32 expected, fa_u32 desired) {
  __hip_atomic_compare_exchange_strong(p, &expected, desired, __ATOMIC_RELAXED, __ATOMIC_RELAXED,
                                       __HIP_MEMORY_SCOPE_SYSTEM);
  return expected;
}
FA_INLINE void fa_or_sys(fa_u32* p, fa_u32 bits) {
  __hip_atomic_fetch_or(p, bits, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
}
// A word another agent may change at any time, read fresh each time (no acquire: nothing is ordered by it).
FA_INLINE fa_u32 fa_load_relaxed_sys(const fa_u32* p) {
  return __hip_atomic_load(p, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
}
FA_INLINE void fa_store_relaxed_sys(fa_u32* p, fa_u32 v) {
  __hip_atomic_store(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
}
// s_memrealtime is a constant 100 MHz clock on CDNA: 10 ns per tick.
FA_INLINE fa_u64 fa_timer_ns() { return __builtin_amdgcn_s_memrealtime() * 10ull; }

// Narrowing to bf16 rounds to nearest even, NaN to 0x7fc0, exactly as torch does on ROCm
// (c10's round_to_nearest_even); gfx942 has no bf16 convert instruction.
FA_INLINE fa_u16 fa_float_to_bf16_bits(float f) {
  fa_u32 u = fa_float_as_u32(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (fa_u16)0x7fc0u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (fa_u16)(u >> 16);
}

#else  // FA_NVIDIA

#define FA_LAUNCH_BOUNDS(threads) __launch_bounds__(threads)
// At least `blocks` resident blocks of `threads` per SM: caps registers at 65536 / (threads * blocks).
#define FA_OCCUPANCY_BOUNDS(threads, blocks) __launch_bounds__(threads, blocks)
// The whole register file a block of `threads` may use. ptxas under __launch_bounds__ alone held the
// cross-GPU kernels at 40-80 registers and spilled (ptxas -v, NVRTC 13); the two cannot be combined. An SM's
// 65536 registers are four banks of 16384, one per scheduler, whose warps the block's are dealt to in turn,
// each given its registers in units of 8 a thread: a block fits where ceil(warps / 4) warps fit a bank, so the
// cap is 65536 / (threads rounded up to 128), rounded down to a multiple of 8. At 448 threads (14 warps, 4 in
// a bank) that is 128: 65536 / 448 = 146 let the fp32 add_rmsnorm kernel take 130, and every launch failed
// (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, H100). The rule is the hardware check of CUDA's occupancy calculator
// (cuda_occupancy.h: registers a warp x warps rounded up to the 4 sub-partitions <= 65536). Whole warps.
#define FA_REGISTER_CAP(threads) (65536 / (((threads) + 127) / 128 * 128) / 8 * 8)
#define FA_REGISTER_BOUNDS(threads) __maxnreg__(FA_REGISTER_CAP(threads) > 255 ? 255 : FA_REGISTER_CAP(threads))
#define FA_WAVE_SIZE 32
#define FA_INLINE __device__ __forceinline__

FA_INLINE int fa_thread_id() { return (int)threadIdx.x; }
FA_INLINE int fa_block_id() { return (int)blockIdx.x; }
FA_INLINE int fa_grid_blocks() { return (int)gridDim.x; }

// Programmatic dependent launch (sm_90+; docs/design.md section 3): a kernel launched with the attribute may
// start while the previous kernel on its stream still runs. Every kernel waits here, before its first access
// to global memory, until that kernel has finished and its writes are visible, then lets the next kernel on
// the stream start launching. Both are no-ops for a launch without the attribute.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
FA_INLINE void fa_grid_dependency_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
FA_INLINE void fa_grid_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
#else
FA_INLINE void fa_grid_dependency_wait() {}
FA_INLINE void fa_grid_launch_dependents() {}
#endif

// __syncthreads orders shared-memory writes before the barrier with reads after it.
FA_INLINE void fa_sync_block() { __syncthreads(); }

FA_INLINE float fa_u32_as_float(fa_u32 u) { return __uint_as_float(u); }
FA_INLINE fa_u32 fa_float_as_u32(float f) { return __float_as_uint(f); }

FA_INLINE float fa_half_bits_to_float(fa_u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
FA_INLINE fa_u16 fa_float_to_half_bits(float f) {
  fa_u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

FA_INLINE float fa_sqrt(float x) { return sqrtf(x); }
FA_INLINE double fa_sqrt(double x) { return sqrt(x); }
FA_INLINE float fa_rint(float x) { return rintf(x); }  // nearest even
FA_INLINE float fa_abs(float x) { return fabsf(x); }
FA_INLINE float fa_div(float a, float b) { return __fdiv_rn(a, b); }  // IEEE, whatever the flags
FA_INLINE int fa_log2_pow2(int x) { return __ffs(x) - 1; }  // x a power of two

FA_INLINE void fa_shared_max_u32(fa_u32* p, fa_u32 v) { atomicMax(p, v); }

// Cross-GPU flags: release/acquire at system scope, so data written before a flag store is visible to
// the peer GPU (or process) that acquires the flag.
FA_INLINE void fa_store_release_sys(fa_u32* p, fa_u32 v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
FA_INLINE fa_u32 fa_load_acquire_sys(const fa_u32* p) {
  fa_u32 v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
FA_INLINE fa_u32 fa_cas_sys(fa_u32* p, fa_u32 expected, fa_u32 desired) {
  return atomicCAS_system(p, expected, desired);
}
FA_INLINE void fa_or_sys(fa_u32* p, fa_u32 bits) { atomicOr_system(p, bits); }
FA_INLINE fa_u32 fa_load_relaxed_sys(const fa_u32* p) {
  fa_u32 v;
  asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
FA_INLINE void fa_store_relaxed_sys(fa_u32* p, fa_u32 v) {
  asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
FA_INLINE fa_u64 fa_timer_ns() {
  fa_u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One instruction (sm_80+), the conversion torch's CUDA build uses: nearest even, NaN to 0x7fff.
FA_INLINE fa_u16 fa_float_to_bf16_bits(float f) {
  fa_u16 h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

#endif

FA_INLINE int fa_lane() { return fa_thread_id() % FA_WAVE_SIZE; }
FA_INLINE int fa_wave_id() { return fa_thread_id() / FA_WAVE_SIZE; }

// bf16 is the top half of an fp32: widening is a shift.
FA_INLINE float fa_bf16_bits_to_float(fa_u16 h) { return fa_u32_as_float(((fa_u32)h) << 16); }

// add_rmsnorm: residual_out = T(x + residual) (x itself without a residual); out = T(RMSNorm(residual_out) *
// (weight + offset)) (docs/design.md sections 1 and 1b with N = 1). One block per row, rows taken
// grid-stride; every operand has its own row stride (elements). Any row width: packs of FA_PACK_BYTES, then a
// narrower tail; FA_PACK_BYTES is the element size where row starts are not 16-byte aligned. scale_copy (static
// FP8 only; else 0): where one thread writes the static scale's value, the scales a torch op returns (in
// block 0's first row, after the row's loads: fa_rmsnorm.h).
#include "fa_rmsnorm.h"

// Register bounds (fused_ar/kernels.py, FA_MIN_BLOCKS): under __launch_bounds__(FA_BLOCK) alone ptxas held the
// kernel at 80 registers and spilled 4 bytes once rows got a tail (ptxas -v, NVRTC 13). The common case
// (16-bit x and weight, T output) asks for FA_MIN_BLOCKS resident blocks, which fits without spilling
// and keeps 3 blocks of 256 per SM; the others take the whole register file (FA_REGISTER_BOUNDS).
#if FA_MIN_BLOCKS
#define FA_ADD_RMSNORM_BOUNDS FA_OCCUPANCY_BOUNDS(FA_BLOCK, FA_MIN_BLOCKS)
#else
#define FA_ADD_RMSNORM_BOUNDS FA_REGISTER_BOUNDS(FA_BLOCK)
#endif
#if FA_INPLACE  // out may be x, residual_out may be residual: no __restrict__ on what they alias
#define FA_RESTRICT
#else
#define FA_RESTRICT __restrict__
#endif

// Parameters in the order the kernel first reads them: on NVIDIA they live in a constant bank, read through a
// cache of 64-byte lines, and a line first read late is a serial miss. Everything the row loads need (inputs,
// their strides, the shape) fills the first line; the outputs and the quantization's scalars the second; the
// rarely used rest the third. The weight is not __restrict__: with it (ld.global.nc), ptxas sank its loads past
// the row's stores to the block barrier in 88 of the 252 sm_90 kernels (per-group and per-row FP8, FP4), so the
// scaling after the reduction waited a memory round trip; as a plain load it may not pass a store, and all of a
// thread's loads are in flight together (tests/cpu/test_compile_nvrtc.py checks every kernel).
extern "C" __global__ FA_ADD_RMSNORM_BOUNDS void FA_KERNEL_NAME(
    const fa_elem_t* FA_RESTRICT x, const fa_elem_t* FA_RESTRICT residual, const fa_weight_t* weight,
    fa_i64 x_stride, fa_i64 residual_stride, int rows, int cols,
    fa_elem_t* FA_RESTRICT residual_out, fa_out_t* FA_RESTRICT out, fa_i64 residual_out_stride, fa_i64 out_stride,
    float eps, float weight_offset, fa_scale_t* __restrict__ scales, fa_i64 scales_stride, int group,
    int scales_col_stride, const float* __restrict__ global_scale, int scales_row0, float* __restrict__ scale_copy) {
  fa_grid_dependency_wait();  // before any global access: the previous kernel's writes are ours to read
  fa_grid_launch_dependents();
  // The host launches at most `rows` blocks (grid_bound in fused_ar/jit/kernels.py, checked at every launch):
  // each block has a first row, and the loop tests only after it, so no compare and exit sits between the
  // parameter reads and the first loads.
  int row = fa_block_id();
  do {
    const fa_local_source_t src = {x + row * x_stride};
    const fa_row_io_t io = {out + row * out_stride, residual_out + row * residual_out_stride,
                            residual + row * residual_stride, weight, scales + row * scales_stride, group,
                            scales_col_stride, global_scale, scales_row0 + row, row == 0 ? scale_copy : nullptr};
    fa_add_rmsnorm_row(src, io, cols, eps, weight_offset);
    row += fa_grid_blocks();
  } while (row < rows);
}

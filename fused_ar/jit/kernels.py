"""The kernels the library has: per op, its template, its C parameter list and what `warm` builds.

A new kernel joins the library (and the warm matrix) by calling `register` here with a `KernelDef`.
Launch-time policy (which block size for which row width) lives beside the definition it serves.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Callable, Iterable, Mapping, Optional

from .spec import (ADD_RMSNORM_BLOCKS, BLOCK_SIZES, DEFAULT_PACK, RMSNORM_OPS, SUPPORTED_NGPUS, DType, Fp8Format,
                   KernelSpec, Op, Quant, WeightKind)


class Arg(Enum):
    """C types of kernel parameters; the launcher packs Python values into exactly these."""

    PTR = "void*"
    I32 = "int"
    I64 = "long long"
    F32 = "float"


@dataclass(frozen=True)
class KernelDef:
    """One op's kernel: its template, C parameters, the group sizes and blocks it is built for, its constants."""

    op: Op
    template: str
    params: tuple[tuple[str, Arg], ...]
    ngpus: tuple[int, ...]
    warm_blocks: tuple[int, ...]
    constants: Callable[[KernelSpec], Mapping[str, object]] = lambda spec: {}
    # A parameter the grid may not exceed: the kernel gives every block a first row without testing it.
    grid_bound: Optional[str] = None

    def specs(self, arch: str, dtypes: Iterable[DType], ngpus: Iterable[int]) -> list[KernelSpec]:
        return [KernelSpec(self.op, d, arch, DEFAULT_PACK, g, b)
                for d in dtypes for g in ngpus if g in self.ngpus for b in self.warm_blocks]


_REGISTRY: dict[Op, KernelDef] = {}


def register(kdef: KernelDef) -> KernelDef:
    if kdef.op in _REGISTRY:
        raise ValueError(f"kernel {kdef.op.value} is registered twice")
    _REGISTRY[kdef.op] = kdef
    return kdef


def kernel_def(op: Op) -> KernelDef:
    return _REGISTRY[Op(op)]


def all_kernels() -> tuple[KernelDef, ...]:
    return tuple(_REGISTRY.values())


def warm_matrix(archs: Iterable[str], dtypes: Iterable[DType], ngpus: Iterable[int],
                variants: bool = False, fp8: bool = False) -> list[KernelSpec]:
    """Every default specialization for the archs, dtypes and group sizes; with `variants`, also the
    specializations of variant_specs, with `fp8` those of fp8_specs (compiled on first use otherwise)."""
    dtypes, ngpus = list(dtypes), list(ngpus)
    base = [s for arch in archs for k in all_kernels() for s in k.specs(arch, dtypes, ngpus)]
    base += list(dict.fromkeys(replace(s, block=b, short_rows=True) for s in base if s.op is Op.ADD_RMSNORM
                               for b in short_row_blocks()))
    specs = list(base)
    if variants:
        specs += [v for s in base for v in variant_specs(s)]
    if fp8:
        specs += [v for s in base for v in fp8_specs(s)]
    return specs


def fp8_specs(spec: KernelSpec) -> list[KernelSpec]:
    """An RMSNorm spec's quantized outputs, at every block (a quantized call takes its T call's): FP8 with each
    kind of scale in both formats, the power-of-two group scales (fp32 and UE8M0) in E4M3FN, the format of the
    block-FP8 GEMMs that read them (in E4M3FNUZ they compile on first use), and FP4 (NVFP4 both scale layouts,
    MXFP4 each rounding) for 16-byte packs."""
    if spec.op.value not in RMSNORM_OPS:
        return []
    return [replace(spec, quant=q, fp8=f) for q in (Quant.STATIC, Quant.TOKEN, Quant.GROUP) for f in Fp8Format] + \
        [replace(spec, quant=q, fp8=Fp8Format.E4M3FN) for q in (Quant.GROUP_POW2, Quant.GROUP_UE8M0)] + \
        [replace(spec, quant=q) for q in (Quant.NVFP4, Quant.NVFP4_SWIZZLED, Quant.MXFP4, Quant.MXFP4_RCEIL,
                                          Quant.MXFP4_EVEN) if spec.pack == DEFAULT_PACK]


# The short-row blocks whose every variant the compile tests build: those of bf16 rows of 4096 and 8192. The
# other short blocks differ from them only in FA_BLOCK, under the same register bound (64 on sm_90) or a looser
# one (384 and 448: two resident blocks); warm builds their T kernels, which the compile tests check too.
CHECKED_SHORT_BLOCKS = (256, 512)


def check_specs(arch: str) -> list[KernelSpec]:
    """What the compile tests build beyond the warm matrix: every variant of each RMSNorm op and dtype at its
    largest block (the most registers) and group size, and of the short-row kernels of CHECKED_SHORT_BLOCKS
    (registers bounded), in T and with each FP8 output."""
    widest: dict[tuple, KernelSpec] = {}
    short: list[KernelSpec] = []
    for spec in warm_matrix([arch], list(DType), [1, max(SUPPORTED_NGPUS)]):
        if spec.short_rows:
            if spec.block in CHECKED_SHORT_BLOCKS:
                short.append(spec)
            continue
        for key in ((spec.op, spec.dtype, False), (spec.op, spec.dtype, True)):  # True: an FP8 block
            if key not in widest or spec.block > widest[key].block:
                widest[key] = spec
    # The power-of-two and FP4 kinds differ from the per-group kind only in the row's epilogue: each short-row
    # kernel compiles them once, its variants (weights, residual, in place) with the FP8 kinds alone; MXFP4's
    # other roundings differ from OCP's in one function, compiled with the short-row kernels only.
    return [v for (_, _, fp8), spec in widest.items() for v in (fp8_specs(spec) if fp8 else variant_specs(spec))
            if v.quant.mxfp4_rounding == 0] + \
        [v for spec in short for v in variant_specs(spec)] + \
        [v for spec in short for base in [spec] + variant_specs(spec) for v in fp8_specs(base)
         if base is spec or v.quant in (Quant.STATIC, Quant.TOKEN, Quant.GROUP)]


def variant_specs(spec: KernelSpec) -> list[KernelSpec]:
    """The other specializations of an RMSNorm spec: an fp32 weight (16-bit x), no weight and no residual, in
    place, and for add_rmsnorm the one-element access of rows whose starts are not 16-byte aligned."""
    if spec.op.value not in RMSNORM_OPS:
        return []
    kinds = [dict(weight=WeightKind.FP32)] if spec.dtype.itemsize == 2 else []
    kinds += [dict(weight=WeightKind.NONE, residual=False), dict(inplace=True)]
    if spec.op is Op.ADD_RMSNORM:
        kinds.append(dict(pack=spec.dtype.itemsize))
    return [replace(spec, **kind) for kind in kinds]


def add_rmsnorm_reg_packs(spec: KernelSpec) -> int:
    """Packs each thread keeps in registers (x, residual, weight: 3 x 16 bytes each); rows past
    block * this many packs take the kernel's re-read path. 4 below 1024 threads, SHORT_ROW_PACKS for short
    rows. At 1024 a thread may hold 64 registers on sm_90 and 128 VGPRs on gfx942: 4 packs spill there
    (clang-19 remarks), and fp32, whose sum of squares is double, spills at 2 (ptxas -v: 4 bytes), so 2 and 1."""
    if spec.block < 1024:
        return SHORT_ROW_PACKS if spec.short_rows else 4
    # an fp32 weight of a 16-bit x doubles the weight registers, and FP8 output with per-group scales keeps
    # the packs across one more pass: 2 packs spill at 1024 in both (ptxas -v)
    return 1 if spec.dtype is DType.FP32 or spec.weight is WeightKind.FP32 or spec.quant is not Quant.NONE else 2


# Rows of at most this many packs a thread hold only these in registers, and their kernels (16-bit x) ask
# for SHORT_ROW_THREADS resident threads per SM: 64 registers a thread on sm_90, which both weight kinds fit
# without spilling (cuobjdump --dump-resource-usage; the SASS test checks every kernel for local memory). H200 (bench/results/add_rmsnorm_h200_issue20.md), bf16 at m=16384: n=2048
# 75.3 us against 89.8 with 4 packs at 256 threads, n=8192 (512 threads) 258 against 264; an fp32 weight
# costs 1.00x the contiguous call against 1.32x (n=2048) and 1.05x (n=8192, m=1024).
SHORT_ROW_PACKS = 2
SHORT_ROW_THREADS = 1024
SHORT_ROW_MAX_BLOCK = 512
# A short row takes the fewest of these threads that hold it SHORT_ROW_PACKS a thread: every thread then has
# work and SHORT_ROW_THREADS fit the most rows on an SM, which sets the bytes in flight once the rows fill the
# GPU. Same results file (section 4's sweep), n=2048: 128 threads against 256 at m = 1, 64, 1024, 4096, 16384:
# 2.10 / 2.26 / 3.98 / 18.04 / 66.03 us against 2.13 / 2.26 / 4.81 / 21.21 / 76.33. Between the powers of two
# (n=5120: 320 threads, 3 rows an SM where 512 fit 2; not yet measured) the sum of squares keeps its bits: its
# order is that of the row's packs whatever the block (kernels_src/fa_rmsnorm.h).
SHORT_ROW_BLOCKS = tuple(b for b in ADD_RMSNORM_BLOCKS if b <= SHORT_ROW_MAX_BLOCK)
# The common long-row kernel (16-bit x, weight of its dtype, 4 packs): 3 blocks of 256 fit 78 registers
# without spilling (ptxas -v); under the whole register file (106) only 2 were resident, 17-18% slower at
# n=4096 (same results file). An fp32 weight needs 128: asking for 3 blocks spills it.
LONG_ROW_THREADS = 768


# The narrowest wave (NVIDIA's warp): a per-group FP8 amax is a lane shuffle where a group is a power of two
# of at most this many packs; the short-row kernels take only such groups (fa_rmsnorm.h, FA_GROUP_SHARED).
GROUP_LANES = 32


def group_in_lanes(group: int, pack_elems: int) -> bool:
    """Whether groups of `group` columns, `pack_elems` columns a pack, fill a run of lanes of any wave."""
    packs = group // pack_elems
    return 0 < packs <= GROUP_LANES and packs & (packs - 1) == 0


def add_rmsnorm_short_rows(packs_per_row: int, block: int) -> bool:
    """Whether add_rmsnorm rows of `packs_per_row` packs, `block` threads each, take the short-row kernel."""
    return packs_per_row <= SHORT_ROW_PACKS * block


def short_row_blocks() -> tuple[int, ...]:
    """The block sizes add_rmsnorm_block gives rows that are short: the short-row kernels warm builds."""
    widest = max(BLOCK_SIZES) * SHORT_ROW_PACKS
    return tuple(sorted({add_rmsnorm_block(p) for p in range(1, widest + 1)
                         if add_rmsnorm_short_rows(p, add_rmsnorm_block(p))}))


def add_rmsnorm_min_blocks(spec: KernelSpec) -> int:
    """Resident blocks per SM the kernel asks the compiler for (0: no ask, the whole register file): the
    measured cases above (16-bit x, 16-byte access, up to 512 threads a block; long rows only with T output).
    fp32 x, whose sum of squares is double, spills 8 bytes at 1024 threads even with short rows (cuobjdump
    resource usage)."""
    if spec.dtype.itemsize != 2 or spec.pack != DEFAULT_PACK or spec.block > 512:
        return 0
    if spec.short_rows:
        # FP8 output fits too on sm_90 (62-63 registers), except with an fp32 weight (8-16 bytes of stack); on AMD
        # its per-group kernel takes 136 VGPRs on gfx950 (hiprtc 6.4), under the ask's occupancy: FP8 asks on NVIDIA
        fp8_fits = spec.weight is not WeightKind.FP32 and not spec.arch.startswith("gfx")
        return 0 if spec.quant is not Quant.NONE and not fp8_fits else SHORT_ROW_THREADS // spec.block
    if spec.quant is not Quant.NONE:
        return 0
    return max(1, LONG_ROW_THREADS // spec.block) if spec.weight is not WeightKind.FP32 else 0


# Fewest threads per long add_rmsnorm row: below 256, too few warps hide the load latency (H200 sweep,
# bench/results/add_rmsnorm_h200_sweep.md: 64 and 128 threads lose up to 2x at small m).
ADD_RMSNORM_MIN_BLOCK = 256


ADD_RMSNORM = register(KernelDef(
    op=Op.ADD_RMSNORM,
    template="add_rmsnorm.hip",
    # in the order the kernel first reads them: add_rmsnorm.hip says why
    params=(("x", Arg.PTR), ("residual", Arg.PTR), ("weight", Arg.PTR), ("x_stride", Arg.I64),
            ("residual_stride", Arg.I64), ("rows", Arg.I32), ("cols", Arg.I32),
            ("residual_out", Arg.PTR), ("out", Arg.PTR), ("residual_out_stride", Arg.I64), ("out_stride", Arg.I64),
            ("eps", Arg.F32), ("weight_offset", Arg.F32), ("scales", Arg.PTR), ("scales_stride", Arg.I64),
            ("group", Arg.I32), ("scales_col_stride", Arg.I32),
            ("global_scale", Arg.PTR), ("scales_row0", Arg.I32), ("scale_copy", Arg.PTR)),
    ngpus=(1,),
    # the long-row kernels the policy launches; warm_matrix adds the short-row kernels (short_row_blocks)
    warm_blocks=tuple(b for b in BLOCK_SIZES if b >= ADD_RMSNORM_MIN_BLOCK),
    constants=lambda spec: {"FA_REG_PACKS": add_rmsnorm_reg_packs(spec), "FA_MIN_BLOCKS": add_rmsnorm_min_blocks(spec)},
    grid_bound="rows",
))


# Packs per thread of long rows (and of the one-stage fused kernel): 4 per thread beat 1 or 2 under the whole
# register file (same sweep: n=8192 at m=16384: 261 us with 256 threads, 314 us with 512, 322 us with 1024).
ADD_RMSNORM_PACKS_PER_THREAD = 4


def _fewest_threads(packs_per_row: int, packs_per_thread: int) -> int:
    """The smallest block in BLOCK_SIZES, from ADD_RMSNORM_MIN_BLOCK up, that gives each thread at most
    `packs_per_thread` packs of the row (the largest block if none does)."""
    for block in BLOCK_SIZES:
        if block >= ADD_RMSNORM_MIN_BLOCK and block * packs_per_thread >= packs_per_row:
            return block
    return BLOCK_SIZES[-1]


def add_rmsnorm_kernel(packs_per_row: int) -> tuple[int, bool]:
    """(block, short_rows) of the add_rmsnorm kernel with T output for rows of `packs_per_row` packs."""
    block = add_rmsnorm_block(packs_per_row)
    return block, add_rmsnorm_short_rows(packs_per_row, block)


# Quantized outputs whose amax is a lane shuffle (per-group FP8 in lanes, FP4) run a serial chain per register
# pack (amax, shuffles, two divisions, scale store). At most ONE_PACK_MAX_ROWS rows (each block alone on an SM,
# the chain its time) a short row that fits SHORT_ROW_MAX_BLOCK threads one pack a thread takes them: the same
# bits (the row sums in the order of its packs: fa_block_reduce_items_sum), half the chain. H100, bf16 1 x 4096,
# 512 threads against 256 (bench/results/peers_h100/sum_order_ab.md): groups of 128 2.33 us against 2.62, NVFP4
# 2.47 against 2.67, UE8M0 groups 2.54 against 2.71; T output and static or per-token FP8 lose 0.1 us that way,
# and at 1024 threads (n = 8192) the per-group kernel gains nothing (3.07 against 3.04).
ONE_PACK_MAX_ROWS = 64


def lane_epilogue_block(packs_per_row: int, rows: int, block: int) -> int:
    """The block of a short-row call with a lane-shuffle epilogue: one pack a thread for at most
    ONE_PACK_MAX_ROWS rows where that fits SHORT_ROW_MAX_BLOCK threads, else `block` (the T call's)."""
    one_pack = _short_row_block(packs_per_row, 1)
    return one_pack if rows <= ONE_PACK_MAX_ROWS and one_pack is not None else block


def _short_row_block(packs_per_row: int, packs_per_thread: int) -> Optional[int]:
    """The fewest threads of SHORT_ROW_BLOCKS that give each at most `packs_per_thread` packs of the row
    (None: more than the largest holds)."""
    return next((b for b in SHORT_ROW_BLOCKS if b * packs_per_thread >= packs_per_row), None)


def long_row_block(packs_per_row: int) -> int:
    """Block size for rows held ADD_RMSNORM_PACKS_PER_THREAD packs a thread: long add_rmsnorm rows and every
    row of the one-stage fused kernel."""
    return _fewest_threads(packs_per_row, ADD_RMSNORM_PACKS_PER_THREAD)


def add_rmsnorm_block(packs_per_row: int) -> int:
    """Block size for an add_rmsnorm row of `packs_per_row` packs: short rows (SHORT_ROW_PACKS a thread) the
    fewest of SHORT_ROW_BLOCKS that hold them, longer rows long_row_block. Quantized output takes the same block
    (or, lane_epilogue_block, one pack a thread): it quantizes the call's own T output, whose bits the row's sum
    order fixes, the order of its packs whatever the block and the packs a thread (kernels_src/fa_rmsnorm.h)."""
    block = _short_row_block(packs_per_row, SHORT_ROW_PACKS)
    return block if block is not None else long_row_block(packs_per_row)


# Layout of the buffers shared with kernels_src/fa_peers.h (rendered in as FA_MAX_BLOCKS and
# FA_MAX_RANKS): the most blocks a cross-GPU launch may have, and the largest group. SIGNAL_BYTES is
# sizeof(fa_signal_t): flags[3][MAX_BLOCKS][MAX_RANKS], desc[MAX_BLOCKS][MAX_RANKS][DESC_WORDS],
# epoch[MAX_BLOCKS], error, all 32-bit. REPORT_WORDS: fa_report_t (error, missing, mine, theirs, ready).
# PEER_TABLE_BYTES: fa_peers_t (input, tmp, signal per rank, report, registered), 64-bit each. The
# kernels static_assert these sizes.
MAX_BLOCKS = 128
MAX_RANKS = max(SUPPORTED_NGPUS)
DESC_WORDS = 3
SIGNAL_BYTES = 4 * (3 * MAX_BLOCKS * MAX_RANKS + MAX_BLOCKS * MAX_RANKS * DESC_WORDS + MAX_BLOCKS + 1)
REPORT_WORDS = 3 + 2 * DESC_WORDS
PEER_TABLE_BYTES = (3 * MAX_RANKS + 2) * 8
# fa_peers.h's error codes: the high bits say what happened, the low 24 where (block, phase, peer).
ERROR_TIMEOUT = 0x1000000
ERROR_MISMATCH = 0x2000000
ERROR_UNREGISTERED = 0x4000000
# Stage 1 of the two-stage kernels: 256 threads give small-m shapes more blocks (docs/design.md, the origin).
TWO_STAGE_BLOCK = 256
CROSS_GPU_NGPUS = tuple(n for n in SUPPORTED_NGPUS if n > 1)


def cross_gpu_reg_packs(spec: KernelSpec) -> int:
    """Half of add_rmsnorm's (a quarter for fp32, whose sums are double): the N input packs of the rank
    sum are live at once on top, and fewer registers per thread leave room for all ranks' blocks when
    several ranks share one GPU."""
    return max(1, add_rmsnorm_reg_packs(spec) // (4 if spec.dtype is DType.FP32 else 2))


# The one-stage fused kernel's blocks stop at 512 threads: at 1024 (64 registers each on sm_90) the row
# packs, the N input packs and the barrier's checks sit at ptxas's spill edge (a few bytes of stack,
# by its heuristics); at 512 a thread keeps twice the packs (cross_gpu_reg_packs), so the same part of
# a row stays in registers.
CROSS_GPU_MAX_BLOCK = 512


def allreduce_rmsnorm_block(packs_per_row: int) -> int:
    """Block size of the one-stage fused kernel for a row of `packs_per_row` packs."""
    return min(long_row_block(packs_per_row), CROSS_GPU_MAX_BLOCK)


def _cross_gpu_constants(two_stage: bool, scatter: bool = False):
    def constants(spec: KernelSpec) -> dict[str, object]:
        return {"FA_TWO_STAGE": int(two_stage), "FA_SCATTER": int(scatter), "FA_MAX_BLOCKS": MAX_BLOCKS, "FA_MAX_RANKS": MAX_RANKS,
                "FA_REG_PACKS": cross_gpu_reg_packs(spec), "FA_OP_CODE": spec.op.code, "FA_DTYPE_CODE": spec.dtype.code, "FA_DESC_WORDS": DESC_WORDS,
                "FA_ERROR_TIMEOUT": f"{ERROR_TIMEOUT:#x}u", "FA_ERROR_MISMATCH": f"{ERROR_MISMATCH:#x}u",
                "FA_ERROR_UNREGISTERED": f"{ERROR_UNREGISTERED:#x}u", "FA_SIGNAL_BYTES": SIGNAL_BYTES,
                "FA_REPORT_WORDS": REPORT_WORDS, "FA_PEER_TABLE_BYTES": PEER_TABLE_BYTES}
    return constants


_FUSED_PARAMS = (("peers", Arg.PTR), ("own_signal", Arg.PTR), ("rank", Arg.I32), ("out", Arg.PTR),
                 ("residual_out", Arg.PTR), ("residual", Arg.PTR), ("weight", Arg.PTR), ("rows", Arg.I32),
                 ("cols", Arg.I32), ("eps", Arg.F32), ("weight_offset", Arg.F32), ("residual_stride", Arg.I64), ("out_stride", Arg.I64),
                 ("residual_out_stride", Arg.I64), ("scales", Arg.PTR), ("group", Arg.I32), ("scales_stride", Arg.I64),
                 ("scales_col_stride", Arg.I64), ("global_scale", Arg.PTR),
                 ("scales_row0", Arg.I32), ("scale_copy", Arg.PTR), ("timeout_ns", Arg.I64),
                 ("release_early", Arg.I32), ("stage_src", Arg.PTR))
_ALLREDUCE_PARAMS = (("peers", Arg.PTR), ("own_signal", Arg.PTR), ("rank", Arg.I32), ("out", Arg.PTR),
                     ("packs", Arg.I64), ("rows", Arg.I32), ("cols", Arg.I32), ("timeout_ns", Arg.I64),
                     ("release_early", Arg.I32), ("stage_src", Arg.PTR))

ALLREDUCE_RMSNORM_1STAGE = register(KernelDef(
    Op.ALLREDUCE_RMSNORM_1STAGE, "allreduce_rmsnorm.hip", _FUSED_PARAMS, CROSS_GPU_NGPUS,
    warm_blocks=tuple(b for b in BLOCK_SIZES if ADD_RMSNORM_MIN_BLOCK <= b <= CROSS_GPU_MAX_BLOCK),
    constants=_cross_gpu_constants(False)))
ALLREDUCE_RMSNORM_2STAGE = register(KernelDef(
    Op.ALLREDUCE_RMSNORM_2STAGE, "allreduce_rmsnorm.hip", _FUSED_PARAMS, CROSS_GPU_NGPUS,
    warm_blocks=(TWO_STAGE_BLOCK,), constants=_cross_gpu_constants(True)))
ALLREDUCE_1STAGE = register(KernelDef(
    Op.ALLREDUCE_1STAGE, "allreduce.hip", _ALLREDUCE_PARAMS, CROSS_GPU_NGPUS,
    warm_blocks=(256,), constants=_cross_gpu_constants(False)))
ALLREDUCE_2STAGE = register(KernelDef(
    Op.ALLREDUCE_2STAGE, "allreduce.hip", _ALLREDUCE_PARAMS, CROSS_GPU_NGPUS,
    warm_blocks=(TWO_STAGE_BLOCK,), constants=_cross_gpu_constants(True)))
# Sequence parallelism: reduce-scatter + add + RMSNorm is the one-stage fused kernel on this rank's rows (it
# reads each of them from all N inputs, so together the ranks read every input once, as a two-stage stage 1);
# all-gather copies every rank's shard.
REDUCE_SCATTER_RMSNORM = register(KernelDef(
    Op.REDUCE_SCATTER_RMSNORM, "allreduce_rmsnorm.hip", _FUSED_PARAMS + (("first_row", Arg.I32), ("all_rows", Arg.I32)),
    CROSS_GPU_NGPUS, warm_blocks=ALLREDUCE_RMSNORM_1STAGE.warm_blocks, constants=_cross_gpu_constants(False, True)))
ALL_GATHER = register(KernelDef(
    Op.ALL_GATHER, "all_gather.hip",
    (("peers", Arg.PTR), ("own_signal", Arg.PTR), ("rank", Arg.I32), ("out", Arg.PTR), ("all_rows", Arg.I32),
     ("cols", Arg.I32), ("shard_rows", Arg.I32), ("first", Arg.I32), ("count", Arg.I32), ("source_first", Arg.I32),
     ("timeout_ns", Arg.I64), ("release_early", Arg.I32)),
    CROSS_GPU_NGPUS, warm_blocks=(256,), constants=_cross_gpu_constants(False)))

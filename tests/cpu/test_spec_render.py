"""KernelSpec values and rendering: validation, names, self-contained and stable source, the CLI's view."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fused_ar.jit.kernels import all_kernels, warm_matrix
from fused_ar.jit.render import kernels_src_dir, render
from fused_ar.jit.spec import DType, KernelSpec, Op, Platform, platform_of_arch


def test_spec_is_hashable_and_normalizes_strings():
    a = KernelSpec("add_rmsnorm", "bf16", "sm_90")
    b = KernelSpec(Op.ADD_RMSNORM, DType.BF16, "sm_90", 16, 1, 256)
    assert a == b and hash(a) == hash(b) and {a: 1}[b] == 1
    assert KernelSpec.from_dict(a.to_dict()) == a
    with pytest.raises(AttributeError):
        a.block = 512  # frozen


@pytest.mark.parametrize("field,value", [("pack", 3), ("pack", 32), ("ngpus", 9), ("ngpus", 0), ("ngpus", 16), ("block", 96),
                                         ("block", 2048), ("arch", "compute_90"), ("arch", "gfx9x"), ("dtype", "int8")])
def test_spec_rejects_bad_values_by_name(field, value):
    kwargs = dict(op="add_rmsnorm", dtype="bf16", arch="sm_90")
    kwargs[field] = value
    with pytest.raises(ValueError, match=str(value)):
        KernelSpec(**kwargs)


@pytest.mark.parametrize("arch,platform", [("sm_90", Platform.CUDA), ("sm_100a", Platform.CUDA),
                                           ("gfx942", Platform.HIP), ("gfx942:sramecc+:xnack-", Platform.HIP),
                                           ("gfx950", Platform.HIP)])
def test_platform_of_arch(arch, platform):
    assert platform_of_arch(arch) is platform


def test_dtype_parse_aliases():
    assert DType.parse("bfloat16") is DType.BF16 and DType.parse("torch.float16") is DType.FP16
    assert DType.parse("float") is DType.FP32
    with pytest.raises(ValueError, match="int8"):
        DType.parse("int8")


def test_render_is_self_contained_and_stable():
    spec = KernelSpec("add_rmsnorm", "fp16", "sm_90", block=512)
    text = render(spec).text
    assert text == render(spec).text
    assert '#include "' not in text and "#pragma once" not in text
    for define in ("#define FA_DTYPE FA_DTYPE_FP16", "#define FA_PACK_BYTES 16", "#define FA_BLOCK 512",
                   f"#define FA_KERNEL_NAME {spec.kernel_name}"):
        assert define in text
    assert text.count("// ---- fa_platform.h ----") == 1  # each header once


def test_render_differs_per_field():
    base = KernelSpec("add_rmsnorm", "bf16", "sm_90")
    variants = [KernelSpec("add_rmsnorm", "fp32", "sm_90"), KernelSpec("add_rmsnorm", "bf16", "sm_90", pack=8),
                KernelSpec("add_rmsnorm", "bf16", "sm_90", block=1024)]
    texts = {render(s).text for s in [base, *variants]}
    assert len(texts) == 4
    # the source is vendor-neutral: arch only selects the compiler
    assert render(base).text.split("\n", 1)[1] == render(KernelSpec("add_rmsnorm", "bf16", "gfx942")).text.split("\n", 1)[1]


def test_warm_matrix_covers_registered_kernels():
    specs = warm_matrix(["sm_90", "gfx942"], list(DType), [1, 2, 4, 8])
    assert {s.op for s in specs} == {k.op for k in all_kernels()}
    assert len(specs) == len(set(specs))
    assert {s.arch for s in specs} == {"sm_90", "gfx942"}


def test_kernels_src_found():
    assert (kernels_src_dir() / "add_rmsnorm.hip").is_file()


def test_cli_source_prints_rendered_text():
    proc = subprocess.run([sys.executable, "-m", "fused_ar", "source", "add_rmsnorm", "--dtype", "fp32",
                           "--arch", "sm_90", "--block", "128"], capture_output=True, text=True, check=True)
    assert proc.stdout == render(KernelSpec("add_rmsnorm", "fp32", "sm_90", block=128)).text


def test_short_rows_is_a_variant_of_add_rmsnorm_only():
    for quant in ("none", "token"):
        spec = KernelSpec("add_rmsnorm", "bf16", "sm_90", quant=quant, short_rows=True)
        assert spec.kernel_name.endswith("_short") and "short_rows=True" in str(spec)
        assert KernelSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(ValueError, match="allreduce_rmsnorm_1stage"):
        KernelSpec("allreduce_rmsnorm_1stage", "bf16", "sm_90", ngpus=2, short_rows=True)
    with pytest.raises(ValueError, match="booleans"):
        KernelSpec("add_rmsnorm", "bf16", "sm_90", short_rows=1)


def test_short_rows_hold_two_packs_and_ask_for_more_resident_threads():
    """What the H200 measured (kernels.py): short rows keep 2 packs and ask for 1024 threads per SM; long rows of
    16-bit x keep 4 and ask for 768, except with an fp32 weight (it would spill); 1024-thread blocks ask for none."""
    from fused_ar.jit.kernels import SHORT_ROW_THREADS, LONG_ROW_THREADS

    def defines(spec):
        text = render(spec).text
        return [line for line in text.splitlines() if line.startswith(("#define FA_REG_PACKS", "#define FA_MIN_BLOCKS"))]

    bf16 = dict(op="add_rmsnorm", dtype="bf16", arch="sm_90")
    assert defines(KernelSpec(**bf16, short_rows=True)) == ["#define FA_REG_PACKS 2",
                                                            f"#define FA_MIN_BLOCKS {SHORT_ROW_THREADS // 256}"]
    short_fp32_weight = KernelSpec(**bf16, short_rows=True, weight="fp32")
    assert defines(short_fp32_weight)[1] == f"#define FA_MIN_BLOCKS {SHORT_ROW_THREADS // 256}"
    assert defines(KernelSpec(**bf16)) == ["#define FA_REG_PACKS 4", f"#define FA_MIN_BLOCKS {LONG_ROW_THREADS // 256}"]
    assert defines(KernelSpec(**bf16, weight="fp32")) == ["#define FA_REG_PACKS 4", "#define FA_MIN_BLOCKS 0"]
    assert defines(KernelSpec(**bf16, block=1024)) == ["#define FA_REG_PACKS 2", "#define FA_MIN_BLOCKS 0"]
    assert defines(KernelSpec(**bf16, pack=2, short_rows=True))[1] == "#define FA_MIN_BLOCKS 0"
    assert defines(KernelSpec(op="add_rmsnorm", dtype="fp32", arch="sm_90", short_rows=True)) == \
        ["#define FA_REG_PACKS 2", "#define FA_MIN_BLOCKS 0"]  # a double sum of squares: 1024 threads spill
    for quant in ("static", "token", "group"):  # FP8 output of short rows: as T, but an fp32 weight asks for none
        assert defines(KernelSpec(**bf16, block=512, short_rows=True, quant=quant)) == \
            ["#define FA_REG_PACKS 2", f"#define FA_MIN_BLOCKS {SHORT_ROW_THREADS // 512}"]
        assert defines(KernelSpec(**bf16, short_rows=True, quant=quant, weight="fp32"))[1] == "#define FA_MIN_BLOCKS 0"
        assert defines(KernelSpec(**bf16, block=512, quant=quant)) == ["#define FA_REG_PACKS 4", "#define FA_MIN_BLOCKS 0"]


@pytest.mark.parametrize("dtype,cols,block,short", [
    ("bf16", 8, 64, True), ("bf16", 1024, 64, True), ("bf16", 1032, 128, True), ("bf16", 2048, 128, True),
    ("bf16", 3072, 192, True), ("bf16", 4096, 256, True), ("bf16", 4104, 320, True), ("bf16", 5120, 320, True),
    ("fp16", 6144, 384, True), ("bf16", 7168, 448, True), ("bf16", 8192, 512, True), ("bf16", 8200, 512, False),
    ("fp16", 16384, 512, False), ("bf16", 32768, 1024, False), ("fp32", 4096, 512, True), ("fp32", 4100, 512, False)])
def test_short_rows_policy_and_warm_matrix_agree(dtype, cols, block, short):
    """The launch takes the short-row kernel for rows of at most 2 packs a thread, in the fewest whole 64s of
    threads that hold them up to 512 (bf16: n <= 8192), 4 packs a thread beyond, and warm builds the kernel it
    takes. The one-stage fused kernel keeps the long-row blocks."""
    from fused_ar.jit.kernels import add_rmsnorm_kernel, allreduce_rmsnorm_block, long_row_block

    packs = -(-cols * DType.parse(dtype).itemsize // 16)
    assert add_rmsnorm_kernel(packs) == (block, short)
    assert long_row_block(packs) == (256 if packs <= 1024 else 512 if packs <= 2048 else 1024)
    assert allreduce_rmsnorm_block(packs) == min(long_row_block(packs), 512)
    spec = KernelSpec("add_rmsnorm", dtype, "sm_90", block=block, short_rows=short)
    assert spec in warm_matrix(["sm_90"], [DType.parse(dtype)], [1])


def test_lane_epilogue_takes_one_pack_a_thread_only_for_few_short_rows():
    """Per-group FP8 in lanes and FP4 at most ONE_PACK_MAX_ROWS rows: one pack a thread up to
    SHORT_ROW_MAX_BLOCK threads (bf16 n = 4096: 512 threads for the T call's 256), else the T call's block."""
    from fused_ar.jit.kernels import ONE_PACK_MAX_ROWS, SHORT_ROW_MAX_BLOCK, add_rmsnorm_kernel, lane_epilogue_block

    for packs, t_block, one_pack in [(512, 256, 512), (257, 192, 320), (256, 128, 256), (8, 64, 64),
                                     (1024, 512, 512), (640, 320, 320)]:  # the last two: one pack does not fit
        assert add_rmsnorm_kernel(packs) == (t_block, True)
        assert lane_epilogue_block(packs, 1, t_block) == one_pack <= SHORT_ROW_MAX_BLOCK
        assert lane_epilogue_block(packs, ONE_PACK_MAX_ROWS, t_block) == one_pack
        assert lane_epilogue_block(packs, ONE_PACK_MAX_ROWS + 1, t_block) == t_block

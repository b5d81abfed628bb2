"""KernelSpec values and rendering: validation, names, self-contained and stable source, the CLI's view."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fused_ar.kernels import all_kernels, warm_matrix
from fused_ar.render import kernels_src_dir, render
from fused_ar.spec import DType, KernelSpec, Op, Platform, platform_of_arch


def test_spec_is_hashable_and_normalizes_strings():
    a = KernelSpec("add_rmsnorm", "bf16", "sm_90")
    b = KernelSpec(Op.ADD_RMSNORM, DType.BF16, "sm_90", 16, 1, 256)
    assert a == b and hash(a) == hash(b) and {a: 1}[b] == 1
    assert KernelSpec.from_dict(a.to_dict()) == a
    with pytest.raises(AttributeError):
        a.block = 512  # frozen


@pytest.mark.parametrize("field,value", [("pack", 3), ("pack", 32), ("ngpus", 3), ("ngpus", 16), ("block", 96),
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

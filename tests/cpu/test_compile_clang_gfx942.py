"""The AMD path without ROCm: every kernel's HIP source compiles with a plain clang-19 for gfx942 and passes
fused_ar.backends.amd.isa's rules (DPP wave sum, system-scope flags, 16-byte accesses, no ds_bpermute, no
scratch, occupancy). The real compilers (hiprtc of ROCm 5.2 and 6.4, for gfx90a, gfx942 and gfx950) are
tests/cpu/test_hiprtc.py; this one checks the portable source against upstream LLVM, which those forks
track, and the rules themselves."""

from __future__ import annotations

import re

import pytest

from fused_ar.backends.amd import isa as amd_isa
from fused_ar.backends.amd.clang import ClangHipCompiler
from fused_ar.jit.kernels import check_specs, warm_matrix
from fused_ar.jit.render import render
from fused_ar.jit.spec import SUPPORTED_NGPUS, DType

SPECS = warm_matrix(["gfx942"], list(DType), SUPPORTED_NGPUS) + check_specs("gfx942")


@pytest.fixture(scope="module")
def clang():
    return ClangHipCompiler()


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kernel_name)
def test_gfx942_code_object(clang, spec):
    kernel = clang.compile(render(spec), "gfx942")
    assert kernel.code[:4] == b"\x7fELF"
    assert amd_isa.check(amd_isa.disassemble(kernel.code, "gfx942"), spec, "gfx942") is None


def test_the_rules_catch_what_they_must(clang):
    """The checker is not vacuous: code without the flags' cache control or with scratch fails it."""
    spec = next(s for s in SPECS if s.ngpus == 2 and "rmsnorm" in s.op.value)
    text = amd_isa.disassemble(clang.compile(render(spec), "gfx942").code, "gfx942")
    assert amd_isa.problems(text.replace("buffer_wbl2", "s_nop"), spec, "gfx942")
    assert amd_isa.problems(text.replace("row_bcast:31", "row_shr:1"), spec, "gfx942")
    assert amd_isa.problems(text.replace(".private_segment_fixed_size: 0", ".private_segment_fixed_size: 16"),
                            spec, "gfx942")
    assert amd_isa.problems(text, spec, "gfx90a"), "gfx942's sc0 sc1 forms are not gfx90a's"
    norm = next(s for s in SPECS if s.op.value == "add_rmsnorm" and s.block == 256 and not s.short_rows)
    text = amd_isa.disassemble(clang.compile(render(norm), "gfx942").code, "gfx942")
    assert not amd_isa.problems(text, norm, "gfx942")
    assert amd_isa.problems(re.sub(r"\.vgpr_count:\s*\d+", ".vgpr_count: 256", text), norm, "gfx942"), \
        "256 VGPRs hold 2 waves a SIMD: 2 blocks of 256 a CU, below the 3 add_rmsnorm asks for"
    fnuz = next(s for s in SPECS if s.quant.value == "token" and s.fp8.value == "e4m3fnuz")
    text = amd_isa.disassemble(clang.compile(render(fnuz), "gfx942").code, "gfx942")
    assert "v_cvt_pk_fp8_f32" in text and not amd_isa.problems(text, fnuz, "gfx942")
    assert amd_isa.problems(text.replace("v_cvt_pk_fp8_f32", "v_nop"), fnuz, "gfx942")

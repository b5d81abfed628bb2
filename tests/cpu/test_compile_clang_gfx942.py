"""The AMD path without ROCm: every kernel's HIP source compiles with clang-19 for gfx942; the
disassembly shows DPP in the wave reduction, 16-byte global accesses, no ds_bpermute, no scratch."""

from __future__ import annotations

import pytest

from fused_ar.compiler_clang import ClangHipCompiler, disassemble, scratch_bytes
from fused_ar.kernels import warm_matrix
from fused_ar.render import render
from fused_ar.spec import DType

SPECS = warm_matrix(["gfx942"], list(DType), [1, 2, 4, 6, 8])


@pytest.fixture(scope="module")
def clang():
    return ClangHipCompiler()


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kernel_name)
def test_gfx942_code_object(clang, spec):
    kernel = clang.compile(render(spec), "gfx942")
    assert kernel.code[:4] == b"\x7fELF"
    scratch = scratch_bytes(kernel)
    assert scratch and all(s == 0 for s in scratch), f"scratch (spills) per lane: {scratch}"
    asm = disassemble(kernel)
    assert "global_load_dwordx4" in asm and "global_store_dwordx4" in asm
    assert "ds_bpermute" not in asm, "a lane exchange fell back to ds_bpermute"
    if spec.ngpus > 1:
        # cross-GPU flags: system-scope release (write back L2) and acquire (invalidate)
        assert "buffer_wbl2" in asm and "buffer_inv" in asm and "s_memrealtime" in asm
    if "rmsnorm" not in spec.op.value:
        return
    assert "row_bcast:15" in asm and "row_bcast:31" in asm, "wave reduction is not the DPP tree"
    assert "quad_perm:[1,0,3,2]" in asm and "row_ror:8" in asm
    assert "v_readlane_b32" in asm

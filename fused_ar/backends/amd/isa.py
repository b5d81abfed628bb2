"""What AMD machine code of our kernels must show, checked the same way whoever compiled it: clang-19
(gfx942), the real hiprtc (gfx90a) or LLVM's gfx950 backend from the triton wheel (gfx950).

Rules: the wave sum is the DPP tree (no ds_bpermute), cross-GPU flags carry system-scope cache control
(write back L2 before a release store, invalidate after an acquire load), bounded waits read the 100 MHz
clock, 16-byte global accesses, no scratch. It compiles nothing of its own except lowering LLVM IR.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from typing import Optional

from ...jit.spec import KernelSpec, Quant, fp8_in_hardware

OBJDUMP = "llvm-objdump-19"
READELF = "llvm-readelf-19"
OPT = "opt-19"

# System-scope release / acquire as each generation's memory model lowers them (LLVM AMDGPUUsage,
# "Memory Model GFX90A" and "GFX942"): gfx90a writes back L2 with buffer_wbl2 and invalidates with
# buffer_invl2 (+ L1 buffer_wbinvl1_vol); gfx940+ take sc0 sc1 on buffer_wbl2 / buffer_inv.
_RELEASE = {"gfx90a": r"buffer_wbl2\b", "gfx942": r"buffer_wbl2 sc0 sc1", "gfx950": r"buffer_wbl2 sc0 sc1"}
_ACQUIRE = {"gfx90a": r"buffer_invl2\b", "gfx942": r"buffer_inv sc0 sc1", "gfx950": r"buffer_inv sc0 sc1"}
_DPP_TREE = ("quad_perm:[1,0,3,2]", "quad_perm:[2,3,0,1]", "row_ror:4", "row_ror:8", "row_bcast:15", "row_bcast:31")
_SCRATCH = re.compile(r"(?:\.private_segment_fixed_size|\.amdhsa_private_segment_fixed_size|ScratchSize:)\s*:?\s*(\d+)")
# VGPR spills go to scratch; SGPR spills go to VGPR lanes (v_writelane), no memory traffic.
_VGPR_SPILLS = re.compile(r"\.vgpr_spill_count:\s*(\d+)")


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise FileNotFoundError(f"{name} not found (apt-get install llvm-19)")
    return path


def disassemble(code: bytes, arch: str) -> str:
    """llvm-objdump's disassembly and llvm-readelf's metadata notes of a code object, as one text."""
    with tempfile.NamedTemporaryFile(suffix=".hsaco") as f:
        f.write(code)
        f.flush()
        target = arch.split(":")[0]
        asm = subprocess.run([_tool(OBJDUMP), "-d", f"--mcpu={target}", f.name], capture_output=True, text=True,
                             check=True).stdout
        notes = subprocess.run([_tool(READELF), "--notes", f.name], capture_output=True, text=True, check=True).stdout
    return asm + "\n" + notes


def lower_ir(llvm_ir: str, arch: str) -> str:
    """Assembly (with its metadata) for `arch` from LLVM IR made for another gfx9 target, through the LLVM
    that the triton wheel carries (it knows gfx950; clang-19 does not). The IR's own target-cpu and
    target-features are replaced by `arch`'s. translate_to_asm runs codegen without the AMDGPU backend's
    first IR pass, infer-address-spaces (flat accesses through kernel arguments become global ones), so
    opt-19 runs it first, as clang and hiprtc do."""
    from triton._C.libtriton import llvm  # the `gfx950` extra: pip install triton

    llvm_ir = subprocess.run([_tool(OPT), "-mtriple=amdgcn-amd-amdhsa", "-passes=infer-address-spaces", "-S"],
                             input=llvm_ir, capture_output=True, text=True, check=True).stdout
    llvm.init_targets()
    ir = re.sub(r'"target-cpu"="gfx[0-9a-f]+"', f'"target-cpu"="{arch}"', llvm_ir)
    ir = re.sub(r' "target-features"="[^"]*"', "", ir)
    return llvm.translate_to_asm(ir, "amdgcn-amd-amdhsa", arch, "", [], True, False, False)


def problems(text: str, spec: KernelSpec, arch: str) -> list[str]:
    """Everything the machine code of `spec` breaks; empty when it shows what it must."""
    target = arch.split(":")[0]
    found: list[str] = []
    scratch = [int(n) for n in _SCRATCH.findall(text)]
    if not scratch:
        found.append("no scratch size found in the metadata")
    elif any(scratch):
        found.append(f"scratch (spills or stack) of {max(scratch)} bytes")
    if any(int(n) for n in _VGPR_SPILLS.findall(text)):
        found.append("VGPR spills")
    if spec.pack == 16 and ("global_load_dwordx4" not in text or "global_store_dwordx4" not in text):
        found.append("no 16-byte global load/store")
    if "ds_bpermute" in text:
        found.append("a lane exchange fell back to ds_bpermute")
    if "rmsnorm" in spec.op.value:
        missing = [step for step in _DPP_TREE if step not in text]
        if missing or "v_readlane_b32" not in text:
            found.append(f"the wave sum is not the DPP tree (missing {missing or ['v_readlane_b32']})")
    if spec.ngpus > 1:
        release, acquire = _RELEASE.get(target), _ACQUIRE.get(target)
        if release is None:
            found.append(f"no system-scope rule known for {target}")
        else:
            if not re.search(release, text):
                found.append(f"no system-scope release ({release}) at the flags")
            if not re.search(acquire, text):
                found.append(f"no system-scope acquire ({acquire}) at the flags")
        if "s_memrealtime" not in text:
            found.append("bounded waits do not read s_memrealtime")
    if spec.quant is not Quant.NONE:
        if fp8_in_hardware(target, spec.fp8) and "v_cvt_pk_fp8_f32" not in text:
            found.append(f"the {spec.fp8.value} conversion does not use v_cvt_pk_fp8_f32")
        if "v_div_fixup_f32" not in text:
            found.append("1 / scale is not an IEEE division (no v_div_fixup_f32)")
    return found


def check(text: str, spec: KernelSpec, arch: str) -> Optional[str]:
    """None when `text` passes, else one line naming the kernel and every problem."""
    found = problems(text, spec, arch)
    return f"{spec.kernel_name} ({arch}): " + "; ".join(found) if found else None

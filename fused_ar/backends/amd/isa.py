"""What AMD machine code of our kernels must show, checked the same way whoever compiled it: a real hiprtc
(ROCm 5.2: gfx90a; ROCm 6.4: gfx90a, gfx942, gfx950) or clang-19 (gfx942).

Rules: the wave sum is the DPP tree (no ds_bpermute), cross-GPU flags carry system-scope cache control
(write back L2 before a release store, invalidate after an acquire load), bounded waits read the 100 MHz
clock, 16-byte global accesses, no scratch, and registers that leave the CU the threads the launch assumes.
It compiles nothing; disassembly is LLVM's (llvm-objdump-19, or a newer one for gfx950).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from typing import Optional

from ...jit.kernels import add_rmsnorm_min_blocks
from ...jit.spec import KernelSpec, Op, Quant, fp8_in_hardware

OBJDUMP = "llvm-objdump-19"   # knows gfx90a and gfx942; gfx950 needs LLVM >= 20 (pass objdump=)
READELF = "llvm-readelf-19"   # the metadata notes are target-independent
WAVE_SIZE = 64
SIMDS_PER_CU = 4
VGPRS_PER_LANE = 512
MAX_WAVES_PER_SIMD = 8

# System-scope release / acquire as each generation's memory model lowers them (LLVM AMDGPUUsage,
# "Memory Model GFX90A" and "GFX942"): gfx90a writes back L2 with buffer_wbl2 and invalidates with
# buffer_invl2 (+ L1 buffer_wbinvl1_vol); gfx940+ take sc0 sc1 on buffer_wbl2 / buffer_inv.
_RELEASE = {"gfx90a": r"buffer_wbl2\b", "gfx942": r"buffer_wbl2 sc0 sc1", "gfx950": r"buffer_wbl2 sc0 sc1"}
_ACQUIRE = {"gfx90a": r"buffer_invl2\b", "gfx942": r"buffer_inv sc0 sc1", "gfx950": r"buffer_inv sc0 sc1"}
_DPP_TREE = ("quad_perm:[1,0,3,2]", "quad_perm:[2,3,0,1]", "row_ror:4", "row_ror:8", "row_bcast:15", "row_bcast:31")
_SCRATCH = re.compile(r"(?:\.private_segment_fixed_size|\.amdhsa_private_segment_fixed_size|ScratchSize:)\s*:?\s*(\d+)")
# VGPR spills go to scratch; SGPR spills go to VGPR lanes (v_writelane), no memory traffic.
_VGPR_SPILLS = re.compile(r"\.vgpr_spill_count:\s*(\d+)")
_VGPRS = re.compile(r"\.vgpr_count:\s*(\d+)")
_AGPRS = re.compile(r"\.agpr_count:\s*(\d+)")


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise FileNotFoundError(f"{name} not found (apt-get install llvm-19)")
    return path


def disassemble(code: bytes, arch: str, objdump: Optional[str] = None) -> str:
    """llvm-objdump's disassembly and llvm-readelf's metadata notes of a code object, as one text. `objdump`:
    the llvm-objdump to use (default llvm-objdump-19 on PATH; gfx950 needs LLVM >= 20)."""
    with tempfile.NamedTemporaryFile(suffix=".hsaco") as f:
        f.write(code)
        f.flush()
        target = arch.split(":")[0]
        asm = subprocess.run([objdump or _tool(OBJDUMP), "-d", f"--mcpu={target}", f.name], capture_output=True,
                             text=True, check=True).stdout
        notes = subprocess.run([_tool(READELF), "--notes", f.name], capture_output=True, text=True, check=True).stdout
    return asm + "\n" + notes


def occupancy(text: str) -> tuple[int, int]:
    """(VGPRs a wave is allocated, waves a SIMD holds) from the metadata notes: gfx90a, gfx942 and gfx950 give
    each SIMD lane 512 registers shared by the architectural VGPRs (in granules of 4) and the AGPRs, allocated
    in granules of 8, at most 8 waves a SIMD (AMD CDNA ISA guides; LLVM AMDGPUUsage)."""
    vgprs = [int(n) for n in _VGPRS.findall(text)]
    agprs = [int(n) for n in _AGPRS.findall(text)] or [0]
    if not vgprs:
        return 0, 0
    allocated = -(-(-(-max(vgprs) // 4) * 4 + max(agprs)) // 8) * 8
    return allocated, min(MAX_WAVES_PER_SIMD, VGPRS_PER_LANE // max(allocated, 8))


def resident_threads_asked(spec: KernelSpec) -> int:
    """Threads of `spec` that one CU must hold at once: one block (the cross-GPU grids are sized at run time
    to what is resident), and for add_rmsnorm the resident blocks its kernel asks NVIDIA's compiler for, so
    both vendors keep the occupancy its block policy was measured at."""
    if spec.op is Op.ADD_RMSNORM:
        return max(1, add_rmsnorm_min_blocks(spec)) * spec.block
    return spec.block


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
    allocated, waves = occupancy(text)
    block_waves = -(-spec.block // WAVE_SIZE)  # a block's waves are spread over the CU's SIMDs
    resident = waves * SIMDS_PER_CU // block_waves * spec.block
    if allocated == 0:
        found.append("no VGPR count found in the metadata")
    elif resident < resident_threads_asked(spec):
        found.append(f"{allocated} VGPRs leave {waves} waves a SIMD: {resident} resident threads a CU, below the "
                     f"{resident_threads_asked(spec)} the launch assumes")
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
    if spec.quant.converts_e4m3 and fp8_in_hardware(target, spec.fp8) and "v_cvt_pk_fp8_f32" not in text:
        found.append(f"the {spec.fp8.value} conversion does not use v_cvt_pk_fp8_f32")
    # MXFP4 divides by nothing: its scale is a power of two, multiplied by its exact inverse
    if spec.quant is not Quant.NONE and not spec.quant.mxfp4 and "v_div_fixup_f32" not in text:
        found.append("the scales' divisions are not IEEE (no v_div_fixup_f32)")
    return found


def check(text: str, spec: KernelSpec, arch: str) -> Optional[str]:
    """None when `text` passes, else one line naming the kernel and every problem."""
    found = problems(text, spec, arch)
    return f"{spec.kernel_name} ({arch}): " + "; ".join(found) if found else None

"""Every kernel the library has compiles with real NVRTC for sm_90; its SASS shows 128-bit global loads
and stores and no local-memory traffic; a compile error carries the spec, the options and the log;
its parameters are those the launcher packs."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from fused_ar.backends import compiler_for
from fused_ar.errors import CompileError
from fused_ar.jit.kernels import Arg, add_rmsnorm_reg_packs, check_specs, kernel_def, warm_matrix
from fused_ar.jit.render import Source, render
from fused_ar.jit.spec import (ADD_RMSNORM_BLOCKS, BLOCK_SIZES, SUPPORTED_NGPUS, DType, KernelSpec, Op, Quant,
                               WeightKind)

SPECS = warm_matrix(["sm_90"], list(DType), SUPPORTED_NGPUS) + check_specs("sm_90")


def _cuobjdump() -> str:
    """cuobjdump on PATH, else the one the nvidia-cuda-cuobjdump wheel installs (nvidia/cu13/bin)."""
    tool = shutil.which("cuobjdump")
    if tool is None:
        import nvidia

        found = [p / "cu13" / "bin" / "cuobjdump" for p in map(Path, nvidia.__path__)]
        tool = next((str(p) for p in found if p.is_file()), None)
    if tool is None:
        pytest.fail("cuobjdump not found: pip install nvidia-cuda-cuobjdump (the test extra) or put it on PATH")
    return tool


def _dump(cubin: bytes, flag: str) -> str:
    """cuobjdump `flag` (-sass, -res-usage, -elf) of a CUBIN."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([_cuobjdump(), flag, f.name], capture_output=True, text=True, check=True).stdout


def _sass(cubin: bytes) -> str:
    return _dump(cubin, "-sass")


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kernel_name)
def test_compiles_to_sass_with_wide_accesses(spec):
    kernel = compiler_for("sm_90").compile(render(spec), "sm_90")
    assert len(kernel.code) > 0 and kernel.code[:4] == b"\x7fELF"
    assert kernel.lowered_names[spec.kernel_name] == spec.kernel_name
    sass = _sass(kernel.code)
    if spec.pack == 16:
        assert re.search(r"LDG\.E\.128", sass), "no 128-bit global loads"
        assert re.search(r"STG\.E\.128", sass), "no 128-bit global stores"
    assert not re.search(r"\b(LDL|STL)\b", sass), "local-memory traffic (spills or a stack array)"
    if "rmsnorm" in spec.op.value:
        assert "SHFL.BFLY" in sass  # the shared wave reduction
    if spec.quant.converts_e4m3 and spec.fp8.value == "e4m3fn":
        assert "F2FP.SATFINITE.E4M3" in sass, "the E4M3FN conversion is not cvt.rn.satfinite"
    _waits_before_memory(sass)
    _registers_fit(_dump(kernel.code, "-res-usage"), spec.kernel_name, spec.block)
    if spec.op is not Op.ADD_RMSNORM:
        _no_table_reads_after_the_first_barrier(sass)
        _only_staging_and_barrier_stores_before_the_first_barrier(sass)
    if spec.op is Op.ADD_RMSNORM:
        _no_late_parameter_lines(sass)
        if spec.pack == 16:
            _row_loads_before_first_store(sass, _row_loads(spec))


def _no_table_reads_after_the_first_barrier(sass: str) -> None:
    """A kernel of the group reads the peer table (its pointers: the only 64-bit values these kernels load)
    only before its first block barrier, into the block's shared state: each barrier's acquire empties the L1
    (CCTL.IVALL), so a pointer loaded from the table after one was an L2 round trip in front of the peer load
    or flag store it addresses."""
    body = sass[sass.index("Function :"):]
    late = re.findall(r"LDG\.E\.64\S*", body[body.find("BAR.SYNC"):])
    assert not late, f"{len(late)} 64-bit loads (peer table pointers) after the first block barrier: {late[:3]}"


def test_table_read_check_fails_on_a_pointer_loaded_after_the_barrier():
    sass = ("Function : k\n /*0000*/ LDG.E.64.CONSTANT R2, desc[UR4][R4.64] ;\n"
            " /*0010*/ BAR.SYNC.DEFER_BLOCKING 0x0 ;\n /*0020*/ LDS.64 R6, [R8] ;\n"
            " /*0030*/ LDG.E.128.STRONG.GPU R12, desc[UR4][R6.64] ;")
    _no_table_reads_after_the_first_barrier(sass)
    late = sass.replace("LDS.64 R6, [R8]", "LDG.E.64.CONSTANT R6, desc[UR4][R10.64+0x80]")
    with pytest.raises(AssertionError, match=r"1 64-bit loads \(peer table pointers\) after the first block barrier"):
        _no_table_reads_after_the_first_barrier(late)


def _only_staging_and_barrier_stores_before_the_first_barrier(sass: str) -> None:
    """Before its first block barrier a kernel of the group stores only the eager staging copy (STRONG.GPU) and
    the barrier's own words (STRONG.SYS, and the block state in shared memory): a plain store there, like the
    static scale's copy the fused kernels once made first, waits for its value's load and holds the thread
    that begins the barrier (thread 0 of block 0) for that round trip."""
    body = sass[sass.index("Function :"):]
    plain = re.findall(r"STG\.E(?:\.\d+)?\s[^;]*", body[:body.find("BAR.SYNC")])
    assert not plain, f"{len(plain)} plain global stores before the first block barrier: {plain[:3]}"


def test_store_check_fails_on_a_plain_store_before_the_barrier():
    sass = ("Function : k\n /*0000*/ LDG.E.CONSTANT R3, desc[UR4][R2.64] ;\n"
            " /*0010*/ STG.E.128.STRONG.GPU desc[UR4][R6.64], R8 ;\n /*0020*/ STG.E.STRONG.SYS desc[UR4][R4.64], R9 ;\n"
            " /*0030*/ BAR.SYNC.DEFER_BLOCKING 0x0 ;\n /*0040*/ STG.E desc[UR4][R10.64], R3 ;")
    _only_staging_and_barrier_stores_before_the_first_barrier(sass)
    early = sass.replace(" /*0010*/", " /*0008*/ STG.E desc[UR4][R10.64], R3 ;\n /*0010*/", 1)
    with pytest.raises(AssertionError, match="1 plain global stores before the first block barrier"):
        _only_staging_and_barrier_stores_before_the_first_barrier(early)


_ARG_BYTES = {Arg.PTR: 8, Arg.I64: 8, Arg.I32: 4, Arg.F32: 4}


def _param_layout(op: Op) -> list[tuple[int, int]]:
    """(offset, size) of each of the op's parameters in C layout (each aligned to its size)."""
    layout, offset = [], 0
    for _, arg in kernel_def(op).params:
        size = _ARG_BYTES[arg]
        offset = -(-offset // size) * size
        layout.append((offset, size))
        offset += size
    return layout


# sm_90 keeps a kernel's parameters in constant bank 0 from this offset, read through 64-byte cache lines.
_PARAM_BASE, _CONST_LINE = 0x210, 64
_CONST_READ = re.compile(r"c\[0x0\]\[(0x[0-9a-f]+)\]")


def _no_late_parameter_lines(sass: str) -> None:
    """Every constant line of parameters the kernel reads is first read before its first block barrier: a line
    first read in the row's epilogue (after the reduction) is a constant-cache miss on the serial tail of a
    decode-sized call (add_rmsnorm.hip orders its parameters for this)."""
    body = sass[sass.index("Function :"):]
    barrier = body.find("BAR.SYNC")
    if barrier < 0:
        return
    first: dict[int, int] = {}
    for read in _CONST_READ.finditer(body):
        offset = int(read.group(1), 16)
        if offset >= _PARAM_BASE:
            first.setdefault(offset // _CONST_LINE * _CONST_LINE, read.start())
    late = sorted(hex(line) for line, at in first.items() if at > barrier)
    assert not late, f"parameter lines {late} first read after the block barrier"


def test_late_parameter_check_fails_on_a_line_first_read_in_the_epilogue():
    sass = ("Function : k\n /*0000*/ LDC.64 R2, c[0x0][0x210] ;\n /*0010*/ BAR.SYNC.DEFER_BLOCKING 0x0 ;\n"
            " /*0020*/ LDC R4, c[0x0][0x280] ;")
    with pytest.raises(AssertionError, match=r"\['0x280'\] first read after the block barrier"):
        _no_late_parameter_lines(sass)
    _no_late_parameter_lines(sass.replace("0x280", "0x238"))  # the line read before the barrier


def test_add_rmsnorm_row_loads_need_one_parameter_line():
    """What the first loads of a row need (the inputs, their strides, the shape) lies in the first constant line
    of add_rmsnorm's parameters, so one miss, not two in a row, stands before them."""
    lines = {name: (_PARAM_BASE + offset) // _CONST_LINE
             for (name, _), (offset, _) in zip(kernel_def(Op.ADD_RMSNORM).params, _param_layout(Op.ADD_RMSNORM))}
    needed = ("x", "residual", "weight", "x_stride", "residual_stride", "rows", "cols")
    assert {lines[name] for name in needed} == {_PARAM_BASE // _CONST_LINE}, lines


def _row_loads(spec: KernelSpec) -> int:
    """16-byte loads of a thread's register packs in an add_rmsnorm kernel of 16-byte packs: x, the residual
    and the weight (an fp32 weight of a 16-bit x: two) for each of its FA_REG_PACKS packs."""
    weight = {WeightKind.NONE: 0, WeightKind.SAME: 1}.get(spec.weight, 2 if spec.dtype.itemsize == 2 else 1)
    return add_rmsnorm_reg_packs(spec) * (1 + int(spec.residual) + weight)


def _row_loads_before_first_store(sass: str, loads: int) -> None:
    """All of a thread's register-pack loads (x, residual, weight) are issued before its first store, so they are
    in flight together and no store waits between them. ptxas sank the loads of a `__restrict__` weight
    (ld.global.nc) past the row's stores to the block barrier in 88 of the 252 sm_90 kernels (per-group and
    per-row FP8 and FP4 kernels among them), where the scaling after the reduction waited on them; and the
    static scale's copy, stored first, held its warp for the scale's load before the row's loads: each a memory
    round trip on the serial chain of a decode-sized call."""
    body = sass[sass.index("Function :"):]
    store = body.find("STG")
    before = len(re.findall(r"LDG\.E\.128", body[:store if store >= 0 else len(body)]))
    assert before == loads, f"{before} of the row's {loads} 16-byte loads issued before the first store"


def test_row_load_check_fails_on_a_load_after_the_first_store():
    sass = ("Function : k\n /*0000*/ LDG.E.128 R4, desc[UR4][R2.64] ;\n /*0010*/ STG.E.128 desc[UR4][R6.64], R4 ;\n"
            " /*0020*/ LDG.E.128.CONSTANT R8, desc[UR4][R10.64] ;")
    with pytest.raises(AssertionError, match="1 of the row's 2 16-byte loads issued before the first store"):
        _row_loads_before_first_store(sass, 2)
    _row_loads_before_first_store(sass, 1)
    early_copy = sass.replace(" /*0000*/", " /*0000*/ STG.E desc[UR4][R12.64], R13 ;\n /*0008*/", 1)
    with pytest.raises(AssertionError, match="0 of the row's 1 16-byte loads issued before the first store"):
        _row_loads_before_first_store(early_copy, 1)


def test_a_restrict_weight_lets_ptxas_sink_its_loads():
    """Why add_rmsnorm's weight is not `__restrict__`: with it, ptxas issues the per-group FP8 kernel's weight
    loads after the row's stores (the check above fails), without it with the others."""
    spec = KernelSpec(Op.ADD_RMSNORM, DType.BF16, "sm_90", block=512, inplace=True, quant=Quant.GROUP,
                      short_rows=True)
    source = render(spec)
    assert "const fa_weight_t* weight," in source.text
    restricted = dataclasses.replace(source, text=source.text.replace("const fa_weight_t* weight,",
                                                                      "const fa_weight_t* __restrict__ weight,"))
    _row_loads_before_first_store(_sass(compiler_for("sm_90").compile(source, "sm_90").code), _row_loads(spec))
    with pytest.raises(AssertionError, match="4 of the row's 6 16-byte loads issued before the first"):
        _row_loads_before_first_store(_sass(compiler_for("sm_90").compile(restricted, "sm_90").code),
                                      _row_loads(spec))


# An SM's registers: four banks, one per scheduler, the block's warps dealt to them in turn, each warp given
# its registers in units of 8 a thread.
_BANK_REGISTERS, _BANKS, _REGISTER_UNIT = 16384, 4, 8


def _registers_fit(resources: str, function: str, block: int) -> None:
    """A block of `block` threads of `function` gets its registers on one SM: the bank that holds the most of
    its warps (ceil(warps / 4)) holds their registers, a thread's count rounded up to the allocation unit.
    Else every launch fails with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES (the fp32 add_rmsnorm kernel at 448
    threads on an H100: 130 registers, given as 136, 4 warps of them 17408 in a bank)."""
    found = re.search(rf"Function {re.escape(function)}:\s*REG:(\d+)", resources)
    assert found, f"no resource usage of {function}"
    regs = int(found.group(1))
    warps = -(-block // 32)
    per_bank = -(-warps // _BANKS)
    needed = per_bank * -(-regs // _REGISTER_UNIT) * _REGISTER_UNIT * 32
    assert needed <= _BANK_REGISTERS, (f"{function}: {regs} registers a thread, {needed} for the {per_bank} warps "
                                       f"of {block} threads in a bank")


def test_register_check_fails_on_a_block_that_cannot_launch():
    with pytest.raises(AssertionError, match="130 registers a thread, 17408 for the 4 warps of 448 threads"):
        _registers_fit("Function k:REG:130 STACK:0 SHARED:0", "k", 448)
    _registers_fit("Function k:REG:128 STACK:0 SHARED:0", "k", 448)
    _registers_fit("Function k:REG:168 STACK:0 SHARED:0", "k", 384)


@pytest.mark.parametrize("block", sorted(set(BLOCK_SIZES) | set(ADD_RMSNORM_BLOCKS)))
def test_whole_register_file_cap_launches_at_every_block(block):
    """FA_REGISTER_BOUNDS, the cap of kernels that take the whole register file, holds a kernel that wants
    more registers than any cap (values of 96 packs live at once) to what a block of `block` threads can be
    given: the probe takes the cap itself, so the check above sees the bound, not one kernel's needs."""
    spec = KernelSpec(Op.ADD_RMSNORM, DType.BF16, "sm_90", block=block)
    probe = """
extern "C" __global__ FA_REGISTER_BOUNDS(FA_BLOCK) void fa_register_probe(const float4* in, float4* out) {
  float4 v[96];
  float total = 0.0f;
#pragma unroll
  for (int i = 0; i < 96; ++i) {
    v[i] = in[threadIdx.x + i * FA_BLOCK];
    total += v[i].x * v[i].y + v[i].z * v[i].w;
  }
#pragma unroll
  for (int i = 0; i < 96; ++i) {
    out[threadIdx.x + i * FA_BLOCK] = make_float4(v[i].x * total, v[i].y * total, v[i].z * total, v[i].w * total);
  }
}
"""
    kernel = compiler_for("sm_90").compile(Source(spec, render(spec).text + probe), "sm_90")
    resources = _dump(kernel.code, "-res-usage")
    regs = int(re.search(r"Function fa_register_probe:\s*REG:(\d+)", resources).group(1))
    assert regs >= min(255, _BANK_REGISTERS // (-(-block // 128) * 32)) - _REGISTER_UNIT, \
        f"the probe took {regs}: not held at the cap"
    _registers_fit(resources, "fa_register_probe", block)


@pytest.mark.parametrize("block", [b for b in ADD_RMSNORM_BLOCKS if b not in BLOCK_SIZES])
@pytest.mark.parametrize("dtype,weight", [(DType.FP32, WeightKind.SAME), (DType.BF16, WeightKind.FP32)], ids=str)
@pytest.mark.parametrize("quant", [Quant.NONE, Quant.GROUP], ids=lambda q: q.value)
def test_whole_register_file_kernels_fit_their_block(block, dtype, weight, quant):
    """The kernels the policy launches under the whole register file at the blocks between the powers of two:
    long rows (per-group FP8 with groups wider than a run of lanes keeps them at the T call's block) of an fp32
    x or weight. The per-group ones took 134-144 registers at 448 threads, which could not launch."""
    spec = KernelSpec(Op.ADD_RMSNORM, dtype, "sm_90", block=block, weight=weight, quant=quant)
    kernel = compiler_for("sm_90").compile(render(spec), "sm_90")
    resources = _dump(kernel.code, "-res-usage")
    assert re.search(rf"Function {spec.kernel_name}:\s*REG:\d+ STACK:0\b", resources), resources
    _registers_fit(resources, spec.kernel_name, block)


# Global, generic and constant-bank-free memory instructions of sm_90 SASS (loads, stores, atomics, reductions).
_MEMORY = re.compile(r"\b(LDG|STG|LD|ST|ATOMG|ATOM|RED|ATOMS|LDS|STS)\b")


def _waits_before_memory(sass: str) -> None:
    """Programmatic dependent launch: griddepcontrol.wait (ACQBULK) comes before the kernel's first memory
    instruction, then launch_dependents (PREEXIT), so a kernel launched while its predecessor finishes reads
    and writes nothing before that predecessor is done."""
    body = sass[sass.index("Function :"):]
    first_memory = _MEMORY.search(body)
    wait, release = body.find("ACQBULK"), body.find("PREEXIT")
    assert wait >= 0 and release > wait, "no griddepcontrol.wait / launch_dependents"
    assert first_memory is None or wait < first_memory.start(), f"{first_memory.group()} before the wait"


def test_wait_check_fails_on_a_load_before_the_wait():
    sass = "Function : k\n /*0000*/ LDG.E.128 R4, desc[UR4][R2.64] ;\n /*0010*/ ACQBULK ;\n /*0020*/ PREEXIT ;"
    with pytest.raises(AssertionError, match="LDG before the wait"):
        _waits_before_memory(sass)
    _waits_before_memory(sass.replace("LDG.E.128 R4, desc[UR4][R2.64]", "MOV R1, c[0x0][0x28]"))


@pytest.mark.parametrize("op", list(Op), ids=lambda o: o.value)
def test_kernel_parameters_are_what_the_launcher_packs(op):
    """The compiled kernel's parameters (the CUBIN's KPARAM_INFO: ordinal, offset, size) are the KernelDef's,
    in its order and C sizes, so the argument buffer built from the names lands where the kernel reads."""
    spec = next(s for s in SPECS if s.op is op)
    kernel = compiler_for("sm_90").compile(render(spec), "sm_90")
    elf = _dump(kernel.code, "-elf")
    found = sorted((int(o, 16), int(off, 16), int(size, 16)) for o, off, size in re.findall(
        r"Ordinal : (0x[0-9a-f]+)\s+Offset\s*: (0x[0-9a-f]+)\s+Size\s*: (0x[0-9a-f]+)", elf))
    expected = [(i, offset, size) for i, (offset, size) in enumerate(_param_layout(op))]
    assert found == expected, f"{spec.kernel_name}: the kernel takes {found}, the launcher packs {expected}"


def test_compile_error_carries_spec_options_and_log():
    spec = KernelSpec("add_rmsnorm", "bf16", "sm_90")
    broken = Source(spec, render(spec).text + "\nthis is not C++;\n")
    with pytest.raises(CompileError) as info:
        compiler_for("sm_90").compile(broken, "sm_90")
    err = info.value
    assert err.spec == spec and "--gpu-architecture=sm_90" in err.options
    assert "error" in err.log and err.log in str(err) and str(spec) in str(err)


def test_identity_names_the_library_file():
    """The wheel's libnvrtc, by real path, size and mtime (tests/cpu/test_startup.py: found without loading)."""
    identity = compiler_for("sm_90").identity()
    assert identity.startswith("nvrtc@") and "libnvrtc.so" in identity and identity.count(":") >= 2

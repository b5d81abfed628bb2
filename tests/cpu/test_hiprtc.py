"""The AMD path through the project's own hiprtc code (fused_ar.backends.amd.compiler, hip-python) against a real
hiprtc with no GPU: Debian's ROCm runtime (5.2 on Debian 12) compiles gfx90a but not gfx942. The whole warm
matrix for gfx90a, its machine code checked by fused_ar.backends.amd.isa; gfx942 refused in one line, with the
process intact; the identity names the files that compile; every HIP runtime call the project makes,
against the real libamdhip64, returns an error status (no device) instead of crashing or a TypeError."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fused_ar.backends.amd import isa as amd_isa
from fused_ar.jit.cache import KernelCache
from fused_ar.jit.kernels import warm_matrix
from fused_ar.jit.spec import SUPPORTED_NGPUS, DType, KernelSpec

from .warm_helpers import PER_DTYPE

REPO = Path(__file__).resolve().parents[2]


def _hiprtc_loads() -> str:
    probe = subprocess.run([sys.executable, "-c", "from hip import hiprtc; print(hiprtc.hiprtcVersion())"],
                           capture_output=True, text=True)
    return "" if probe.returncode == 0 else (probe.stderr.strip().splitlines() or ["?"])[-1]


@pytest.fixture(scope="module", autouse=True)
def _need_hiprtc(request):
    why = _hiprtc_loads()
    if why:
        message = f"needs a loadable hiprtc (bash scripts/setup.sh installs Debian's ROCm runtime): {why}"
        if request.config.getoption("--require-hiprtc"):
            pytest.fail(message)
        pytest.skip(message)


def _cli(*args: str, cache: Path, **extra: str) -> subprocess.CompletedProcess:
    e = dict(os.environ, FUSED_AR_CACHE_DIR=str(cache), PYTHONPATH=str(REPO), **extra)
    return subprocess.run([sys.executable, "-m", "fused_ar", *args], capture_output=True, text=True, env=e, cwd=REPO,
                          timeout=900)


@pytest.fixture(scope="module")
def warmed(tmp_path_factory):
    cache = tmp_path_factory.mktemp("hiprtc") / "cache"
    start = time.perf_counter()
    proc = _cli("warm", "--arch", "gfx90a", cache=cache)
    return cache, proc, time.perf_counter() - start


def test_warm_gfx90a_compiles_the_whole_matrix(warmed):
    cache, proc, seconds = warmed
    specs = warm_matrix(["gfx90a"], list(DType), SUPPORTED_NGPUS)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"{len(specs)} kernels for gfx90a: {len(specs)} compiled ({len(specs)} saved)" in proc.stdout
    print(f"real hiprtc, gfx90a: {len(specs)} kernels in {seconds:.1f} s wall")


def test_gfx90a_machine_code_follows_the_rules(warmed):
    cache, _, _ = warmed
    entries = [e for e in KernelCache(cache, cache.parent / "locks", 30).entries()]
    assert entries and all(e.meta is not None for e in entries)
    failures = []
    for entry in entries:
        spec = KernelSpec.from_dict(entry.meta["spec"])
        assert entry.meta["compiler"].startswith("hiprtc-") and entry.meta["arch"] == "gfx90a"
        code = entry.path.with_suffix(".bin").read_bytes()
        problem = amd_isa.check(amd_isa.disassemble(code, "gfx90a"), spec, "gfx90a")
        if problem:
            failures.append(problem)
    assert not failures, failures


def test_gfx942_on_this_hiprtc_is_one_clear_line(tmp_path):
    proc = _cli("warm", "--arch", "gfx942", cache=tmp_path / "c")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "Fatal" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot build gfx942" in lines[0] and "ROCm >= 6.0" in lines[0], lines
    again = _cli("warm", "--arch", "gfx90a,gfx942", "--ngpus", "1", "--dtype", "bf16", cache=tmp_path / "c")
    assert again.returncode == 1 and f"{PER_DTYPE} compiled ({PER_DTYPE} saved)" in again.stdout
    assert "probed earlier" in again.stderr


def test_library_compile_for_an_unknown_arch_raises_instead_of_aborting(tmp_path):
    code = ("import fused_ar.backends as c, fused_ar.jit.render as r, fused_ar.jit.spec as s, fused_ar.errors as e\n"
            "try:\n"
            "    c.compiler_for('gfx942').compile(r.render(s.KernelSpec('add_rmsnorm', 'bf16', 'gfx942')), 'gfx942')\n"
            "except e.CompileError as exc:\n"
            "    print('refused:', exc)\n"
            "k = c.compiler_for('gfx90a').compile(r.render(s.KernelSpec('add_rmsnorm', 'bf16', 'gfx90a')), 'gfx90a')\n"
            "assert bytes([32]).decode() == ' ' and b'a b'.split(b' ') == [b'a', b'b']\n"
            "print('lowered', k.lowered_names)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO), FUSED_AR_CACHE_DIR=str(tmp_path / "c")))
    assert proc.returncode == 0, proc.stderr
    assert "refused:" in proc.stdout and "lowered {'fa_add_rmsnorm_bf16_p16_g1_b256': 'fa_add_rmsnorm_bf16_p16_g1_b256'}" in proc.stdout


def test_identity_names_the_files_that_compile(tmp_path):
    """The key changes when comgr does: a copy found first on the loader's path is a different compiler."""
    code = "from fused_ar.backends import compiler_for; print(compiler_for('gfx90a').identity())"

    def identity(extra_path: str = "") -> str:
        path = os.pathsep.join(p for p in (extra_path, os.environ.get("LD_LIBRARY_PATH", "")) if p)
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO,
                              env=dict(os.environ, PYTHONPATH=str(REPO), LD_LIBRARY_PATH=path)).stdout.strip()

    plain = identity()
    assert "unknown-file" not in plain and "comgr:" in plain and "libamd_comgr.so" in plain, plain
    comgr = Path(plain.split("comgr:")[1].split(":")[0])
    shadow = tmp_path / "lib"
    shadow.mkdir()
    soname = re.match(r"libamd_comgr\.so\.[0-9]+", comgr.name).group()  # the name hiprtc dlopens
    shutil.copy(comgr, shadow / soname)
    shadowed = identity(str(shadow))
    assert shadowed != plain and str(shadow) in shadowed


def test_every_hip_runtime_call_takes_its_arguments(tmp_path):
    """Each call the HIP facade makes, with the argument types it passes, against the real libamdhip64: no
    device here, so each must come back as a DeviceError naming a HIP status, not a TypeError or a crash."""
    code = r'''
import contextlib, ctypes
from hip import hip
from fused_ar.jit.compiler import CompiledKernel
from fused_ar.errors import DeviceError
from fused_ar.backends.amd.runtime import HipRuntime

class Bare(HipRuntime):
    def _in(self, device):  # no device to make current: run each call as it is
        return contextlib.nullcontext()

rt = Bare()
kernel = CompiledKernel(open(__import__("sys").argv[1], "rb").read(), {"k": "k"}, "", "x", (), "gfx90a")
args = [ctypes.c_void_p(0), ctypes.c_int32(1), ctypes.c_float(1.0), ctypes.c_int64(2)]
calls = {
    "load": lambda: rt.load(kernel, "k", 0),
    "launch": lambda: rt.launch(hip.hipFunction_t(), 1, 64, args, 0),
    "launch_on_stream": lambda: rt.launch(hip.hipFunction_t(), 1, 64, args, 0x1234),
    "alloc": lambda: rt.alloc(4096, 0),
    "alloc_uncached": lambda: rt.alloc(4096, 0, uncached=True),
    "free": lambda: rt.free(0, 0),
    "copy_to_device": lambda: rt.copy_to_device(0, b"abcd", 0),
    "copy_async": lambda: rt.copy_async(0, 0, 16, 0x1234),
    "copy_rows": lambda: rt.copy_rows(0, 32, 0, 64, 32, 4, 0x1234),
    "read_bytes": lambda: rt.read_bytes(0, 16, 0),
    "alloc_host_mapped": lambda: rt.alloc_host_mapped(4096, 0),
    "free_host": lambda: rt.free_host(0, 0),
    "allocation_range": lambda: rt.allocation_range(0, 0),
    "ipc_handle": lambda: rt.ipc_handle(0),
    "ipc_open": lambda: rt.ipc_open(bytes(64), 0),
    "ipc_close": lambda: rt.ipc_close(0, 0),
    "max_active_blocks": lambda: rt.max_active_blocks(hip.hipFunction_t(), 256),
    "mem_get_info": lambda: rt.mem_get_info(0),
    "device_selection": lambda: HipRuntime().alloc(16, 0),
}
for name, call in calls.items():
    try:
        call()
        print(name, "returned")
    except DeviceError as exc:
        print(name, "DeviceError", str(exc).replace(chr(10), " "))
'''
    hsaco = tmp_path / "k.hsaco"
    from fused_ar.backends import compiler_for
    from fused_ar.jit.render import render

    spec = KernelSpec("add_rmsnorm", "bf16", "gfx90a")
    hsaco.write_bytes(compiler_for("gfx90a").compile(render(spec), "gfx90a").code)
    proc = subprocess.run([sys.executable, "-c", code, str(hsaco)], capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO), FUSED_AR_CACHE_DIR=str(tmp_path / "c")))
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(" ", 1) for line in proc.stdout.strip().splitlines())
    assert len(lines) == 19, proc.stdout
    for name, result in lines.items():
        assert result.startswith("DeviceError") and "hipError" in result, (name, result)
    assert "hipErrorInvalidHandle" in lines["launch"] or "hipErrorInvalid" in lines["launch"], lines["launch"]


def test_verdict_file_is_json_the_library_wrote(tmp_path):
    _cli("warm", "--arch", "gfx942", cache=tmp_path / "c")
    verdicts = [json.loads(p.read_text()) for p in (tmp_path / "c" / "probes").glob("hiprtc_arch-*.json")]
    assert [v["ok"] for v in verdicts] == [False] and verdicts[0]["arch"] == "gfx942"

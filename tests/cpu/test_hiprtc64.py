"""The AMD path through a current hiprtc: ROCm 6.4.3 (Debian unstable's, unpacked by scripts/rocm.sh and run
under that suite's loader, no GPU) warms the default matrix (every dtype, group size and block) for gfx90a,
gfx942 (MI300X) and gfx950 (MI355X) through the project's own hiprtc path, then compiles what the other
compile tests check beyond it (fused_ar.jit.kernels.check_specs: every op variant and quantized output at
the block with the most registers, every short-row kernel's), and every code object passes
fused_ar.backends.amd.isa's rules, disassembled by that suite's LLVM 21. (The whole `warm --variants --fp8`
matrix, 2145 kernels an arch, takes this 2-core machine half an hour through hiprtc; check_specs holds
each variant's costliest form.) Also: what this hiprtc refuses is one line; its identity (HIP, comgr and their files)
keys the cache apart from ROCm 5.2's; hip-python 6.4.3 (ROCm 6.4's bindings) and the newest in the [rocm]
range both drive it."""

from __future__ import annotations

import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fused_ar.backends.amd import isa as amd_isa
from fused_ar.jit.cache import KernelCache
from fused_ar.jit.kernels import check_specs, warm_matrix
from fused_ar.jit.spec import SUPPORTED_NGPUS, DType, KernelSpec

REPO = Path(__file__).resolve().parents[2]
PREFIX = REPO / ".venv" / "rocm64"
PYTHON = PREFIX / "bin" / "python"
OBJDUMP = PREFIX / "bin" / "llvm-objdump"
HIP_PYTHON_64 = REPO / ".venv" / "hip-python-6.4"
ARCHS = ("gfx90a", "gfx942", "gfx950")


@pytest.fixture(scope="module", autouse=True)
def _need_rocm64(request):
    if not PYTHON.is_file() or not OBJDUMP.is_file() or not (HIP_PYTHON_64 / "hip").is_dir():
        message = "needs ROCm 6.4's hiprtc and hip-python 6.4 in .venv: bash scripts/rocm.sh"
        if request.config.getoption("--require-hiprtc"):
            pytest.fail(message)
        pytest.skip(message)


def _run(*args: str, cache: Path, hip_python: str = "newest", **extra: str) -> subprocess.CompletedProcess:
    """`args` under ROCm 6.4's loader, with its hiprtc and HIP first on the library path (never Debian
    stable's 5.2, which scripts/test.sh puts on LD_LIBRARY_PATH for the other tests)."""
    path = [str(REPO)] + ([str(HIP_PYTHON_64)] if hip_python == "6.4" else [])
    env = dict(os.environ, FUSED_AR_CACHE_DIR=str(cache), PYTHONPATH=os.pathsep.join(path),
               LD_LIBRARY_PATH=str(PREFIX / "lib"), **extra)
    return subprocess.run([str(PYTHON), *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=1800)


_CHECK_SPECS = """
import os, sys
from fused_ar.backends import compiler_for
from fused_ar.jit.kernels import check_specs
from fused_ar.jit.warm import warm
failed = []
def report(result):
    if result.status != "built":
        failed.append(f"{result.spec.kernel_name} ({result.spec.arch}): {result.status} {result.error}")
specs = list(dict.fromkeys(s for arch in sys.argv[1:] for s in check_specs(arch)))
warm(specs, os.cpu_count() or 1, report, compiler_for)
print(f"{len(specs)} kernels, {len(failed)} not built", *failed[:20], sep=chr(10))
"""


def _expected(arch: str) -> set[KernelSpec]:
    return set(warm_matrix([arch], list(DType), SUPPORTED_NGPUS)) | set(check_specs(arch))


@pytest.fixture(scope="module")
def warmed(tmp_path_factory):
    cache = tmp_path_factory.mktemp("hiprtc64") / "cache"
    start = time.perf_counter()
    proc = _run("-m", "fused_ar", "warm", "--arch", ",".join(ARCHS), cache=cache)
    checks = _run("-c", _CHECK_SPECS, *ARCHS, cache=cache)
    return cache, proc, checks, time.perf_counter() - start


def test_warm_compiles_the_matrix_and_the_checked_variants_for_every_arch(warmed):
    cache, proc, checks, seconds = warmed
    specs = warm_matrix(list(ARCHS), list(DType), SUPPORTED_NGPUS)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"{len(specs)} kernels for {','.join(ARCHS)}: {len(specs)} compiled ({len(specs)} saved)" in proc.stdout
    variants = len({s for arch in ARCHS for s in check_specs(arch)})
    assert checks.returncode == 0 and checks.stdout.startswith(f"{variants} kernels, 0 not built\n"), \
        checks.stdout[-3000:] + checks.stderr[-3000:]
    print(f"hiprtc 6.4: {len(specs)} + {variants} kernels for {', '.join(ARCHS)} in {seconds:.1f} s wall")


def _check(entry) -> str:
    spec = KernelSpec.from_dict(entry.meta["spec"])
    code = entry.path.with_suffix(".bin").read_bytes()
    return amd_isa.check(amd_isa.disassemble(code, spec.arch, objdump=str(OBJDUMP)), spec, spec.arch) or ""


def test_every_code_object_follows_the_rules(warmed):
    """DPP wave sum, system-scope cache control at the IPC flags (gfx90a's and gfx940+'s encodings), the
    100 MHz clock in bounded waits, 16-byte accesses, native FP8 conversion where the arch has it, IEEE 1/scale,
    no scratch, and registers that keep the threads the launch assumes resident."""
    cache, _, _, _ = warmed
    entries = list(KernelCache(cache, cache.parent / "locks", 30).entries())
    assert all(e.meta is not None and e.meta["compiler"].startswith("hiprtc-") for e in entries)
    per_arch = {arch: sum(1 for e in entries if e.meta["arch"] == arch) for arch in ARCHS}
    assert per_arch == {arch: len(_expected(arch)) for arch in ARCHS}, per_arch
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        failures = [problem for problem in pool.map(_check, entries) if problem]
    assert not failures, failures[:20]


def test_what_this_hiprtc_refuses_is_one_line(tmp_path):
    proc = _run("-m", "fused_ar", "warm", "--arch", "gfx999", "--ngpus", "1", "--dtype", "bf16", cache=tmp_path / "c")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot build gfx999" in lines[0] and "HIP 6.4" in lines[0], lines


def test_the_identity_keys_rocm_52_and_64_apart(tmp_path):
    """A kernel built by one hiprtc is never loaded for another: Debian stable's ROCm 5.2 warms gfx90a, then
    ROCm 6.4, on the same cache directory, compiles every kernel again."""
    import sys

    cache = tmp_path / "c"
    code = "from fused_ar.backends import compiler_for; print(compiler_for('gfx90a').identity())"
    rocm52 = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                            env=dict(os.environ, PYTHONPATH=str(REPO), FUSED_AR_CACHE_DIR=str(cache)))
    rocm64 = _run("-c", code, cache=cache)
    assert rocm52.returncode == 0 and rocm64.returncode == 0, rocm52.stderr + rocm64.stderr
    assert "-comgr2." in rocm52.stdout and "-comgr3." in rocm64.stdout and "hip6" in rocm64.stdout
    args = ("-m", "fused_ar", "warm", "--arch", "gfx90a", "--ngpus", "1", "--dtype", "bf16")
    first = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO,
                           env=dict(os.environ, PYTHONPATH=str(REPO), FUSED_AR_CACHE_DIR=str(cache)))
    n = len(warm_matrix(["gfx90a"], [DType.BF16], [1]))
    assert first.returncode == 0 and f"{n} compiled ({n} saved), 0 already cached" in first.stdout, first.stdout
    second = _run(*args, cache=cache)
    assert second.returncode == 0 and f"{n} compiled ({n} saved), 0 already cached" in second.stdout, second.stdout
    info = _run("-m", "fused_ar", "info", cache=cache)
    assert "-comgr3." in info.stdout, info.stdout


@pytest.mark.parametrize("hip_python", ["6.4", "newest"])
def test_both_hip_python_versions_drive_it(tmp_path, hip_python):
    code = ("import hip, importlib.metadata as m\n"
            "from fused_ar.backends import compiler_for\n"
            "from fused_ar.jit.render import render\n"
            "from fused_ar.jit.spec import KernelSpec\n"
            "print('hip-python', m.version('hip-python'), hip.__file__)\n"
            "for arch in ('gfx90a', 'gfx942', 'gfx950'):\n"
            "    spec = KernelSpec('allreduce_rmsnorm_1stage', 'bf16', arch, ngpus=4)\n"
            "    print(arch, len(compiler_for(arch).compile(render(spec), arch).code) > 0)\n")
    proc = _run("-c", code, cache=tmp_path / "c", hip_python=hip_python)
    assert proc.returncode == 0, proc.stderr[-3000:]
    version = proc.stdout.split()[1]
    if hip_python == "6.4":
        assert version.startswith("6.4.3"), proc.stdout
    else:  # the [rocm] extra's range admits it
        import tomllib

        from packaging.requirements import Requirement

        extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["rocm"]
        assert Requirement(extra[0]).specifier.contains(version), (extra, version)
    assert all(f"{arch} True" in proc.stdout for arch in ARCHS), proc.stdout

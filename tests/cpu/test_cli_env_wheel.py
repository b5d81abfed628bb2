"""The command line (warm twice, dry run, a gfx target without ROCm, cache maintenance, info), the README's
table of environment variables, and a real wheel installed into a fresh venv and run from elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fused_ar import env

from .warm_helpers import PER_DTYPE

REPO = Path(__file__).resolve().parents[2]


def _cli(*args, cache, cwd=REPO, python=sys.executable, extra_env=None):
    e = dict(os.environ, FUSED_AR_CACHE_DIR=str(cache), **(extra_env or {}))
    return subprocess.run([python, "-m", "fused_ar", *args], capture_output=True, text=True, cwd=cwd, env=e)


def test_warm_twice_compiles_nothing_the_second_time(tmp_path):
    cache = tmp_path / "c"
    first = _cli("warm", "--arch", "sm_90", "--dtype", "bf16,fp32", "--ngpus", "1", "-j", "2", cache=cache)
    assert first.returncode == 0, first.stderr
    n = 2 * PER_DTYPE
    assert f"{n} kernels for sm_90: {n} compiled ({n} saved), 0 already cached, 0 failed" in first.stdout
    assert first.stdout.count("built") == n  # one line per kernel when not on a TTY
    second = _cli("warm", "--arch", "sm_90", "--dtype", "bf16,fp32", "--ngpus", "1", cache=cache)
    assert second.returncode == 0 and f"0 compiled (0 saved), {n} already cached" in second.stdout
    dry = _cli("warm", "--arch", "sm_90", "--dtype", "bf16,fp16", "--ngpus", "1", "--dry-run", cache=cache)
    assert dry.stdout.count("to build") == PER_DTYPE and dry.stdout.count("cached ") == PER_DTYPE
    info = _cli("cache", "info", cache=cache)
    assert f"entries:         {n}" in info.stdout and f"sm_90: {n}" in info.stdout
    assert _cli("cache", "verify", cache=cache).returncode == 0
    victim = next(cache.glob("??/*.bin"))
    data = bytearray(victim.read_bytes())
    data[len(data) // 3] ^= 0x40
    victim.write_bytes(bytes(data))
    bad = _cli("cache", "verify", cache=cache)
    assert bad.returncode == 1 and victim.stem in bad.stdout
    cleared = _cli("cache", "clear", cache=cache)
    assert f"removed {n} entries" in cleared.stdout and not list(cache.glob("??/*"))


NO_ROCM = {"LD_LIBRARY_PATH": ""}  # scripts/test.sh puts a real hiprtc there; these tests need none


def test_warm_for_gfx_without_rocm_says_why(tmp_path):
    proc = _cli("warm", "--arch", "gfx942", "--ngpus", "1", cache=tmp_path / "c", extra_env=NO_ROCM)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "hiprtc" in proc.stderr and "ROCm" in proc.stderr and "Traceback" not in proc.stderr
    assert "LD_LIBRARY_PATH" in proc.stderr and "b'" not in proc.stderr, "a hint that is not true, or a repr"


def test_warm_for_two_archs_without_rocm_warms_the_one_it_can(tmp_path):
    proc = _cli("warm", "--arch", "sm_90,gfx942", "--ngpus", "1", "--dtype", "bf16", cache=tmp_path / "c",
                extra_env=NO_ROCM)
    assert proc.returncode == 1 and f"{PER_DTYPE} compiled ({PER_DTYPE} saved)" in proc.stdout
    assert [line for line in proc.stderr.splitlines() if "gfx942" in line] == proc.stderr.strip().splitlines()
    assert len(proc.stderr.strip().splitlines()) == 1


def test_warm_without_arch_or_gpu_says_so(tmp_path):
    proc = _cli("warm", "--ngpus", "1", cache=tmp_path / "c")
    assert proc.returncode == 2 and "--arch" in proc.stderr


def test_info_runs(tmp_path):
    proc = _cli("info", cache=tmp_path / "c", extra_env=NO_ROCM)
    assert proc.returncode == 0, proc.stderr
    assert "NVRTC (CUDA): nvrtc@" in proc.stdout and "libnvrtc.so" in proc.stdout and "hiprtc (ROCm): unavailable" in proc.stdout


def test_the_clone_seen_from_its_parent_does_not_shadow_the_package(tmp_path):
    """`cd ~` with the clone in ~/fused_ar: the directory is an empty namespace package candidate, which an
    editable install's import hook (setuptools' default mode) loses to; scripts/setup.sh installs strict."""
    (tmp_path / "fused_ar").symlink_to(REPO)
    code = "import fused_ar; fused_ar.KernelSpec; print(fused_ar.__file__)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("fused_ar/__init__.py")


def test_readme_documents_every_environment_variable():
    assert env.markdown_table() in (REPO / "README.md").read_text()


def test_bad_environment_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("FUSED_AR_LOCK_TIMEOUT_S", "-3")
    with pytest.raises(ValueError, match="FUSED_AR_LOCK_TIMEOUT_S='-3'"):
        env.LOCK_TIMEOUT_S.get()


def test_wheel_installs_and_warms_from_another_directory(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
                    str(REPO)], check=True, cwd=tmp_path)
    wheel = next(dist.glob("fused_ar-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    # torch is left out (a multi-GB download, and warm never imports it); every other dependency is real
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", str(wheel), "filelock", "tqdm",
                    "cuda-bindings>=13,<14", "cuda-pathfinder", "nvidia-cuda-nvrtc>=13,<14"], check=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    e = dict(os.environ, FUSED_AR_CACHE_DIR=str(tmp_path / "c"), PYTHONPATH="", PYTHONNOUSERSITE="1")
    code = "import fused_ar, fused_ar.jit.render as r; print(fused_ar.__file__); print(r.kernels_src_dir())"
    where = subprocess.run([py, "-c", code], capture_output=True, text=True, cwd=elsewhere, env=e, check=True)
    package_file, src_dir = where.stdout.splitlines()
    assert package_file.startswith(str(venv)) and src_dir == str(Path(package_file).parent / "kernels_src")
    warm = [py, "-m", "fused_ar", "warm", "--arch", "sm_90", "--dtype", "bf16,fp16,fp32", "--ngpus", "1", "-j", "2"]
    first = subprocess.run(warm, capture_output=True, text=True, cwd=elsewhere, env=e)
    assert first.returncode == 0, first.stdout + first.stderr
    n = 3 * PER_DTYPE
    assert f"{n} compiled ({n} saved)" in first.stdout
    second = subprocess.run(warm, capture_output=True, text=True, cwd=elsewhere, env=e)
    assert second.returncode == 0 and f"0 compiled (0 saved), {n} already cached" in second.stdout

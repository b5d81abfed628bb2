"""Read-only cache layers (`warm --into`, FUSED_AR_CACHE_PATH): a layer built by one uid serves another with
nothing recompiled; an untrusted layer or file is refused in one line; a layer of another version or
compiler is a miss, never a wrong load; nothing ever writes, locks or clears a layer."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import fused_ar.jit.cache as cache_module
from fused_ar.jit.cache import KernelCache, read_manifest, write_manifest

from .test_cache import SPEC, FakeCompiler
from .warm_helpers import PER_DTYPE

REPO = Path(__file__).resolve().parents[2]
OTHER_UID = 65534
SPECS = [SPEC.__class__("add_rmsnorm", "bf16", "sm_90", block=b) for b in (64, 128, 256, 512, 1024)]


def _layer(tmp_path: Path, compiler: FakeCompiler) -> Path:
    """A layer built in-process as `warm --into` builds one (shared modes, a manifest)."""
    root = tmp_path / "layer"
    builder = KernelCache(root, tmp_path / "locks", 30, shared=True)
    for spec in SPECS:
        assert builder.get(spec, compiler).status == "built"
    write_manifest(root, {"sm_90": compiler.identity()}, len(SPECS))
    return root


def _snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*")}


def test_layer_is_read_after_the_writable_cache_and_never_touched(tmp_path):
    fake = FakeCompiler()
    layer = _layer(tmp_path, fake)
    assert (layer.stat().st_mode & 0o777) == 0o755 and all(
        (p.stat().st_mode & 0o777) == (0o755 if p.is_dir() else 0o644) for p in layer.rglob("*"))
    before = _snapshot(layer)
    user = KernelCache(tmp_path / "mine", tmp_path / "locks2", 30, layers=[layer])
    looked = [user.get(spec, fake) for spec in SPECS]
    assert all(lk.status == "cached" and lk.source == str(layer) for lk in looked) and fake.compiles == len(SPECS)
    assert not list((tmp_path / "mine").glob("??/*")), "the writable cache got entries"
    other = SPEC.__class__("add_rmsnorm", "fp16", "sm_90")
    assert user.get(other, fake).status == "built"  # a miss builds into the writable cache, not the layer
    assert user.clear() == (1, [])
    assert _snapshot(layer) == before and not list(layer.rglob("*.lock")) and not list(layer.rglob("*.tmp"))


@pytest.mark.parametrize("how", ["writable_by_others", "symlink", "missing"])
def test_untrusted_layer_is_refused_in_one_line(tmp_path, caplog, how):
    fake = FakeCompiler()
    layer = _layer(tmp_path, fake)
    if how == "writable_by_others":
        layer.chmod(0o777)
    elif how == "symlink":
        (tmp_path / "link").symlink_to(layer)
        layer = tmp_path / "link"
    else:
        layer = tmp_path / "nowhere"
    user = KernelCache(tmp_path / "mine", tmp_path / "locks2", 30, layers=[layer])
    with caplog.at_level(logging.WARNING, logger="fused_ar"):
        assert user.get(SPECS[0], fake).status == "built"
        user.get(SPECS[1], fake)
    lines = [r.getMessage() for r in caplog.records if str(layer) in r.getMessage()]
    if how != "missing":
        assert len(lines) == 1 and "\n" not in lines[0] and "not used" in lines[0], lines


@pytest.mark.skipif(os.getuid() != 0, reason="a file of a third uid needs root")
def test_a_file_of_a_third_uid_in_a_layer_is_refused(tmp_path, caplog):
    fake = FakeCompiler()
    layer = _layer(tmp_path, fake)
    victim = next(layer.glob("??/*.bin"))
    os.chown(victim, OTHER_UID + 1, OTHER_UID + 1)
    user = KernelCache(tmp_path / "mine", tmp_path / "locks2", 30, layers=[layer])
    with caplog.at_level(logging.WARNING, logger="fused_ar"):
        sources = [user.get(spec, fake).source for spec in SPECS]
    assert sources.count(str(layer)) == len(SPECS) - 1 and sources.count("cache") == 1
    assert any(str(victim) in r.getMessage() and "owned by uid" in r.getMessage() for r in caplog.records)


def test_layer_of_another_compiler_or_version_is_a_miss(tmp_path, monkeypatch):
    layer = _layer(tmp_path, FakeCompiler("fake-1"))
    newer = FakeCompiler("fake-2")
    user = KernelCache(tmp_path / "mine", tmp_path / "locks2", 30, layers=[layer])
    assert user.get(SPECS[0], newer).status == "built" and newer.compiles == 1
    monkeypatch.setattr(cache_module, "__version__", "9.9.9")
    same = FakeCompiler("fake-1")
    user2 = KernelCache(tmp_path / "mine2", tmp_path / "locks3", 30, layers=[layer])
    assert user2.get(SPECS[0], same).status == "built" and same.compiles == 1
    reason = cache_module.why_layer_misses(read_manifest(layer), "sm_90", "fake-1")
    assert "9.9.9" in reason


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    e = dict(os.environ, PYTHONPATH=str(REPO), **env)
    return subprocess.run([sys.executable, "-m", "fused_ar", *args], capture_output=True, text=True, env=e, cwd=REPO,
                          timeout=300)


def test_cache_verify_and_clear_of_a_layer(tmp_path):
    layer = tmp_path / "layer"
    built = _cli("warm", "--arch", "sm_90", "--ngpus", "1", "--dtype", "bf16", "--into", str(layer),
                 FUSED_AR_CACHE_DIR=str(tmp_path / "c"))
    n = PER_DTYPE
    assert built.returncode == 0 and f"{n} compiled ({n} saved)" in built.stdout and "layer" in built.stdout, built.stderr
    manifest = json.loads((layer / "layer.json").read_text())
    assert manifest["kernels"] == n and manifest["compilers"]["sm_90"].startswith("nvrtc@")
    ok = _cli("cache", "verify", str(layer))
    assert ok.returncode == 0 and f"{n} good entries, 0 bad" in ok.stdout
    victim = next(layer.glob("??/*.bin"))
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    bad = _cli("cache", "verify", str(layer))
    assert bad.returncode == 1 and victim.stem in bad.stdout
    clear = _cli("cache", "clear", str(layer))
    assert clear.returncode == 2 and "clears only the writable cache" in clear.stderr and victim.exists()


def _other_uid_python() -> list[str]:
    """A Python another uid can run with this venv's packages: the system one, if it is this minor version
    (the venv's interpreter may live under root's private home)."""
    system = shutil.which("python3", path="/usr/bin:/bin")
    if os.getuid() != 0 or system is None:
        pytest.skip("running as another uid needs root and a system python3")
    version = subprocess.run([system, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                             text=True).stdout.strip()
    if version != str(sys.version_info[:2]):
        pytest.skip(f"the system python3 is {version}, the venv's {sys.version_info[:2]}")
    return ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups", system]


def _readable_install(base: Path) -> tuple[Path, Path]:
    """fused_ar and what its compile path imports (cuda-bindings, cuda-pathfinder, filelock, tqdm, the NVRTC
    libraries), copied where another uid can read them: the clone and its venv may lie under a private (0700)
    directory, as a clone under /root does. Returns (the site directory, the NVRTC library directory)."""
    import filelock
    import nvidia
    import tqdm
    import cuda

    site = base / "site"
    site.mkdir(mode=0o755)
    shutil.copytree(REPO / "fused_ar", site / "fused_ar", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "kernels_src", site / "kernels_src")
    for package in (cuda, filelock, tqdm):
        for root in package.__path__:
            shutil.copytree(root, site / Path(root).name, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__"))
    nvrtc = next(p for p in (Path(d) / "cu13" / "lib" for d in nvidia.__path__) if p.is_dir())
    shutil.copytree(nvrtc, site / "nvidia-lib")
    for path in [site, *site.rglob("*")]:
        path.chmod(path.stat().st_mode | (0o755 if path.is_dir() else 0o644))
    return site, site / "nvidia-lib"


def test_the_readme_container_steps_another_uid_compiles_nothing():
    """README's container example on a CPU machine: root warms a layer into a shared directory; another uid,
    with an empty home, reads every kernel from it up to the first load and writes nothing of its own."""
    python = _other_uid_python()
    base = Path(tempfile.mkdtemp(prefix="fused_ar-layer-test-"))
    try:
        base.chmod(0o755)
        site, nvrtc_lib = _readable_install(base)
        layer, home = base / "opt-cache", base / "home"
        home.mkdir()
        os.chown(home, OTHER_UID, OTHER_UID)
        env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "LD_LIBRARY_PATH": str(nvrtc_lib)}
        # root builds the image's layer with the image's own install (the compiler's files are in the key)
        built = subprocess.run(["env", "-i", *(f"{k}={v}" for k, v in env.items()), f"FUSED_AR_CACHE_DIR={base}/root-cache",
                                python[-1], "-m", "fused_ar", "warm", "--arch", "sm_90", "--ngpus", "1,2", "--dtype",
                                "bf16", "--into", str(layer)], capture_output=True, text=True, cwd=base, timeout=600)
        assert built.returncode == 0, built.stdout + built.stderr
        env["FUSED_AR_CACHE_PATH"] = str(layer)
        code = ("import fused_ar.jit.cache as c, fused_ar.jit.kernels as k, fused_ar.jit.spec as s\n"
                "from fused_ar.backends import compiler_for\n"
                "cache = c.default_cache()\n"
                "for spec in k.warm_matrix(['sm_90'], [s.DType.BF16], [1, 2]):\n"
                "    lk = cache.get(spec, compiler_for(spec.arch))\n"
                "    print(lk.status, lk.source == str(c.env.CACHE_PATH.get()[0]))\n")
        first = subprocess.run(["env", "-i", *(f"{k}={v}" for k, v in env.items()), *python, "-c", code],
                               capture_output=True, text=True, cwd=base, timeout=300)
        assert first.returncode == 0, first.stderr
        lines = first.stdout.splitlines()
        assert lines and set(lines) == {"cached True"}, first.stdout
        info = subprocess.run(["env", "-i", *(f"{k}={v}" for k, v in env.items()), *python, "-m", "fused_ar", "info"],
                              capture_output=True, text=True, cwd=base, timeout=300)
        assert f"cache layer:     {layer}" in info.stdout, info.stdout + info.stderr
        assert not list(home.rglob("*.bin")) and not list(home.rglob("*.json")), "the second uid wrote entries"
    finally:
        shutil.rmtree(base, ignore_errors=True)

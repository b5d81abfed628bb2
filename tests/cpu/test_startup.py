"""A cache hit loads no compiler: NVRTC's identity in the key comes from the library file (path, size,
mtime) of the nvidia-cuda-nvrtc wheel, found without loading it; a miss loads NVRTC; a different library
file is a different key. A hit imports neither cuda-bindings nor filelock. Each case in a fresh process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_LOOKUP = """
import sys
from fused_ar.backends import compiler_for
from fused_ar.jit.cache import default_cache, cache_key
from fused_ar.jit.compiler import loaded_library
from fused_ar.jit.render import render
from fused_ar.jit.spec import KernelSpec
spec = KernelSpec("add_rmsnorm", "bf16", "sm_90")
compiler = compiler_for("sm_90")
lookup = default_cache().get(spec, compiler)
print(lookup.status, lookup.key, compiler.identity())
print("nvrtc-loaded", loaded_library("libnvrtc.so") is not None, "bindings", "cuda.bindings.nvrtc" in sys.modules,
      "filelock", "filelock" in sys.modules)
"""


def _lookup(cache: Path, *path: str, python: str = sys.executable) -> list[str]:
    env = dict(os.environ, FUSED_AR_CACHE_DIR=str(cache), PYTHONPATH=os.pathsep.join([str(REPO), *path]))
    proc = subprocess.run([python, "-c", _LOOKUP], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_a_hit_loads_no_compiler_and_a_miss_does(tmp_path):
    built = _lookup(tmp_path / "c")
    assert built[0] == "built" and built[4:] == ["True", "bindings", "True", "filelock", "True"], built
    hit = _lookup(tmp_path / "c")
    assert hit[0] == "cached" and hit[1] == built[1], (built, hit)
    assert hit[3:] == ["nvrtc-loaded", "False", "bindings", "False", "filelock", "False"], hit
    assert hit[2].startswith("nvrtc@") and "libnvrtc.so" in hit[2]


def test_another_nvrtc_library_is_another_key(tmp_path):
    """Another environment whose site-packages holds its own copy of the wheel's libnvrtc (another file:
    another path and mtime): another key, and NVRTC loads from that very file to compile."""
    import nvidia

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site_dir = next(venv.glob("lib/python3*/site-packages"))
    original = next(p for d in nvidia.__path__ for p in Path(d).glob("cu*/lib") if list(p.glob("libnvrtc.so.*")))
    copy = site_dir / "nvidia" / original.parent.name / "lib"
    shutil.copytree(original, copy)
    ours = str(Path(nvidia.__path__[0]).parent)  # this venv's packages (cuda-bindings), but not as site-packages
    plain = _lookup(tmp_path / "c")
    other = _lookup(tmp_path / "c", ours, python=str(venv / "bin" / "python"))
    assert plain[2] != other[2] and str(copy) in other[2], (plain, other)
    assert other[0] == "built" and plain[1] != other[1]


_VERDICT = """
import sys
from fused_ar.jit.verdicts import remembered
print(remembered("k", lambda: (True, "probed now"))[1].endswith("now"), "filelock", "filelock" in sys.modules)
"""


def test_a_remembered_verdict_is_read_without_a_lock(tmp_path):
    """The peer probe's verdict (every Communicator reads it) comes without the lock once stored: a reader
    imports no filelock; the first, which probes, does."""
    env = dict(os.environ, FUSED_AR_CACHE_DIR=str(tmp_path / "c"), FUSED_AR_LOCK_DIR=str(tmp_path / "l"),
               PYTHONPATH=str(REPO))
    runs = [subprocess.run([sys.executable, "-c", _VERDICT], capture_output=True, text=True, env=env, timeout=120)
            for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    assert runs[0].stdout.split() == ["True", "filelock", "True"], runs[0].stdout  # probed now
    assert runs[1].stdout.split() == ["False", "filelock", "False"], runs[1].stdout  # "... (probed earlier, ...)"

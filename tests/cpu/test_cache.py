"""The disk cache of docs/design.md section 4 with real files and real processes: key fields, sharded entries,
digest checks, 8 racing processes, a builder killed mid-build, unwritable and untrusted directories."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from fused_ar.jit.cache import SCHEMA_VERSION, KernelCache, cache_key
from fused_ar.backends import compiler_for
from fused_ar.jit.compiler import CompiledKernel, Compiler
from fused_ar.errors import CacheTrustError
from fused_ar.jit.render import render
from fused_ar.jit.spec import KernelSpec, Platform

REPO = Path(__file__).resolve().parents[2]
SPEC = KernelSpec("add_rmsnorm", "bf16", "sm_90", block=128)


class FakeCompiler(Compiler):
    """Deterministic code objects from the source text; counts its compiles."""

    platform = Platform.CUDA

    def __init__(self, identity: str = "fake-1") -> None:
        self._identity, self.compiles = identity, 0

    def identity(self) -> str:
        return self._identity

    def options(self, arch):
        return ("--fake", f"--arch={arch}")

    def compile(self, source, arch):
        self.compiles += 1
        code = hashlib.sha256(source.text.encode()).digest() * 64
        return CompiledKernel(code, {source.name: source.name}, "fake log", self._identity, self.options(arch), arch)


def _cache(tmp_path: Path, name: str = "cache") -> KernelCache:
    return KernelCache(tmp_path / name, tmp_path / "locks", lock_timeout_s=30)


BASE = dict(source_text="src", options=("-a", "-b"), arch="sm_90", compiler_identity="nvrtc-13.0@x")


@pytest.mark.parametrize("field,value", [("source_text", "src2"), ("options", ("-b", "-a")), ("options", ("-a",)),
                                         ("arch", "sm_100"), ("arch", "gfx942:sramecc+:xnack-"),
                                         ("compiler_identity", "nvrtc-13.1@x"), ("compiler_identity", "nvrtc-13.0@y"),
                                         ("version", "9.9.9"), ("schema", SCHEMA_VERSION + 1)])
def test_key_changes_with_each_field(field, value):
    assert cache_key(**{**BASE, field: value}) != cache_key(**BASE)


def test_key_is_stable_for_equal_inputs():
    assert cache_key(**BASE) == cache_key(**dict(BASE, options=["-a", "-b"]))
    a, b = KernelSpec("add_rmsnorm", "bf16", "sm_90"), KernelSpec("add_rmsnorm", "bfloat16", "sm_90", 16, 1, 256)
    c = compiler_for("sm_90")
    key = lambda s: cache_key(render(s).text, c.options(s.arch), s.arch, c.identity())  # noqa: E731
    assert key(a) == key(b)
    assert key(a) != key(KernelSpec("add_rmsnorm", "bf16", "sm_90", block=512))


def test_layout_sidecar_and_second_lookup(tmp_path):
    cache, fake = _cache(tmp_path), FakeCompiler()
    first = cache.get(SPEC, fake)
    assert first.status == "built" and fake.compiles == 1
    bin_path, meta_path = cache.paths(first.key)
    assert bin_path.parent.name == first.key[:2] and bin_path.read_bytes() == first.kernel.code
    meta = json.loads(meta_path.read_text())
    assert meta["spec"] == SPEC.to_dict() and meta["digest"] == hashlib.sha256(first.kernel.code).hexdigest()
    assert meta["lowered_names"] == {SPEC.kernel_name: SPEC.kernel_name} and meta["compiler"] == "fake-1"
    again = _cache(tmp_path).get(SPEC, fake)  # a new process's view: from disk, not memory
    assert again.status == "cached" and fake.compiles == 1 and again.kernel == first.kernel
    assert not list(cache.root.glob("??/.*.tmp")), "temp files left behind"


def test_flipped_byte_is_detected_and_rebuilt(tmp_path):
    cache, fake = _cache(tmp_path), FakeCompiler()
    good = cache.get(SPEC, fake)
    bin_path, _ = cache.paths(good.key)
    data = bytearray(bin_path.read_bytes())
    data[len(data) // 2] ^= 0x01
    bin_path.write_bytes(bytes(data))
    fresh = _cache(tmp_path)
    assert fresh.read(good.key) is None
    good_count, bad = fresh.verify()
    assert good_count == 0 and [e.key for e in bad] == [good.key] and "digest" in bad[0].problem
    rebuilt = fresh.get(SPEC, fake)
    assert rebuilt.status == "built" and rebuilt.kernel.code == good.kernel.code and fake.compiles == 2
    assert _cache(tmp_path).verify() == (1, [])


def test_partial_entries_are_misses(tmp_path):
    cache, fake = _cache(tmp_path), FakeCompiler()
    key = cache.get(SPEC, fake).key
    bin_path, meta_path = cache.paths(key)
    meta_path.unlink()  # a writer killed between the code object and its sidecar
    (bin_path.parent / f".{bin_path.name}.123.tmp").write_bytes(b"half")
    fresh = _cache(tmp_path)
    assert fresh.read(key) is None
    assert fresh.get(SPEC, fake).status == "built"
    assert fresh.clear() == (1, []) and not list(fresh.root.glob("??/*"))


def _worker(tmp_path, mode, ready, n=1):
    return subprocess.Popen([sys.executable, "-m", "tests.cpu.cache_worker", str(tmp_path / "cache"),
                             str(tmp_path / "locks"), mode, str(ready), str(n)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_eight_racing_processes_compile_once(tmp_path):
    ready = tmp_path / "ready"
    ready.mkdir()
    procs = [_worker(tmp_path, "race", ready, 8) for _ in range(8)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    statuses = sorted(r["status"] for r in results)
    assert statuses == ["built"] + ["cached"] * 7, statuses
    assert len({r["digest"] for r in results}) == 1
    assert len(list((tmp_path / "cache").glob("??/*.bin"))) == 1


def test_builder_killed_mid_build_blocks_nothing(tmp_path):
    ready = tmp_path / "ready"
    ready.mkdir()
    hung = _worker(tmp_path, "hang", ready)
    deadline = time.time() + 60
    while not (ready / "building").exists():
        assert hung.poll() is None, hung.communicate()[1]
        assert time.time() < deadline, "the builder never started"
        time.sleep(0.02)
    os.kill(hung.pid, signal.SIGKILL)  # it holds the lock and has written nothing
    hung.wait()
    assert not list((tmp_path / "cache").glob("??/*.json")), "a partial entry is visible"
    cache = KernelCache(tmp_path / "cache", tmp_path / "locks", lock_timeout_s=10)
    start = time.perf_counter()
    lookup = cache.get(SPEC, compiler_for(SPEC.arch))
    assert lookup.status == "built" and time.perf_counter() - start < 10
    assert _cache(tmp_path).read(lookup.key) is not None


def test_unwritable_directory_compiles_in_memory_with_one_warning(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    cache = KernelCache(blocker / "cache", tmp_path / "locks", lock_timeout_s=30)
    fake = FakeCompiler()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = cache.get(SPEC, fake)
        b = cache.get(KernelSpec("add_rmsnorm", "fp16", "sm_90"), fake)
        again = cache.get(SPEC, fake)
    msgs = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(msgs) == 1 and "in memory" in msgs[0], msgs
    assert a.status == b.status == "built" and again.status == "cached" and fake.compiles == 2


@pytest.mark.skipif(os.getuid() == 0, reason="root writes through mode bits; the path-under-a-file case covers it")
def test_read_only_directory_serves_reads_and_warns(tmp_path):
    cache, fake = _cache(tmp_path), FakeCompiler()
    cache.get(SPEC, fake)
    cache.root.chmod(0o500)
    try:
        fresh = _cache(tmp_path)
        with pytest.warns(RuntimeWarning, match="not saved"):
            assert fresh.get(SPEC, fake).status == "cached"
            fresh.get(KernelSpec("add_rmsnorm", "fp16", "sm_90"), fake)
    finally:
        cache.root.chmod(0o700)


def test_directory_writable_by_others_is_refused(tmp_path):
    cache = _cache(tmp_path)
    cache.root.mkdir(mode=0o700)
    cache.root.chmod(0o777)
    with pytest.raises(CacheTrustError, match=r"writable by group or others \(drwxrwxrwx\)"):
        cache.get(SPEC, FakeCompiler())


def test_shard_writable_by_group_is_a_miss_with_one_line(tmp_path, caplog):
    cache, fake = _cache(tmp_path), FakeCompiler()
    key = cache.get(SPEC, fake).key
    (cache.root / key[:2]).chmod(0o770)
    assert _cache(tmp_path).read(key) is None
    assert f"refusing directory {key[:2]}: it is writable by group or others" in caplog.text


@pytest.mark.skipif(os.getuid() != 0, reason="giving a directory to another user needs root")
def test_directory_owned_by_someone_else_is_refused(tmp_path):
    cache = _cache(tmp_path)
    cache.root.mkdir(mode=0o700)
    os.chown(cache.root, 65534, 65534)
    with pytest.raises(CacheTrustError, match="owned by uid 65534"):
        cache.get(SPEC, FakeCompiler())


def test_locks_live_outside_the_cache(tmp_path):
    cache = _cache(tmp_path)
    cache.get(SPEC, FakeCompiler())
    assert list((tmp_path / "locks").glob("*.lock")) and not list(cache.root.rglob("*.lock"))

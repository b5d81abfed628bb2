"""Any state on disk, any invocation: one clear line, never a traceback, nothing lost. Entries of the wrong
kind where the cache, a layer or the state store expects another; JSON nested to exhaust the parser in
every file fused_ar reads; directories fused_ar cannot create or write; a lock directory inside the cache;
archs a compiler rejects; conflicting or out-of-range options. Each case runs the library or the CLI as a
user would and checks what comes out."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fused_ar import env
from fused_ar.errors import ConfigError
from fused_ar.jit import trust
from fused_ar.jit.cache import KernelCache
from fused_ar.jit.verdicts import remembered

from .test_cache import SPEC, FakeCompiler
from .test_hardening import _built, _cache, _cli, as_root

DEEP = b"[" * 2000 + b"]" * 2000  # deeper than Python's recursion limit, small enough for every size bound


def _one_line(proc: subprocess.CompletedProcess, code: int = 2) -> str:
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fused_ar: error: "), proc.stderr
    return lines[0]


# -- entries of the wrong kind --------------------------------------------------------------------------------
def test_a_file_where_a_shard_should_be_is_a_miss_reported_and_built_around(tmp_path, caplog):
    cache, key = _built(tmp_path)
    shard = cache.root / key[:2]
    for child in shard.iterdir():
        child.unlink()
    shard.rmdir()
    shard.write_text("not a directory")
    fresh = _cache(tmp_path)
    assert fresh.read(key) is None and "it is not a directory" in caplog.text
    good, bad = fresh.verify()
    assert [(e.key, "not a directory" in e.problem) for e in bad] == [(key[:2], True)]
    other = KernelSpec_with_other_shard(key[:2])
    assert fresh.get(other, FakeCompiler()).saved  # the rest of the cache keeps working
    lookup = fresh.get(SPEC, FakeCompiler())  # its own kernel: built, kept in memory, said once
    assert lookup.status == "built" and not lookup.saved


def KernelSpec_with_other_shard(avoid: str):
    """A spec whose key lands in a shard other than `avoid`."""
    from dataclasses import replace

    from fused_ar.jit.cache import cache_key
    from fused_ar.jit.render import render

    fake = FakeCompiler()
    for block in (64, 256, 512, 1024):
        spec = replace(SPEC, block=block)
        key = cache_key(render(spec).text, fake.options(spec.arch), spec.arch, fake.identity())
        if key[:2] != avoid:
            return spec
    raise AssertionError("no spec outside the shard")


def test_a_directory_named_like_a_code_object_costs_only_its_kernel(tmp_path, caplog):
    """Saving one kernel fails; the process keeps saving every other; cache clear removes the planted
    directory when it is empty and says so when it is not."""
    cache, key = _built(tmp_path)
    (cache.root / key[:2] / f"{key}.bin").unlink()
    (cache.root / key[:2] / f"{key}.json").unlink()
    (cache.root / key[:2] / f"{key}.bin").mkdir()
    fresh = _cache(tmp_path)
    lookup = fresh.get(SPEC, FakeCompiler())
    assert lookup.status == "built" and not lookup.saved and "kept in memory" in caplog.text
    other = fresh.get(KernelSpec_with_other_shard(key[:2]), FakeCompiler())
    assert other.saved and fresh.state() == "disk"
    removed, left = _cache(tmp_path).clear()
    assert removed == 2 and left == [] and not (cache.root / key[:2] / f"{key}.bin").exists()
    (cache.root / key[:2]).mkdir(exist_ok=True)
    (cache.root / key[:2] / f"{key}.bin").mkdir()
    (cache.root / key[:2] / f"{key}.bin" / "inside").write_text("x")
    removed, left = _cache(tmp_path).clear()
    assert len(left) == 1 and "a directory with contents, left in place" in left[0]


def test_cache_clear_on_a_read_only_disk_says_what_stayed(tmp_path, monkeypatch):
    cache, key = _built(tmp_path)

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(os, "unlink", read_only)
    removed, left = _cache(tmp_path).clear()
    assert removed == 0 and len(left) == 2 and all("Read-only file system" in line for line in left)


@pytest.mark.parametrize("kind", ["file", "fifo"])
@pytest.mark.parametrize("name", ["probes", "thresholds"])
def test_a_state_entry_of_another_kind_is_absent_and_named(tmp_path, monkeypatch, kind, name, caplog):
    root = tmp_path / "cache"
    monkeypatch.setenv("FUSED_AR_CACHE_DIR", str(root))
    root.mkdir(mode=0o700)
    if kind == "file":
        (root / name).write_text("x")
    else:
        os.mkfifo(root / name)
    if name == "probes":
        assert remembered("k1", lambda: (True, "probed now"))[1] == "probed now"
        assert remembered("k1", lambda: (True, "probed again"))[1] == "probed again"  # not remembered: no traceback
    else:
        from fused_ar.comm import thresholds

        assert thresholds.load("sm_90", 2) is None
    info = _cli("cache", "info", cache=root)
    assert info.returncode == 0 and "Traceback" not in info.stderr, info.stderr
    assert f"{name}:" in info.stdout and "unusable: it is not a directory" in info.stdout, info.stdout


# -- JSON that would exhaust the parser --------------------------------------------------------------------------
def test_deep_json_is_refused_in_every_file_read(tmp_path, monkeypatch, caplog):
    root = tmp_path / "cache"
    monkeypatch.setenv("FUSED_AR_CACHE_DIR", str(root))
    cache, key = _built(tmp_path)
    (cache.root / key[:2] / f"{key}.json").write_bytes(DEEP)
    assert _cache(tmp_path).read(key) is None and "nests deeper than" in caplog.text
    root.mkdir(mode=0o700, exist_ok=True)
    for name in ("probes", "thresholds"):
        (root / name).mkdir(mode=0o700, exist_ok=True)
    remembered("deep", lambda: (False, "x"))
    (root / "probes" / "peer_access-deep.json").write_bytes(DEEP)
    assert remembered("deep", lambda: (True, "probed again")) == (True, "probed again")
    (root / "thresholds" / "sm_90-tp2.json").write_bytes(DEEP)
    from fused_ar.comm import thresholds
    from fused_ar.jit.cache import read_manifest

    assert thresholds.load("sm_90", 2) is None
    layer = tmp_path / "layer"
    layer.mkdir(mode=0o755)
    (layer / "layer.json").write_bytes(DEEP)
    assert read_manifest(layer) is None
    verify = _cli("cache", "verify", str(layer), cache=root)
    assert verify.returncode == 1 and "Traceback" not in verify.stderr and "no manifest" in verify.stdout


def test_json_depth_reads_past_strings():
    assert trust.json_depth(b'{"a": "[[[[[[", "b": [1, {"c": "\\"]]"}]}') == 3
    assert trust.parse_json(b'{"a": 1}') == ({"a": 1}, "")
    assert trust.parse_json(b"\xff")[1].startswith("it is not JSON")


# -- a layer another user cannot enter -------------------------------------------------------------------------
@as_root
def test_a_layer_whose_shards_another_user_cannot_enter_is_a_miss(tmp_path):
    """A layer built by root with 0700 shard directories, read by uid 65534: every kernel is built in
    memory, one line names the layer's shard, no traceback."""
    from .test_layers import _other_uid_python, _readable_install

    python = _other_uid_python()
    base = Path(tempfile_dir())
    try:
        site, nvrtc = _readable_install(base)
        layer = base / "layer"
        env_vars = {"HOME": str(base), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "LD_LIBRARY_PATH": str(nvrtc)}
        built = subprocess.run(["env", "-i", *(f"{k}={v}" for k, v in env_vars.items()),
                                f"FUSED_AR_CACHE_DIR={base}/root-cache", python[-1], "-m", "fused_ar", "warm", "--arch",
                                "sm_90", "--ngpus", "1", "--dtype", "bf16", "--into", str(layer)],
                               capture_output=True, text=True, timeout=300)
        assert built.returncode == 0, built.stderr
        for shard in layer.glob("??"):
            shard.chmod(0o700)
        code = ("import fused_ar.jit.cache as c, fused_ar.jit.kernels as k, fused_ar.jit.spec as s\n"
                "from fused_ar.backends import compiler_for\n"
                "spec = k.warm_matrix(['sm_90'], [s.DType.BF16], [1])[0]\n"
                "print(c.default_cache().get(spec, compiler_for('sm_90')).status)\n")
        run = subprocess.run(["env", "-i", *(f"{k}={v}" for k, v in env_vars.items()), f"FUSED_AR_CACHE_PATH={layer}",
                              f"FUSED_AR_CACHE_DIR={base}/user-cache", *python, "-c", code],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0 and run.stdout.strip() == "built", run.stdout + run.stderr
        assert "Traceback" not in run.stderr and "Permission denied" in run.stderr, run.stderr
    finally:
        import shutil

        shutil.rmtree(base, ignore_errors=True)


def tempfile_dir() -> str:
    import tempfile

    base = tempfile.mkdtemp(prefix="fused_ar-disk-test-")
    os.chmod(base, 0o755)
    return base


# -- directories fused_ar cannot create, or must not use ----------------------------------------------------------
def test_cache_info_tells_missing_from_uncreatable(tmp_path):
    missing = _cli("cache", "info", cache=tmp_path / "new" / "cache")
    assert missing.returncode == 0 and "missing: made at the first build" in missing.stdout, missing.stdout
    proc = _cli("cache", "info", cache=Path("/proc/fused_ar_x/cache"))
    assert proc.returncode == 0 and "it cannot be made: /proc takes no new directory" in proc.stdout, proc.stdout


def test_into_a_place_that_cannot_be_written_compiles_nothing(tmp_path):
    start = time.perf_counter()
    line = _one_line(_cli("warm", "--arch", "sm_90", "--into", "/proc/fused_ar_x", cache=tmp_path / "c"))
    assert "into '/proc/fused_ar_x'" in line and "nothing is compiled" in line and time.perf_counter() - start < 15


def test_parents_of_the_cache_are_made_private_whatever_the_umask(tmp_path):
    cache = tmp_path / "a" / "b" / "cache"
    code = "import os; os.umask(0); import fused_ar.jit.cache as c; c.default_cache().state()"
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ, FUSED_AR_CACHE_DIR=str(cache)))
    for path in (tmp_path / "a", tmp_path / "a" / "b", cache):
        assert path.stat().st_mode & 0o777 == 0o700, (path, oct(path.stat().st_mode))


def test_a_layer_made_by_warm_into_is_readable_whatever_the_umask(tmp_path):
    layer = tmp_path / "opt" / "layer"
    code = ("import os, sys; os.umask(0o077); from fused_ar.cli import main; "
            f"sys.exit(main(['warm', '--arch', 'sm_90', '--ngpus', '1', '--dtype', 'bf16', '--into', '{layer}']))")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                   env=dict(os.environ, FUSED_AR_CACHE_DIR=str(tmp_path / "c")))
    for path in (tmp_path / "opt", layer, *layer.glob("??")):
        assert path.stat().st_mode & 0o777 == 0o755, (path, oct(path.stat().st_mode))


@pytest.mark.parametrize("variable", ["FUSED_AR_CACHE_DIR", "FUSED_AR_LOCK_DIR", "FUSED_AR_CACHE_PATH"])
def test_relative_directories_are_refused(tmp_path, variable):
    cache = Path("relative/dir") if variable == "FUSED_AR_CACHE_DIR" else tmp_path / "c"
    extra = {} if variable == "FUSED_AR_CACHE_DIR" else {variable: "relative/dir"}
    line = _one_line(_cli("cache", "info", cache=cache, **extra))
    assert variable in line and "must be an absolute path" in line


def test_relative_xdg_directories_are_ignored(monkeypatch):
    monkeypatch.delenv("FUSED_AR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")
    assert env.cache_dir() == Path.home() / ".cache" / "fused_ar"


@pytest.mark.parametrize("inside", ["same", "below"])
def test_a_lock_directory_inside_the_cache_is_refused(tmp_path, inside):
    locks = tmp_path / "c" if inside == "same" else tmp_path / "c" / "locks"
    line = _one_line(_cli("warm", "--arch", "sm_90", "--ngpus", "1", cache=tmp_path / "c", FUSED_AR_LOCK_DIR=str(locks)))
    assert "lies inside the cache directory" in line
    with pytest.raises(ConfigError, match="lies inside the cache directory"):
        KernelCache(tmp_path / "c", locks, 30)


def test_info_names_a_missing_and_an_untrusted_layer(tmp_path):
    untrusted = tmp_path / "open"
    untrusted.mkdir()
    untrusted.chmod(0o777)
    path = f"{tmp_path / 'nowhere'}{os.pathsep}{untrusted}"
    proc = _cli("info", cache=tmp_path / "c", FUSED_AR_CACHE_PATH=path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert f"cache layer:     {tmp_path / 'nowhere'} (missing; not used)" in proc.stdout, proc.stdout
    assert f"cache layer:     {untrusted} (untrusted:" in proc.stdout and "writable by group or others" in proc.stdout


# -- invocations --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch, says", [("sm_90f", "cannot build sm_90f"), ("sm_90 ", "arch 'sm_90 ': expected sm_XX")])
def test_an_arch_is_checked_whole_before_any_compile(tmp_path, arch, says):
    start = time.perf_counter()
    line = _one_line(_cli("warm", "--arch", arch, cache=tmp_path / "c"))
    assert says in line and time.perf_counter() - start < 20


def test_an_arch_the_compiler_rejects_is_one_line_beside_the_others(tmp_path):
    proc = _cli("warm", "--arch", "sm_90,sm_90f", "--ngpus", "1", "--dtype", "bf16", cache=tmp_path / "c")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    skipped = [line for line in proc.stderr.splitlines() if "sm_90f" in line]
    assert len(skipped) == 1 and skipped[0].startswith("warm: skipping sm_90f: NVRTC"), proc.stderr
    assert "compiled" in proc.stdout


@pytest.mark.parametrize("jobs", ["0", "100000"])
def test_jobs_are_bounded_by_the_cpus(tmp_path, jobs):
    line = _one_line(_cli("warm", "--arch", "sm_90", "-j", jobs, cache=tmp_path / "c"))
    assert f"jobs '{jobs}'" in line and f"to {os.cpu_count()}" in line


@pytest.mark.parametrize("argv, says", [
    (["bench", "--write-thresholds", "--one-process"], "--write-thresholds with --one-process"),
    (["bench", "add_rmsnorm", "--paths", "fused_auto"], "--paths with bench add_rmsnorm"),
    (["bench", "fp8", "--write-thresholds"], "--write-thresholds with bench fp8"),
])
def test_conflicting_bench_options_are_refused_before_a_gpu_is_needed(tmp_path, argv, says):
    assert says in _one_line(_cli(*argv, cache=tmp_path / "c"))


@pytest.mark.parametrize("command", ["info", "demo", "probe", "warm", "cache", "bench", "source"])
def test_every_command_has_a_description(command):
    proc = subprocess.run([sys.executable, "-m", "fused_ar", command, "--help"], capture_output=True, text=True)
    assert proc.returncode == 0
    body = proc.stdout.split("\n\n")[1]
    assert not body.startswith(("positional arguments", "options")), proc.stdout


@pytest.mark.parametrize("script, argv, says", [
    ("examples/tp_decode.py", ["--tp", "3"], "--tp: '3': must be 2, 4, 6 or 8"),
    ("examples/tp_decode.py", ["--m", "-5"], "--m: '-5': must be a whole number >= 1"),
    ("examples/tp_decode.py", ["--tp", "6"], "--ffn: 4096: must split evenly over --tp 6 ranks"),
    ("examples/add_rmsnorm_example.py", ["--n", "0"], "--n: '0': must be a whole number >= 1"),
])
def test_examples_check_their_arguments_before_looking_for_a_gpu(script, argv, says):
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, str(repo / script), *argv], capture_output=True, text=True, cwd=repo,
                          env=dict(os.environ, PYTHONPATH=str(repo)))
    assert proc.returncode == 2 and says in proc.stderr and "GPU" not in proc.stderr, proc.stderr


def test_other_libraries_warnings_keep_their_own_label(capsys):
    from fused_ar import cli

    cli._one_line_warning("fused_ar kernel cache /x is not writable", RuntimeWarning, cli.__file__, 1)
    cli._one_line_warning("Failed to initialize NumPy", UserWarning, "/usr/lib/python3/torch/__init__.py", 7)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "fused_ar: warning: fused_ar kernel cache /x is not writable"
    assert not any(line.startswith("fused_ar") for line in err[1:]) and "UserWarning: Failed to initialize NumPy" in err[1]


def test_a_probe_verdict_survives_a_file_planted_as_its_directory(tmp_path, monkeypatch):
    """The verdict cannot be remembered, the probe still answers, and the planted file is left alone."""
    root = tmp_path / "cache"
    monkeypatch.setenv("FUSED_AR_CACHE_DIR", str(root))
    root.mkdir(mode=0o700)
    (root / "probes").write_text("planted")
    assert remembered("k", lambda: (True, "ok")) == (True, "ok")
    assert (root / "probes").read_text() == "planted"


def test_warm_keeps_saving_after_one_kernel_cannot_be_saved(tmp_path):
    """A directory planted where one kernel's code object goes: warm saves every other kernel."""
    cache = tmp_path / "c"
    first = _cli("warm", "--arch", "sm_90", "--ngpus", "1", "--dtype", "bf16", cache=cache)
    assert first.returncode == 0
    victim = sorted(cache.glob("??/*.bin"))[0]
    (victim.with_suffix(".json")).unlink()
    victim.unlink()
    victim.mkdir()
    second = _cli("warm", "--arch", "sm_90", "--ngpus", "1", "--dtype", "bf16", cache=cache)
    assert second.returncode == 1 and "Traceback" not in second.stderr
    assert "1 compiled (0 saved)" in second.stdout and f"ignoring {victim}" in second.stderr, second.stdout + second.stderr


def test_json_files_written_are_read_back(tmp_path):
    """The writers' own output passes the bounded reader (no false refusals)."""
    payload = {"ok": True, "detail": "x", "nested": [[{"a": [1]}]]}
    raw = json.dumps(payload).encode()
    assert trust.parse_json(raw) == (payload, "")

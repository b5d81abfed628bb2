"""scripts/ab_kernels.py: each variant's kernels render from its own sources, and bad arguments are refused
before any GPU work (the timing itself runs on a GPU only)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fused_ar.jit import render as render_module
from fused_ar.jit.render import render
from fused_ar.jit.spec import KernelSpec, Quant

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ab_kernels.py"
ROOT = SCRIPT.parents[1]


@pytest.fixture
def ab(monkeypatch):
    """The script as a module; the render module's source directory put back afterwards."""
    monkeypatch.setattr(render_module, "kernels_src_dir", render_module.kernels_src_dir)
    spec = importlib.util.spec_from_file_location("ab_kernels", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module


def test_each_variant_renders_from_its_own_sources(ab, tmp_path):
    changed = tmp_path / "changed"
    shutil.copytree(render_module.kernels_src_dir(), changed / "kernels_src")
    with open(changed / "kernels_src" / "fa_rmsnorm.h", "a") as f:
        f.write("// the variant's own line\n")
    spec = KernelSpec("add_rmsnorm", "bf16", "sm_90", quant=Quant.GROUP)
    base = ab.sources_of(ROOT)
    assert "the variant's own line" not in render(spec).text
    ab.use_sources(ab.sources_of(changed))
    assert "the variant's own line" in render(spec).text
    ab.use_sources(base)
    assert "the variant's own line" not in render(spec).text


def test_plans_and_functions_of_other_sources_are_forgotten(ab):
    """A kept plan holds the loaded function of the sources it was built from: a variant must build its own."""
    from fused_ar.device import launch, ops

    saved = [dict(t) for t in (ops._plans, ops._by_pack, launch._functions)]
    try:
        for table in (ops._plans, ops._by_pack, launch._functions):
            table["a plan of other sources"] = object()
        ab.use_sources(ab.sources_of(ROOT))
        assert not ops._plans and not ops._by_pack and not launch._functions
    finally:
        for table, kept in zip((ops._plans, ops._by_pack, launch._functions), saved):
            table.clear()
            table.update(kept)


@pytest.mark.parametrize("args, message", [
    (["{tmp}/nowhere"], "neither it nor its kernels_src holds the kernel sources"),
    (["{root},{root}"], "need distinct names"),
    (["{root}", "--modes", "bf16,fp6"], "unknown modes ['fp6']"),
    (["{root}", "--shapes", "1x"], "--shapes takes m x n pairs"),
    (["{root}", "--replays", "0"], "--replays must be at least 1"),
])
def test_bad_arguments_are_refused_before_any_gpu_work(tmp_path, args, message):
    argv = [a.format(tmp=tmp_path, root=ROOT) for a in args]
    result = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 1 and message in result.stderr, result.stderr


@pytest.mark.parametrize("args, message", [
    (["{root}", "--checkouts", "-1"], "--checkouts must be a number of rounds of at least 1, not -1"),
    (["{root}/kernels_src", "--checkouts", "2"], "takes directories holding fused_ar and kernels_src"),
])
def test_bad_checkout_arguments_are_refused(tmp_path, args, message):
    argv = [a.format(root=ROOT) for a in args]
    result = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 1 and message in result.stderr, result.stderr


def _rows(us: float, sha: str) -> list[dict]:
    return [{"m": 1, "n": 4096, "mode": "bf16", "us": {"kernels_src": us}, "sha256": {"kernels_src": sha}},
            {"m": 1, "n": 4096, "mode": "group", "us": {"kernels_src": 2 * us}, "sha256": {"kernels_src": sha + "g"}}]


def test_checkouts_summary_takes_the_median_of_processes_and_flags_other_bits(ab):
    rounds = {"base": [_rows(2.0, "a"), _rows(2.2, "a"), _rows(2.1, "a")],
              "change": [_rows(1.9, "a"), _rows(1.8, "a"), _rows(3.0, "a")],
              "broken": [_rows(1.0, "a"), _rows(1.0, "b"), _rows(1.0, "a")]}
    lines, rows = ab.summarize(["base", "change", "broken"], rounds)
    assert [(r["m"], r["n"], r["mode"]) for r in rows] == [(1, 4096, "bf16"), (1, 4096, "group")]
    assert rows[0]["us"] == {"base": 2.1, "change": 1.9, "broken": 1.0}
    assert rows[1]["us"]["change"] == 3.8
    assert rows[0]["us_per_process"]["change"] == [1.9, 1.8, 3.0]
    assert rows[0]["same_bits"] == {"base": True, "change": True, "broken": False}
    assert "change=1.900(0.905,same bits; 1.900, 1.800, 3.000)" in lines[0]
    assert "broken=1.000(0.476,bits differ;" in lines[0]


def test_each_checkout_runs_its_own_package(tmp_path):
    """The process of a checkout imports that checkout's fused_ar, not the one the script came with."""
    other = tmp_path / "other"
    for part in ("fused_ar", "kernels_src"):
        shutil.copytree(ROOT / part, other / part, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, str(SCRIPT), str(other), "--checkouts", "1", "--shapes", "1x256",
                             "--modes", "bf16", "--replays", "1", "--out", str(out)],
                            capture_output=True, text=True, cwd=tmp_path)
    assert f"fused_ar from {other / 'fused_ar'}" in result.stdout, result.stdout + result.stderr
    import torch

    if torch.cuda.is_available():
        assert result.returncode == 0, result.stderr
        assert json.loads((out / "ab.json").read_text())[0]["same_bits"] == {"other": True}
    else:
        assert result.returncode == 1 and "needs a GPU" in result.stderr
        assert f"the process of {other} (round 1) exited 1" in result.stderr

"""scripts/ab_kernels.py: each variant's kernels render from its own sources, and bad arguments are refused
before any GPU work (the timing itself runs on a GPU only)."""

from __future__ import annotations

import importlib.util
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

"""`import fused_ar` loads neither torch nor hip nor cuda; names resolve on first use."""

from __future__ import annotations

import subprocess
import sys


def _run(code: str) -> None:
    subprocess.run([sys.executable, "-c", code], check=True)


def test_import_is_lazy():
    _run("import fused_ar, sys; assert not {'torch','hip','cuda'} & set(sys.modules), sorted(sys.modules)")


def test_spec_and_cache_names_stay_light():
    _run("import fused_ar, sys; fused_ar.KernelSpec; fused_ar.default_cache; fused_ar.CompileError; "
         "assert not {'torch','hip','cuda'} & set(sys.modules)")


def test_op_access_still_defers_torch():
    _run("import fused_ar, sys; fused_ar.add_rmsnorm; fused_ar.KernelSpec('add_rmsnorm', 'bf16', 'sm_90'); "
         "assert not {'torch', 'hip', 'cuda'} & set(sys.modules)")


def test_unknown_attribute():
    _run("import fused_ar\ntry:\n    fused_ar.nope\nexcept AttributeError as e:\n    assert 'nope' in str(e)\n"
         "else:\n    raise SystemExit('no AttributeError')")

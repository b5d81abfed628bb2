"""Spec -> source text: the kernels_src template of the op, its headers inlined, the spec's constants on top.

The result is self-contained (no include paths for hiprtc, NVRTC or clang) and is exactly what the cache
key hashes. Rendering never compiles and never touches the cache.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .kernels import kernel_def
from .spec import Fp8Format, KernelSpec, Quant, fp8_in_hardware

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')
_PRAGMA_ONCE = re.compile(r"^\s*#\s*pragma\s+once\s*$")


def kernels_src_dir() -> Path:
    """Installed wheels carry the sources as fused_ar/kernels_src; a source tree keeps them beside the package."""
    here = Path(__file__).resolve().parent.parent  # the fused_ar package
    for candidate in (here / "kernels_src", here.parent / "kernels_src"):
        if (candidate / "fa_platform.h").is_file():
            return candidate
    raise FileNotFoundError(f"kernels_src not found next to {here} (is the package installed completely?)")


@dataclass(frozen=True)
class Source:
    """A spec's rendered source text (headers inlined, constants on top)."""

    spec: KernelSpec
    text: str

    @property
    def name(self) -> str:
        return self.spec.kernel_name

    @property
    def filename(self) -> str:
        return f"{self.name}.hip"


@lru_cache(maxsize=None)
def _read(path: Path) -> str:
    return path.read_text()


def _inline(name: str, root: Path, seen: set[str]) -> list[str]:
    if name in seen:
        return []
    seen.add(name)
    lines = [f"// ---- {name} ----"]
    for line in _read(root / name).splitlines():
        include = _INCLUDE.match(line)
        if include:
            lines += _inline(include.group(1), root, seen)
        elif not _PRAGMA_ONCE.match(line):
            lines.append(line)
    return lines


def render(spec: KernelSpec) -> Source:
    kdef = kernel_def(spec.op)
    constants = {
        "FA_DTYPE": spec.dtype.render_id,
        "FA_PACK_BYTES": spec.pack,
        "FA_NGPUS": spec.ngpus,
        "FA_BLOCK": spec.block,
        "FA_KERNEL_NAME": spec.kernel_name,
        "FA_WEIGHT": spec.weight.render_id,
        "FA_RESIDUAL": int(spec.residual),
        "FA_INPLACE": int(spec.inplace),
        "FA_QUANT": spec.quant.render_id,
        "FA_FP8_FNUZ": int(spec.fp8 is Fp8Format.E4M3FNUZ),
        "FA_FP8_HW": int(spec.quant.converts_e4m3 and fp8_in_hardware(spec.arch, spec.fp8)),
        "FA_SCALE_POW2": int(spec.quant in (Quant.GROUP_POW2, Quant.GROUP_UE8M0)),
        "FA_SCALE_UE8M0": int(spec.quant is Quant.GROUP_UE8M0),
        "FA_GROUP_SHARED": int(not spec.short_rows),  # short rows: only groups that fill a run of lanes (kernels.py)
        "FA_FP4_BLOCK": spec.quant.fp4_block,
        "FA_SCALE_SWIZZLED": int(spec.quant is Quant.NVFP4_SWIZZLED),
        "FA_MXFP4_ROUNDING": spec.quant.mxfp4_rounding,
        **kdef.constants(spec),
    }
    head = [f"// fused_ar kernel {spec}", "// rendered from kernels_src; edit the templates, not this text"]
    head += [f"#define {k} {v}" for k, v in constants.items()]
    body = _inline(kdef.template, kernels_src_dir(), set())
    return Source(spec, "\n".join(head + body) + "\n")

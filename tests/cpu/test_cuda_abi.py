"""The CUDA facade's ctypes structures have cuda.h's layout, field for field: a C compiler checks every size
and offset against the real header (the driver API header that triton ships, unpacked with the engines)."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import pytest

from fused_ar import env
from fused_ar.backends.nvidia import runtime

# ctypes structure -> the C type of cuda.h it stands for
STRUCTS = {runtime._LaunchConfig: "CUlaunchConfig", runtime._LaunchAttribute: "CUlaunchAttribute",
           runtime._Memcpy2D: "CUDA_MEMCPY2D", runtime._IpcHandle: "CUipcMemHandle"}
# fields of ours that cover a union or padding of the header's, by (offset, size) rather than by name
UNNAMED = {("CUlaunchAttribute", "pad"), ("CUlaunchAttribute", "value"), ("CUlaunchAttribute", "rest")}


def _asserts() -> str:
    lines = ["#include <stddef.h>", "#include <cuda.h>"]
    for struct, c_type in STRUCTS.items():
        lines.append(f"_Static_assert(sizeof({c_type}) == {ctypes.sizeof(struct)}, \"sizeof {c_type}\");")
        for name, *_ in struct._fields_:
            if (c_type, name) in UNNAMED:
                continue
            offset = getattr(struct, name).offset
            lines.append(f"_Static_assert(offsetof({c_type}, {name}) == {offset}, \"{c_type}.{name}\");")
    lines.append("_Static_assert(offsetof(CUlaunchAttribute, value) == 8, \"CUlaunchAttribute.value\");")
    lines.append("_Static_assert(CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION == "
                 f"{runtime._LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION}, \"attribute id\");")
    return "\n".join(lines) + "\n"


def _check(source: str, header_dir: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    path = tmp_path / "abi.c"
    path.write_text(source)
    return subprocess.run([env.CLANG.get(), "-fsyntax-only", "-x", "c", "-std=c11", f"-I{header_dir}", str(path)],
                          capture_output=True, text=True)


@pytest.fixture(scope="module")
def header_dir(engines_site: Path) -> Path:
    found = engines_site / "triton" / "backends" / "nvidia" / "include"
    if not (found / "cuda.h").is_file():
        pytest.fail(f"cuda.h is not in {found}: scripts/engines.sh brings triton, which ships it")
    return found


def test_structures_match_cuda_h(header_dir, tmp_path):
    done = _check(_asserts(), header_dir, tmp_path)
    assert done.returncode == 0, done.stderr


def test_a_wrong_offset_is_caught(header_dir, tmp_path):
    wrong = _asserts().replace("offsetof(CUlaunchConfig, hStream) == 32", "offsetof(CUlaunchConfig, hStream) == 28")
    done = _check(wrong, header_dir, tmp_path)
    assert done.returncode != 0 and "CUlaunchConfig.hStream" in done.stderr

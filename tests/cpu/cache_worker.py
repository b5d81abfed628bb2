"""A separate process using the kernel cache, for the race and kill tests (`python -m tests.cpu.cache_worker`).

argv: root lock_root mode ready_dir nprocs. mode 'race': wait until nprocs workers are ready, then get
the spec through real NVRTC. mode 'hang': compile, then stop forever while holding the build lock.
Prints one JSON line: status and the code object's digest.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

from fused_ar.jit.cache import KernelCache
from fused_ar.backends import compiler_for
from fused_ar.jit.spec import KernelSpec

SPEC = KernelSpec("add_rmsnorm", "bf16", "sm_90", block=128)


class HangingCompiler:
    """Delegates to NVRTC, then announces itself and never returns (until killed)."""

    def __init__(self, inner, marker: Path) -> None:
        self.inner, self.marker = inner, marker

    def identity(self):
        return self.inner.identity()

    def options(self, arch):
        return self.inner.options(arch)

    def compile(self, source, arch):
        self.inner.compile(source, arch)
        self.marker.write_text("building")
        time.sleep(3600)


def main() -> None:
    root, lock_root, mode, ready_dir, nprocs = sys.argv[1:6]
    cache = KernelCache(Path(root), Path(lock_root), lock_timeout_s=60)
    compiler = compiler_for("sm_90")
    compiler.identity()  # load NVRTC before the start line, so workers really race on the build
    ready = Path(ready_dir)
    if mode == "hang":
        compiler = HangingCompiler(compiler, ready / "building")
    else:
        (ready / f"ready-{__import__('os').getpid()}").touch()
        deadline = time.time() + 60
        while len(list(ready.glob("ready-*"))) < int(nprocs) and time.time() < deadline:
            time.sleep(0.005)
    lookup = cache.get(SPEC, compiler)
    print(json.dumps({"status": lookup.status, "digest": hashlib.sha256(lookup.kernel.code).hexdigest()}))


if __name__ == "__main__":
    main()

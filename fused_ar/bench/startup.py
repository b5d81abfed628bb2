"""`python -m fused_ar bench startup`: what a fresh serving process pays for its first calls, each measured
in new processes beside torch's own first call in the same run: the first add_rmsnorm from a warm cache
(the import included: serving processes import fused_ar lazily) and from an empty one, the import alone,
and with 2 processes sharing GPU 0 after the first per boot: the import up to `fused_ar.Communicator`, the
Communicator's construction (its group exchanges timed where they happen, and the rest) and its first
allreduce_rmsnorm. The package's bytecode is compiled first, as an install does. Medians of --replays
processes; a table on stdout, startup.md and startup.json in --out.
"""

from __future__ import annotations

import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

from .. import env

_SETUP = """
import json, os, sys, time
import torch
M, N = @M, @N
x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
r = torch.randn_like(x)
w = torch.ones(N, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
"""

# What each fresh process times, after torch has set up CUDA and the inputs (both sides pay the same).
CASES = {
    "torch first rms_norm": _SETUP + """
t0 = time.perf_counter()
y = torch.nn.functional.rms_norm(x + r, (N,), w, 1e-6)
torch.cuda.synchronize()
print(json.dumps({"ms": (time.perf_counter() - t0) * 1e3}))
""",
    "fused_ar import": _SETUP + """
t0 = time.perf_counter()
import fused_ar
fused_ar.add_rmsnorm
print(json.dumps({"ms": (time.perf_counter() - t0) * 1e3}))
""",
    "fused_ar first add_rmsnorm": _SETUP + """
t0 = time.perf_counter()
import fused_ar
fused_ar.add_rmsnorm(x, r, w, 1e-6)
torch.cuda.synchronize()
ms = (time.perf_counter() - t0) * 1e3
print(json.dumps({"ms": ms, "nvrtc_loaded": "cuda.bindings.nvrtc" in sys.modules,
                  "filelock_loaded": "filelock" in sys.modules}))
""",
}

_COMM = """
import json, os, sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp

def rank(i, out):
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method="file://" + out + ".store", rank=i, world_size=2)
    x = torch.randn(@M, @N, device="cuda", dtype=torch.bfloat16)
    r = torch.randn_like(x)
    w = torch.ones(@N, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    import fused_ar
    fused_ar.Communicator
    imported = (time.perf_counter() - t0) * 1e3
    # the group's own exchanges (what the group's speed decides, not ours), timed where they happen
    exchanges, gather = [], dist.all_gather_object
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return gather(*args, **kwargs)
        finally:
            exchanges.append((time.perf_counter() - start) * 1e3)
    dist.all_gather_object = timed
    # the construction's steps, each timed with the exchanges it makes
    steps = {}
    def step(name):
        method = getattr(fused_ar.Communicator, name)
        def run(self, *args, **kwargs):
            start = time.perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                steps[name.strip("_")] = steps.get(name.strip("_"), 0.0) + (time.perf_counter() - start) * 1e3
        setattr(fused_ar.Communicator, name, run)
    for name in ("_gather_info", "_probe", "_allocate", "_connect"):
        step(name)
    dist.barrier()
    t0 = time.perf_counter()
    comm = fused_ar.Communicator(device=0, max_bytes=8 << 20)
    build = (time.perf_counter() - t0) * 1e3
    during = list(exchanges)
    dist.barrier()
    t0 = time.perf_counter()
    comm.allreduce_rmsnorm(x, r, w, 1e-6)
    torch.cuda.synchronize()
    first = (time.perf_counter() - t0) * 1e3
    dist.barrier()
    comm.close()
    if i == 0:
        open(out, "w").write(json.dumps({"ms": build, "exchanges_ms": during, "import_ms": imported,
                                         "first_call_ms": first, "steps_ms": steps}))
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(rank, args=(sys.argv[1],), nprocs=2)
"""


def _sized(code: str, m: int, n: int) -> str:
    return code.replace("@M", str(m)).replace("@N", str(n))


def _progress(what: str, result: dict[str, Any]) -> dict[str, Any]:
    """Each fresh process's result as it comes (a run of many processes takes minutes), on stderr."""
    print(f"startup: {what}: {result['ms']:.1f} ms", file=sys.stderr, flush=True)
    return result


def _fresh(code: str, cache: str, timeout: float = 300) -> dict[str, Any]:
    """One fresh interpreter running `code`; its JSON line."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, FUSED_AR_CACHE_DIR=cache))
    if proc.returncode != 0:
        raise RuntimeError(f"the measuring process failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _communicator(cache: str, tmp: Path, m: int, n: int) -> dict[str, Any]:
    script = tmp / "comm.py"
    script.write_text(textwrap.dedent(_sized(_COMM, m, n)))
    out = tmp / f"comm-{os.urandom(4).hex()}.json"
    proc = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, FUSED_AR_CACHE_DIR=cache))
    if proc.returncode != 0:
        raise RuntimeError(f"the communicator processes failed:\n{proc.stderr[-2000:]}")
    return json.loads(out.read_text())


def bench_startup(args: Any) -> int:
    from ..device.validate import require_gpu

    require_gpu("python -m fused_ar bench startup")
    m, n, replays = (args.m or [8])[0], (args.hidden or [8192])[0], args.replays
    warm_cache = str(env.cache_dir())
    rows: dict[str, list[dict]] = {}
    # An installed wheel has its bytecode compiled at install time (pip does it); a checkout may not, and
    # compiling the package's sources would then count in every fresh process's import.
    bytecode = compileall.compile_dir(str(Path(__file__).resolve().parents[1]), quiet=2)
    with tempfile.TemporaryDirectory(prefix="fused_ar-startup-") as tmp:
        _fresh(_sized(CASES["fused_ar first add_rmsnorm"], m, n), warm_cache)  # the warm cache holds it now
        for name, code in CASES.items():
            rows[name] = [_progress(name, _fresh(_sized(code, m, n), warm_cache)) for _ in range(replays)]
        cold = []
        for i in range(min(replays, 3)):
            cold.append(_progress("first add_rmsnorm, empty cache", _fresh(
                _sized(CASES["fused_ar first add_rmsnorm"], m, n), str(Path(tmp) / f"cold{i}"))))
        rows["fused_ar first add_rmsnorm, empty cache"] = cold
        _communicator(warm_cache, Path(tmp), m, n)  # the first per boot probes peer access; the verdict is kept
        comm_runs = [_progress("Communicator()", _communicator(warm_cache, Path(tmp), m, n)) for _ in range(replays)]
        rows["fused_ar import up to fused_ar.Communicator (2 processes)"] = [{"ms": r["import_ms"]} for r in comm_runs]
        rows["Communicator() after the first per boot (2 processes)"] = comm_runs
        rows["Communicator() less its group exchanges"] = [
            {"ms": r["ms"] - sum(r["exchanges_ms"]), "exchanges": len(r["exchanges_ms"])} for r in comm_runs]
        rows["first allreduce_rmsnorm (2 processes)"] = [{"ms": r["first_call_ms"]} for r in comm_runs]
    lines = [f"# bench startup: fresh processes, bf16 m={m} n={n}, median (min) of {replays}", "",
             "The package's bytecode " + ("compiled first, as an install compiles it." if bytecode else
                                          "could not be written: every import compiles the sources."), "",
             "| what | ms | notes |", "| --- | ---: | --- |"]
    summary = {}
    for name, runs in rows.items():
        times = [r["ms"] for r in runs]
        summary[name] = {"median_ms": statistics.median(times), "min_ms": min(times), "runs": runs}
        notes = ""
        if "exchanges_ms" in runs[0]:
            notes = (f"{len(runs[0]['exchanges_ms'])} group exchanges (all_gather_object over gloo): "
                     f"{statistics.median(sum(r['exchanges_ms']) for r in runs):.1f} ms; by step (exchanges "
                     "included): " + ", ".join(f"{k} {statistics.median(r['steps_ms'].get(k, 0.0) for r in runs):.1f}"
                                               for k in runs[0]["steps_ms"]))
        elif "exchanges" in runs[0]:
            notes = "target <= 30 ms"
        elif "nvrtc_loaded" in runs[0]:
            notes = (f"NVRTC loaded: {runs[0]['nvrtc_loaded']}, filelock imported: {runs[0]['filelock_loaded']}")
        lines.append(f"| {name} | {statistics.median(times):.1f} ({min(times):.1f}) | {notes} |")
    torch_first = summary["torch first rms_norm"]["median_ms"]
    for name in ("fused_ar first add_rmsnorm", "first allreduce_rmsnorm (2 processes)"):
        lines += ["", f"{name} - torch's first rms_norm: {summary[name]['median_ms'] - torch_first:+.1f} ms "
                  "(median; target <= +10 ms)"]
    text = "\n".join(lines)
    print(text)
    out = Path(args.out or "fused_ar_bench")
    out.mkdir(parents=True, exist_ok=True)
    (out / "startup.md").write_text(text + "\n")
    (out / "startup.json").write_text(json.dumps(summary, indent=1))
    return 0

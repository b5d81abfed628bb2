"""What a new user runs first, run as they would on one GPU: `python -m fused_ar demo` and every example
(with its defaults; the benchmark example with a small sweep), each checked for its exit status and output;
README's snippets that run in one process on one GPU, as written; a Communicator built with each form of
device torch users pass."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import fused_ar
from fused_ar.errors import InputError

pytestmark = pytest.mark.gpu
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT, CUDA_DEVICE_MAX_CONNECTIONS="32")
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout)


def test_demo_prints_its_table_and_exits_0():
    proc = _run("-m", "fused_ar", "demo")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 3 * 4, proc.stdout  # N = 2, 4, 8 x m = 1, 16, 128, 1024
    assert "checked against the rank-order reference" in proc.stdout


def test_add_rmsnorm_example():
    proc = _run("examples/add_rmsnorm_example.py")
    assert proc.returncode == 0 and "residual_out bit-exact: True" in proc.stdout, proc.stdout + proc.stderr


def test_tp_decode_example():
    proc = _run("examples/tp_decode.py")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for mode in ("eager", "graph", "compiled"):
        assert mode in proc.stdout


def test_bench_example_small(tmp_path):
    proc = _run("examples/bench_fused_ar_rmsnorm.py", "--tp", "2", "--m", "1,16", "--hidden", "4096",
                "--graph-calls", "20", "--replays", "3", "--out", str(tmp_path / "b"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (tmp_path / "b" / "tp2.md").is_file() and (tmp_path / "b" / "results.json").is_file()


@pytest.mark.parametrize("device", [0, torch.device("cuda", 0), "cuda:0", "cuda", torch.device("cuda")],
                         ids=["int", "torch.device(cuda, 0)", "cuda:0", "cuda", "torch.device(cuda)"])
def test_local_group_takes_every_device_form(device):
    comms = fused_ar.Communicator.local_group(2, device=device, max_bytes=1 << 20)
    try:
        assert all(c.device == 0 for c in comms)
    finally:
        for c in comms:
            c.close()


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu"), 99, "cuda:99", "gpu:0", 1.5])
def test_bad_devices_are_input_errors(device):
    with pytest.raises(InputError, match="device"):
        fused_ar.Communicator.local_group(2, device=device, max_bytes=1 << 20)


def test_communicator_in_a_process_group_takes_a_torch_device(tmp_path):
    code = ("import torch, torch.distributed as dist, fused_ar\n"
            f"dist.init_process_group('gloo', init_method='file://{tmp_path}/store', rank=0, world_size=1)\n"
            "for d in (torch.device('cuda', 0), 'cuda:0', 0):\n"
            "    with fused_ar.Communicator(device=d, max_bytes=1 << 20) as c:\n"
            "        print(repr(c))\n")
    proc = _run("-c", code, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("cuda:0") == 3


def test_bench_add_rmsnorm_with_its_options(tmp_path):
    proc = _run("-m", "fused_ar", "bench", "add_rmsnorm", "--hidden", "2048,8200", "--m", "1,1024", "--variants",
                "--sweep-blocks", "--fp8", "--out", str(tmp_path / "n"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = (tmp_path / "n" / "add_rmsnorm.md").read_text()
    assert "Block-size sweep" in table and "Variants against the contiguous call" in table
    for mode in ("static", "token", "group"):
        assert f"FP8 output (float8_e4m3fn), {mode} scales" in table
    shapes = [f"| {m} x {n} |" for n in (2048, 8200) for m in (1, 1024)]
    for row in ("copy floor", "fused_ar", "torch eager", "torch.compile", "FlashInfer fused_add_rmsnorm, PDL on",
                "Liger fused add + RMSNorm"):
        assert all(f"{shape} {row} |" in table for shape in shapes), row
    assert not [line for line in table.splitlines() if "| fused_ar" in line and "failed:" in line], table
    assert (tmp_path / "n" / "add_rmsnorm.json").is_file()


def test_bench_add_rmsnorm_peers_filter(tmp_path):
    """--peers none times ours alone (the quick A/B of two kernel sources); --peers eager keeps eager's rows."""
    for peers, kept, gone in (("none", (), ("torch eager", "torch.compile", "FlashInfer", "Liger")),
                              ("eager", ("torch eager",), ("torch.compile", "FlashInfer", "Liger"))):
        proc = _run("-m", "fused_ar", "bench", "add_rmsnorm", "--hidden", "4096", "--m", "1", "--fp8", "--peers", peers,
                    "--out", str(tmp_path / peers))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        table = (tmp_path / peers / "add_rmsnorm.md").read_text()
        assert f"--fp8 --peers {peers}`" in table and "| 1 x 4096 | fused_ar |" in table
        assert all(f"| 1 x 4096 | {row}" in table for row in kept)
        assert not any(f"| 1 x 4096 | {row}" in table for row in gone), table


def _one_gpu_snippets():
    from tests.readme_snippets import runs_on_one_gpu, snippets

    return [(i, code) for i, code in enumerate(snippets()) if runs_on_one_gpu(code)]


@pytest.mark.parametrize("index, code", _one_gpu_snippets(), ids=lambda v: f"snippet{v}" if isinstance(v, int) else "")
def test_readme_snippet_runs_as_written(index, code):
    proc = _run("-c", code, timeout=300)
    assert proc.returncode == 0, f"README snippet {index}:\n{code}\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"


def test_bench_host_times_every_row_and_profiles(tmp_path):
    proc = _run("-m", "fused_ar", "bench", "host", "--m", "8", "--hidden", "8192", "--tp", "2", "--profile",
                "--out", str(tmp_path / "h"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = (tmp_path / "h" / "host.md").read_text()
    for row in ("`fused_ar.add_rmsnorm` (allocates outputs)",
                "`fused_ar.add_rmsnorm_fp8`, static scale, out= given",
                "`fused_ar.add_rmsnorm_fp8`, groups of 128, out= given",
                "`fused_ar.add_rmsnorm_fp4` (NVFP4), out= given",
                "`comm.allreduce_rmsnorm_fp8`, static scale, out= given, path auto",
                "`torch.ops.fused_ar.allreduce_rmsnorm_fp8`, static scale"):
        assert f"| {row} | " in table, row
    assert table.count("## cProfile") == 5, table

"""The benchmark's outputs from synthetic timings (no GPU): tables in the seed's shape, CSV and JSON of every
raw number, CDF plots, crossovers found where they were planted, the thresholds file's round trip and
its use by the auto path, and the command line's size ranges."""

from __future__ import annotations

import argparse
import csv
import json
import logging
import random

import pytest

from fused_ar.comm import thresholds
from fused_ar.bench import report
from fused_ar.bench.paths import BY_NAME, DEFAULT_PATHS, PAIRS, parse_paths
from fused_ar.bench.results import Point, Run
from fused_ar.bench.sweep import Sweep, plan
from fused_ar.cli import _sizes, build_parser
from fused_ar.errors import InputError
from fused_ar.comm.policy import Path, choose_path, fallback_min_bytes, one_stage_max_bytes
from fused_ar.jit.spec import DType, Platform
from fused_ar.comm.thresholds import SizeRule, Thresholds

MS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
HIDDEN = 4096


def model_us(path: str, m: int) -> float:
    """Latencies with known crossovers: 2stage beats 1stage from m=64, the fallback beats both from 512."""
    one, two, fallback = 5 + 0.12 * m, 9 + 0.05 * m, 20 + 0.015 * m
    return {"fused_1stage": one, "fused_2stage": two, "fused_auto": min(one, two), "fallback": fallback,
            "nccl_torch": fallback + 4, "unfused_ours": one + 3}[path]


def synthetic_run(tp: int = 8, emulated: bool = False, replays: int = 6, ranks: int = 8) -> Run:
    rng = random.Random(tp)
    run = Run(f"python -m fused_ar bench --tp {tp}", {"gpus": ["test GPU"]},
              {tp: "single-GPU emulation" if emulated else f"{tp} GPUs, one process each"}, {tp: emulated})
    for m in MS:
        run.set_floor(tp, HIDDEN, "bf16", m, 0.01 * m)
        for path in ("fused_1stage", "fused_2stage", "fused_auto", "unfused_ours", "nccl_torch", "fallback"):
            base = model_us(path, m)
            # every rank's replays a little above the model; the slowest rank defines the point
            times = tuple(tuple(base * (1 + 0.002 * r + 0.01 * rng.random()) for _ in range(replays))
                          for r in range(ranks))
            run.add(Point(tp, HIDDEN, "bf16", m, path, 2000, times))
    run.skip(tp, "flashinfer", "flashinfer is not importable here")
    return run


def test_statistics_are_min_per_rank_then_max_across_ranks():
    p = Point(2, 4096, "bf16", 1, "fused_auto", 10, ((3.0, 1.0, 2.0), (4.0, 2.5, 9.0)))
    assert p.best_us == 2.5 and p.median_us == 4.0 and p.per_replay_us == [4.0, 2.5, 9.0]
    assert p.nbytes == 4096 * 2
    with pytest.raises(ValueError, match="no replay times"):
        Point(2, 4096, "bf16", 1, "fused_auto", 10, ((),))


def test_crossovers_found_where_planted_and_noise_below_a_loss_ignored():
    (found,) = report.crossovers(synthetic_run())
    assert (found.two_stage_from_m, found.fallback_from_m) == (64, 512)
    rule = found.rule(2)
    assert rule == SizeRule(one_stage_max_bytes=32 * HIDDEN * 2, fallback_min_bytes=512 * HIDDEN * 2)
    # a single early win followed by losses is not a crossover
    assert report.first_winning_m([1, 2, 4, 8], {1: 5, 2: 5, 4: 5, 8: 5}, {1: 4, 2: 6, 4: 4, 8: 4}) == 4
    assert report.first_winning_m([1, 2], {1: 5, 2: 5}, {1: 4, 2: 6}) is None


def test_crossover_edges_never_always_and_unmeasured():
    run = Run("x", modes={2: "m"}, emulated={2: True})
    for m in (1, 8, 64):
        for path, t in (("fused_1stage", 1.0), ("fused_2stage", 2.0)):
            run.add(Point(2, 1024, "fp16", m, path, 10, ((t,),)))
    (found,) = report.crossovers(run)
    assert found.two_stage_from_m is None and not found.fallback_measured
    assert found.rule(2) == SizeRule(one_stage_max_bytes=64 * 1024 * 2, fallback_min_bytes=None)
    run2 = Run("x", modes={2: "m"})
    for m in (1, 8):
        for path, t in (("fused_1stage", 3.0), ("fused_2stage", 2.0)):
            run2.add(Point(2, 1024, "fp16", m, path, 10, ((t,),)))
    assert report.crossovers(run2)[0].rule(2).one_stage_max_bytes == 0


def test_markdown_has_the_seed_shape_and_names_emulation_and_skips():
    text = report.markdown(synthetic_run(emulated=True), 8)
    assert "**Single-GPU emulation**" in text
    header = next(line for line in text.splitlines() if "base_us" in line)
    assert header.startswith("| m | nccl_torch base_us | fused_auto opt_us | speedup | unfused_ours base_us")
    assert "fused_1stage base_us | fused_2stage opt_us | speedup |" in header
    row = next(line for line in text.splitlines() if line.startswith("| 1 | 0.01 |"))
    assert row.split(" | ")[2].startswith("5.")  # fused_1stage at m=1: the model's 5.12 plus rank noise
    assert "`flashinfer`: flashinfer is not importable here" in text
    assert text.count("| 1024 |") == 2  # the times table and the pairs table


def test_write_all_outputs_every_file_with_every_raw_number(tmp_path):
    run = synthetic_run(replays=4, ranks=8)
    files = report.write_all(run, tmp_path)
    names = {f.name for f in files}
    assert {"results.json", "tp8.md", "summary.csv", "raw.csv", f"cdf_tp8_h{HIDDEN}_bf16.png"} <= names
    png = tmp_path / f"cdf_tp8_h{HIDDEN}_bf16.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    raw = list(csv.DictReader(open(tmp_path / "raw.csv")))
    assert len(raw) == len(run.points) * 8 * 4
    summary = list(csv.DictReader(open(tmp_path / "summary.csv")))
    assert len(summary) == len(run.points) and float(summary[0]["best_us"]) == pytest.approx(run.points[0].best_us, 1e-3)
    again = Run.load(tmp_path / "results.json")
    assert [p.per_rank_us for p in again.points] == [p.per_rank_us for p in run.points]
    assert again.skips == run.skips and again.environment == run.environment and again.emulated == run.emulated
    assert json.loads((tmp_path / "results.json").read_text())["points"][0]["best_us"] == run.points[0].best_us


def test_summary_fits_one_screen_and_names_crossovers():
    run = synthetic_run()
    text = report.summary(run, report.crossovers(run))
    assert "2stage beats 1stage from m=64" in text and "fallback beats the kernels from m=512" in text
    assert "fused_auto vs nccl_torch: m=1" in text and "skipped flashinfer" in text
    assert len(text.splitlines()) <= 25


def test_pairs_and_paths_are_known():
    assert all(b in BY_NAME and c in BY_NAME for b, c in PAIRS)
    assert "fused_chunked" not in DEFAULT_PATHS and parse_paths("fused_auto,fused_chunked")
    assert parse_paths("fused_auto,nccl_torch") == ["fused_auto", "nccl_torch"]
    with pytest.raises(ValueError, match="unknown path"):
        parse_paths("fused_auto,nvls")


# -- thresholds: file round trip, and what auto does with them ------------------------------------------
def test_thresholds_round_trip_and_bad_files_are_ignored(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("FUSED_AR_CACHE_DIR", str(tmp_path))
    run = synthetic_run()
    written = thresholds.write(report.thresholds_for(run, "sm_90", 8))
    assert written == tmp_path / "thresholds" / "sm_90-tp8.json"
    loaded = thresholds.load("sm_90", 8)
    assert loaded.rule(DType.BF16, HIDDEN) == SizeRule(32 * HIDDEN * 2, 512 * HIDDEN * 2)
    assert loaded.rule(DType.BF16, 8192) == SizeRule() and loaded.source == run.command
    assert thresholds.load("sm_90", 4) is None
    for bad in ("{torn", json.dumps({"version": 99}), json.dumps(dict(loaded.to_dict(), ngpus=4)),
                json.dumps(dict(loaded.to_dict(), rules={"bf16:4096": {"one_stage_max_bytes": -5}}))):
        written.write_text(bad)
        with caplog.at_level(logging.WARNING, logger="fused_ar"):
            assert thresholds.load("sm_90", 8) is None
        assert "built-in thresholds serve" in caplog.text
        caplog.clear()


def test_auto_follows_stored_thresholds_and_the_environment_overrides(monkeypatch):
    monkeypatch.delenv("FUSED_AR_1STAGE", raising=False)
    rule = SizeRule(one_stage_max_bytes=64 * 1024, fallback_min_bytes=4 << 20)

    def auto(nbytes, **kw):
        return choose_path("auto", Platform.CUDA, 8, nbytes, rule=rule, **kw)[0]
    assert auto(64 * 1024) is Path.ONE_STAGE and auto(64 * 1024 + 16) is Path.TWO_STAGE
    assert auto(4 << 20) is Path.FALLBACK and auto((4 << 20) - 16) is Path.TWO_STAGE
    assert auto(4 << 20, can_fall_back=False) is Path.TWO_STAGE  # a local group: no collective
    why = choose_path("auto", Platform.CUDA, 8, 8 << 20, rule=rule)[1]
    assert "faster through the collective" in why and str(4 << 20) in why
    # forced kernels ignore the measured fallback size
    assert choose_path("2stage", Platform.CUDA, 8, 8 << 20, rule=rule)[0] is Path.TWO_STAGE
    # a call in chunks: the kernel follows one launch's bytes, the measured fallback size the whole call's
    assert auto(1 << 20, launch_bytes=64 * 1024) is Path.ONE_STAGE and auto(4 << 20, launch_bytes=1024) is Path.FALLBACK
    # without a rule, the built-in table and no size fallback
    assert one_stage_max_bytes(Platform.CUDA, 8) == 512 * 1024 and fallback_min_bytes() is None
    monkeypatch.setenv("FUSED_AR_1STAGE_MAX_BYTES", "1024")
    assert one_stage_max_bytes(Platform.CUDA, 8, rule) == 1024
    monkeypatch.setenv("FUSED_AR_FALLBACK_MIN_BYTES", "0")
    assert fallback_min_bytes(rule) is None and auto(8 << 20) is Path.TWO_STAGE
    monkeypatch.setenv("FUSED_AR_FALLBACK_MIN_BYTES", "2048")
    assert auto(2048) is Path.FALLBACK
    monkeypatch.setenv("FUSED_AR_1STAGE", "1")  # names a kernel: no size fallback
    assert auto(8 << 20) is Path.ONE_STAGE


# -- the command line -------------------------------------------------------------------------------------
def test_size_lists_and_ranges():
    assert _sizes("1..1024") == list(MS)
    assert _sizes("64..256:64,3,3") == [3, 64, 128, 192, 256]
    for bad in ("0..4", "8..4", "1..8:0", "x", ","):
        with pytest.raises(ValueError):
            _sizes(bad)


def test_bench_arguments_and_plan():
    args = build_parser().parse_args(["bench", "--tp", "2,8", "--m", "1..8", "--paths", "fused_auto,nccl_torch",
                                      "--graph-calls", "100", "--replays", "5"])
    assert (args.what, args.tp, args.m, args.paths, args.graph_calls) == (
        "allreduce_rmsnorm", [2, 8], [1, 2, 4, 8], ["fused_auto", "nccl_torch"], 100)
    assert build_parser().parse_args(["bench", "add_rmsnorm"]).what == "add_rmsnorm"
    sweep = Sweep((2, 4, 8), (1,), (4096,), ("bf16",), ("fused_auto",), 10, 2, "cmd")
    assert plan(sweep, 1, False) == {2: True, 4: True, 8: True}
    assert plan(sweep, 4, False) == {2: False, 4: False, 8: None}
    assert plan(sweep, 8, True) == {2: True, 4: True, 8: True}
    with pytest.raises(InputError, match="--graph-calls 0"):
        Sweep((2,), (1,), (4096,), ("bf16",), ("fused_auto",), 0, 2, "cmd").check()
    with pytest.raises(InputError, match=r"\[0\]"):
        Sweep((2,), (0,), (4096,), ("bf16",), ("fused_auto",), 10, 2, "cmd").check()


def test_bench_without_a_gpu_says_so(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    from fused_ar.cli import main

    assert main(["bench", "--tp", "2", "--m", "1", "--hidden", "4096", "--out", "unused"]) == 2
    assert "needs a GPU" in capsys.readouterr().err


def test_probe_without_a_gpu_says_so_in_one_line(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    from fused_ar.cli import main

    assert main(["probe", "0", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fused_ar: error: python -m fused_ar probe needs a GPU") and err.count("\n") == 1


@pytest.mark.parametrize("argv, option, what", [
    (["bench", "--profile"], "--profile", "allreduce_rmsnorm"),
    (["bench", "host", "--variants"], "--variants", "host"),
    (["bench", "fp8", "--sweep-blocks"], "--sweep-blocks", "fp8"),
    (["bench", "host", "--peers", "none"], "--peers", "host")])
def test_an_option_of_another_bench_is_refused(argv, option, what, capsys):
    from fused_ar.cli import main

    with pytest.raises(SystemExit) as exit_:  # before anything needs a GPU
        main(argv)
    assert exit_.value.code == 2
    assert f"{option} with bench {what}: only bench" in capsys.readouterr().err


def test_bench_fp8_refuses_more_graph_calls_than_a_communicator_holds(capsys):
    from fused_ar.cli import main
    from fused_ar.comm.ipc import GRAPH_TABLES

    assert main(["bench", "fp8", "--graph-calls", str(GRAPH_TABLES // 3 + 1)]) == 2  # before anything needs a GPU
    err = capsys.readouterr().err
    assert f"--graph-calls {GRAPH_TABLES // 3 + 1}: bench fp8 captures 3 graphs" in err
    assert f"at most {GRAPH_TABLES // 3}" in err


def test_thresholds_key_is_dtype_and_hidden():
    t = Thresholds("gfx942", 4, {Thresholds.key("bfloat16", 7168): SizeRule(1, 2)})
    assert t.rule(DType.BF16, 7168) == SizeRule(1, 2) and t.rule(DType.FP16, 7168) == SizeRule()


def test_a_check_failing_on_one_rank_raises_on_every_rank():
    from fused_ar.bench.steps import BenchError
    from fused_ar.bench.sweep import _agreed_check

    class OtherRankFailed:  # what Group.agree returns when rank 1's check failed and this one's passed
        def agree(self, reason):
            return reason or "rank 1: residual_out differs"

    with pytest.raises(BenchError, match="rank 1: residual_out differs"):
        _agreed_check(OtherRankFailed(), lambda: None)

    class AllPassed:
        def agree(self, reason):
            return reason

    _agreed_check(AllPassed(), lambda: None)
    with pytest.raises(BenchError, match="mine"):
        _agreed_check(AllPassed(), lambda: (_ for _ in ()).throw(BenchError("mine")))


def test_communicator_size_rule_is_the_stored_rule_of_the_shape(monkeypatch):
    import fused_ar.comm.communicator as communicator

    monkeypatch.setattr(communicator, "current_runtime", lambda: None)  # no device is touched
    comm = communicator.Communicator.__new__(communicator.Communicator)
    comm._init_fields(0, 2, 0, 1 << 20)
    assert comm.size_rule(DType.BF16, 7168) == SizeRule()  # no thresholds file: the built-in table
    comm = communicator.Communicator.__new__(communicator.Communicator)
    comm._init_fields(0, 2, 0, 1 << 20)
    comm._thresholds = Thresholds("sm_90", 2, {Thresholds.key("bfloat16", 7168): SizeRule(1, 2)})
    for _ in range(2):  # the second lookup comes from the per-shape memo
        assert comm.size_rule(DType.BF16, 7168) == SizeRule(1, 2)
        assert comm.size_rule(DType.FP16, 7168) == SizeRule() and comm.size_rule(DType.BF16, 4096) == SizeRule()


def test_publish_prints_and_writes_each_file(tmp_path, capsys):
    from fused_ar.bench.results import publish

    publish("| a |\n", None, "x", {"k": 1})
    assert capsys.readouterr().out == "| a |\n\n" and not list(tmp_path.iterdir())
    publish("| a |\n", str(tmp_path / "out"), "x", {"k": 1}, **{"x.csv": "k\n1\n"})
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["x.csv", "x.json", "x.md"]
    assert json.loads((tmp_path / "out" / "x.json").read_text()) == {"k": 1}


def test_peers_missing_here_are_rows_that_say_so_and_torch_ones_run():
    """No FlashInfer or Liger on this machine: their rows say "not installed"; torch eager and torch.compile
    compute add + RMSNorm (and its FP8 form) on the CPU, and the table prints every row."""
    import torch

    from fused_ar.bench.add_rmsnorm import _peer_table, _reference
    from fused_ar.bench.peers import fp8_peers, t_peers

    peers = {p.name: p for p in t_peers(torch)}
    assert set(peers) == {"FlashInfer fused_add_rmsnorm, PDL on", "FlashInfer fused_add_rmsnorm, PDL off",
                          "Liger fused add + RMSNorm", "torch.compile", "torch eager"}
    for name in ("FlashInfer fused_add_rmsnorm, PDL on", "Liger fused add + RMSNorm"):
        assert peers[name].make is None and peers[name].missing.startswith("not installed (ModuleNotFoundError")
    x, r = torch.randn(4, 64), torch.randn(4, 64)
    w = torch.rand(64) + 0.5
    ref = _reference(torch, x, r, w, 1e-6)
    out, ro = peers["torch eager"].make()(x, r, w, 1e-6)
    assert torch.equal(ro, x + r) and (out.double() - ref).abs().max() < 1e-5
    scale = torch.tensor([0.05])
    for mode, group in (("static", None), ("token", None), ("group", 16)):
        fp8 = {p.name: p for p in fp8_peers(torch, mode, group, scale, torch.float8_e4m3fn, 448.0)}
        assert ("FlashInfer fused_add_rmsnorm_quant, PDL on" in fp8) == (mode == "static")
        q, ro, s = fp8["torch eager"].make()(x, r, w, 1e-6)
        assert q.dtype == torch.float8_e4m3fn and torch.equal(ro, x + r)
        assert s.shape == {"static": (), "token": (4, 1), "group": (4, 4)}[mode]
    rows = [{"m": 4, "n": 64, "impl": "fused_ar", "note": "", "us": 2.0, "vs_ours": 1.0, "TBps": 0.5, "max_err": 0.01},
            {"m": 4, "n": 64, "impl": "Liger fused add + RMSNorm", "note": peers["Liger fused add + RMSNorm"].missing}]
    table = _peer_table(rows, 4e12, {(4, 64): 0.25})
    assert table[2].startswith("| 4 x 64 | copy floor | 0.25 |") and "| 2.00 | 1.00 | 0.50 | 0.01 |" in table[3]
    assert "not installed" in table[4]


def test_block_sweep_passes_every_kernel_parameter(monkeypatch):
    """bench add_rmsnorm --sweep-blocks launches its kernels directly: the arguments it builds must be the
    kernel's C parameters, all of them, typed (packed as a launch packs them), whatever parameters the
    kernel gains. CPU tensors stand in for the GPU's; the stand-in launch writes out as the kernel would."""
    import torch

    from fused_ar.bench import add_rmsnorm as bench
    from fused_ar.device import launch as launch_module
    from fused_ar.jit.kernels import kernel_def
    from fused_ar.jit.runtime import pack_args
    from fused_ar.jit.spec import BLOCK_SIZES, KernelSpec

    made: dict[int, torch.Tensor] = {}

    class CpuTorch:
        """torch, with tensors asked of "cuda" made on the CPU (and remembered by address)."""

        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def randn(*shape, device=None, dtype=None):
            return torch.randn(*shape, dtype=dtype)

        @staticmethod
        def empty_like(t):
            out = torch.empty_like(t)
            made[out.data_ptr()] = out
            return out

    launched = []

    def launch(spec, device, grid, args):
        pack_args(kernel_def(spec.op), args)  # raises on a missing, extra or mistyped argument
        named = dict(zip((name for name, _ in kernel_def(spec.op).params), args))
        made[named["out"]].zero_()
        launched.append((spec.block, grid, named))

    monkeypatch.setattr(launch_module, "spec_for", lambda op, dtype, device, block, **kw: KernelSpec(
        op, dtype, "sm_90", block=block, **kw))
    monkeypatch.setattr(launch_module, "launch", launch)
    monkeypatch.setattr(bench, "_graph_time_us", lambda torch, fn: (fn(), 1.0)[1])
    results = bench._block_sweep(CpuTorch(), torch.bfloat16, 1e-6, [64, 2560])
    # n = 2560 (320 packs): the policy's 192 threads, between the powers of two, swept beside them
    assert [block for _, n, block, _ in results if n == 64] == list(BLOCK_SIZES) * 5
    assert [block for _, n, block, _ in results if n == 2560] == sorted(BLOCK_SIZES + (192,)) * 5
    assert len(launched) == 2 * len(results)  # the checked launch, then the timed one
    for _, _, named in launched:
        assert named["cols"] in (64, 2560) and named["scales"] == 0 and named["global_scale"] == 0
    table = bench.sweep_table(results, 2)
    assert table[2] == "| m | n | " + " | ".join(f"block {b}" for b in sorted(BLOCK_SIZES + (192,))) + " |"
    assert table[4] == "| 1 | 64 | 1.00* | 1.00 |  | 1.00 | 1.00 | 1.00 |"  # 192 not swept at n = 64
    assert "| 1 | 2560 | 1.00 | 1.00 | 1.00* | 1.00 | 1.00 | 1.00 |" in table


@pytest.mark.parametrize("text", ["foo", "liger,,eager", "", "all,liger", "FlashInfer"])
def test_bench_peers_option_names_its_choices(text, capsys):
    from fused_ar.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["bench", "add_rmsnorm", "--peers", text])
    assert exit_.value.code == 2
    assert f"peers {text!r}: must be all, none or a comma-separated list of flashinfer, liger, compile, eager" in \
        capsys.readouterr().err


def test_bench_peers_selects_rows_by_kind():
    """--peers keeps exactly the chosen peers' rows (installed or not), in the bench's order, for T and FP8."""
    import torch

    from fused_ar.bench.peers import fp8_peers, parse_peers, selected, t_peers

    names = [p.name for p in t_peers(torch)]
    assert [p.name for p in selected(t_peers(torch), parse_peers("all"))] == names
    assert selected(t_peers(torch), parse_peers("none")) == []
    assert [p.name for p in selected(t_peers(torch), parse_peers("eager,liger"))] == \
        ["Liger fused add + RMSNorm", "torch eager"]
    assert [p.name for p in selected(t_peers(torch), parse_peers("flashinfer"))] == \
        ["FlashInfer fused_add_rmsnorm, PDL on", "FlashInfer fused_add_rmsnorm, PDL off"]
    static = fp8_peers(torch, "static", None, torch.ones(1), torch.float8_e4m3fn, 448.0)
    assert [p.name for p in selected(static, parse_peers("compile"))] == ["torch.compile"]
    assert parse_peers("liger,liger") == ("liger",)


def test_dispatch_floor_takes_each_torch_op_call_and_returns_its_arity():
    """bench host's floor under the torch.ops rows: every torch.ops.fused_ar schema, a kernel that returns
    tensors of the op's arity at once; each row's call (the same arguments as the real op's row) goes through
    it, and the rows pair each op with its floor."""
    import torch

    import fused_ar.torch_ops  # noqa: F401  (defines torch.ops.fused_ar.*)
    from fused_ar.bench.host import FLOOR_LIBRARY, dispatch_floor_ops, torch_op_calls, torch_op_rows
    from fused_ar.torch_ops import SCHEMAS

    floor = dispatch_floor_ops(torch, "CPU")
    assert floor is dispatch_floor_ops(torch, "CPU")  # defined once
    with pytest.raises(ValueError, match="defined for CPU"):
        dispatch_floor_ops(torch, "CUDA")
    x = torch.randn(4, 64)
    for (op, _), call in torch_op_calls(floor, x, x, x[0], 1e-6, torch.tensor([0.5]), torch.float8_e4m3fn, 7).items():
        got, arity = call(), SCHEMAS[op].rpartition("->")[2].count("Tensor")
        assert isinstance(got, torch.Tensor) if arity == 1 else len(got) == arity, op
    assert floor.add_rmsnorm_(x, x, None, 1e-6) is None and str(floor.all_gather.default._schema).startswith(
        f"{FLOOR_LIBRARY}::all_gather(Tensor x, int comm, int rows)")
    local = [name for name, _, _ in torch_op_rows(torch, floor, local=True)]
    assert local == ["`torch.ops.fused_ar.add_rmsnorm`", "`torch.ops` dispatch alone: `add_rmsnorm`'s call",
                     "`torch.ops.fused_ar.add_rmsnorm_fp8`, static scale",
                     "`torch.ops` dispatch alone: `add_rmsnorm_fp8`'s call, static scale"]
    ranks = torch_op_rows(torch, floor, local=False)
    assert [ns for _, ns, _ in ranks] == [torch.ops.fused_ar, floor] * 3
    assert [key[0] for _, _, key in ranks] == \
        ["allreduce_rmsnorm"] * 2 + ["allreduce"] * 2 + ["allreduce_rmsnorm_fp8"] * 2


def test_add_rmsnorm_report_written_as_the_run_goes(tmp_path, capsys):
    """bench add_rmsnorm rewrites its table into --out after each shape (quietly), saying how many shapes are still
    to come, so a run a time limit stops leaves what it timed; the last write is the whole table, printed."""
    from fused_ar.bench.add_rmsnorm import report
    from fused_ar.bench.results import publish
    from fused_ar.jit.spec import DType

    # as the command line hands it over (cli.py)
    args = argparse.Namespace(dtype=DType.BF16, hidden=[4096], m=[1, 16], out=str(tmp_path), sweep_blocks=False,
                              variants=False, fp8=True, peers=("flashinfer",))
    meta = {"gpu": "GPU", "torch": "2.x", "copy_bw": 4e12, "cost": {"cold_s": 1.0, "cached_s": 0.001},
            "peers": ("flashinfer",)}
    row = {"m": 1, "n": 4096, "impl": "fused_ar", "us": 2.0, "vs_ours": 1.0, "TBps": 1.0, "max_err": 0.01, "note": ""}
    static = {**row, "mode": "static", "us": 2.2}
    text, data = report(args, meta, [row], {(1, 4096): 1.5}, [static], {("static", 1, 4096): 1.6}, [], [], pending=13)
    publish(text, args.out, "add_rmsnorm", data, echo=False)
    assert capsys.readouterr().out == ""
    written = (tmp_path / "add_rmsnorm.md").read_text()
    assert "Incomplete: 13 more shapes" in written and "| 1 x 4096 | fused_ar | 2.00 |" in written
    assert "static scales" in written and "token scales" not in written  # a mode not reached has no table yet
    assert json.loads((tmp_path / "add_rmsnorm.json").read_text())["pending_shapes"] == 13
    text, data = report(args, meta, [row], {(1, 4096): 1.5}, [static], {("static", 1, 4096): 1.6}, [], [])
    publish(text, args.out, "add_rmsnorm", data)
    assert "Incomplete" not in capsys.readouterr().out and json.loads(
        (tmp_path / "add_rmsnorm.json").read_text())["complete"] is True
    assert "--peers flashinfer" in (tmp_path / "add_rmsnorm.md").read_text()

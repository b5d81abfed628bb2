"""The fallback's selection rules and their log line, the peer-access verdict cache, the error report's
decoding, and the torch custom ops' fake implementations under torch.compile (no GPU)."""

from __future__ import annotations

import ctypes
import json
import logging
import multiprocessing as mp

import pytest
import torch

from fused_ar.errors import FusedArError, InputError, MismatchError, PeerTimeoutError
from fused_ar.jit.kernels import CROSS_GPU_NGPUS, ERROR_MISMATCH, ERROR_TIMEOUT, ERROR_UNREGISTERED, REPORT_WORDS
from fused_ar.comm.policy import FallbackLog, Path, choose_path, group_fallback_reason
from fused_ar.jit.verdicts import remembered
from fused_ar.comm.report import describe_call, pending_exception
from fused_ar.jit.spec import DType, Op, Platform
from fused_ar.device.validate import check_rmsnorm_inputs, cross_gpu_limit

MAX = 1 << 20


# -- which calls take the fallback, and why ---------------------------------------------------------------
def test_group_rules_node_span_size_and_probe():
    assert group_fallback_reason(["a", "a"], 2, CROSS_GPU_NGPUS) is None
    assert "spans 2 nodes (a, b)" in group_fallback_reason(["a", "b", "a", "b"], 4, CROSS_GPU_NGPUS)
    assert "a group of 9 ranks" in group_fallback_reason(["a"] * 9, 9, CROSS_GPU_NGPUS)
    probes = [(True, "fine"), (False, "GPU 1 read GPU 0's memory through IPC and the bytes differ")]
    why = group_fallback_reason(["a", "a"], 2, CROSS_GPU_NGPUS, probes)
    assert why.startswith("peer access does not work on rank 1's GPUs") and "bytes differ" in why


@pytest.mark.parametrize("path", ["auto", "1stage", "2stage"])
def test_call_rules_size_shape_group_and_request(path):
    kept, why = choose_path(path, Platform.CUDA, 8, MAX, MAX)
    assert why is None and kept is not Path.FALLBACK
    # over the buffer: chunks, the kernel chosen by the bytes of one launch
    assert choose_path(path, Platform.CUDA, 8, 100 * MAX, MAX) == (kept, None)
    if path == "auto":
        assert choose_path(path, Platform.CUDA, 8, 100 * MAX, 64) == (Path.ONE_STAGE, None)
    assert choose_path(path, Platform.CUDA, 8, 64, MAX, unsupported="n=1004 ...") == (Path.FALLBACK, "n=1004 ...")
    assert choose_path(path, Platform.CUDA, 8, 64, MAX, group_reason="spans 2 nodes") == (Path.FALLBACK,
                                                                                           "spans 2 nodes")
    assert choose_path("fallback", Platform.CUDA, 8, 64, MAX) == (Path.FALLBACK, "path='fallback' was asked for")
    with pytest.raises(InputError, match="path='3stage'"):
        choose_path("3stage", Platform.CUDA, 8, 64, MAX)


def test_what_the_cross_gpu_kernels_take_is_named_and_valid_input_still_checked():
    x = torch.randn(3, 1004, dtype=torch.bfloat16)  # 1004 bf16 is not whole 16-byte packs
    residual, weight = torch.randn_like(x), torch.rand(1004, dtype=torch.bfloat16)
    call = check_rmsnorm_inputs(x, residual, weight, 1e-6)
    assert (call.x.rows, call.x.cols, call.eps, call.residual_stride) == (3, 1004, 1e-6, 1004)
    assert "n=1004: the cross-GPU kernels take a multiple of 8 for bf16" in cross_gpu_limit(1004, DType.BF16, {})
    with pytest.raises(InputError, match="weight has shape"):  # the fallback never hides bad input
        check_rmsnorm_inputs(x, residual, weight[:1003], 1e-6)
    with pytest.raises(InputError, match="eps=-1.0"):
        check_rmsnorm_inputs(x, residual, weight, -1.0)
    odd = torch.randn(4 * 64 + 1, dtype=torch.float32)[1:].view(4, 64)
    assert "16-byte aligned" in cross_gpu_limit(64, DType.FP32, {"residual": odd})
    assert cross_gpu_limit(64, DType.FP32, {"out": torch.randn(4, 128)[:, :64]}) is None  # rows 512 bytes apart
    assert "stride 130" in cross_gpu_limit(64, DType.FP32, {"out": torch.randn(4, 130)[:, :64]})


def test_each_reason_is_logged_once(caplog):
    log = FallbackLog(rank=3)
    with caplog.at_level(logging.WARNING, logger="fused_ar"):
        for _ in range(5):
            log.note("x has 99 bytes, over this communicator's max_bytes=16")
        log.note("path='fallback' was asked for")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["fused_ar: rank 3 takes the fallback (torch.distributed all_reduce + fused_ar add_rmsnorm): "
                     "x has 99 bytes, over this communicator's max_bytes=16",
                     "fused_ar: rank 3 takes the fallback (torch.distributed all_reduce + fused_ar add_rmsnorm): "
                     "path='fallback' was asked for"]


# -- the peer-access verdict, probed once per key ---------------------------------------------------------
def _probe_in_child(cache, locks, counter, out):
    import os

    os.environ.update(FUSED_AR_CACHE_DIR=cache, FUSED_AR_LOCK_DIR=locks)

    def probe():
        with open(counter, "a") as f:
            f.write("x")
        return True, "probed"

    out.put(remembered("k1", probe))


def test_verdict_probed_once_across_racing_processes(tmp_path, monkeypatch):
    cache, locks, counter = tmp_path / "cache", tmp_path / "locks", tmp_path / "count"
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_probe_in_child, args=(str(cache), str(locks), str(counter), out)) for _ in range(4)]
    for p in procs:
        p.start()
    verdicts = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
    assert counter.read_text() == "x", "the probe ran more than once"
    assert all(ok for ok, _ in verdicts) and sum("probed earlier" in d for _, d in verdicts) == 3
    monkeypatch.setenv("FUSED_AR_CACHE_DIR", str(cache))
    monkeypatch.setenv("FUSED_AR_LOCK_DIR", str(locks))
    stored = cache / "probes" / "peer_access-k1.json"
    assert json.loads(stored.read_text())["ok"] is True
    stored.write_text("{not json")  # a torn file is probed again, not trusted
    assert remembered("k1", lambda: (False, "broken now")) == (False, "broken now")
    assert remembered("k1", lambda: pytest.fail("probed again"))[0] is False


# -- decoding what the kernels recorded --------------------------------------------------------------------
def _report(words):
    buf = (ctypes.c_uint32 * REPORT_WORDS)(*words)
    return buf, ctypes.addressof(buf)


def _desc(op, dtype, grid, rows, cols):
    return [op.code | dtype.code << 8 | grid << 16, rows, cols]


def test_no_error_reads_as_none():
    buf, ptr = _report([0] * REPORT_WORDS)
    assert pending_exception(ptr, 0, 30.0) is None


def test_timeout_names_the_missing_ranks():
    code = ERROR_TIMEOUT | 5 << 12 | 2 << 8 | 3  # block 5, end barrier, rank 3
    mine = _desc(Op.ALLREDUCE_RMSNORM_1STAGE, DType.BF16, 8, 8, 4096)
    buf, ptr = _report([code, 1 << 3 | 1 << 6, *mine, 0, 0, 0, 1])
    exc = pending_exception(ptr, 0, 2.0)
    assert isinstance(exc, PeerTimeoutError) and exc.ranks == (3, 6)
    assert "rank(s) [3, 6] did not arrive within FUSED_AR_TIMEOUT_S=2 s" in str(exc)
    assert "block 5 timed out at the end barrier waiting for rank 3" in str(exc)
    assert "allreduce_rmsnorm_1stage(m=8, n=4096, bf16, grid 8)" in str(exc)


def test_mismatch_names_both_calls():
    mine = _desc(Op.ALLREDUCE_RMSNORM_2STAGE, DType.FP16, 4, 4, 8192)
    theirs = _desc(Op.ALLREDUCE_RMSNORM_2STAGE, DType.FP16, 8, 8, 8192)
    buf, ptr = _report([ERROR_MISMATCH | 1, 0, *mine, *theirs, 1])
    exc = pending_exception(ptr, 0, 30.0)
    assert isinstance(exc, MismatchError) and exc.peer == 1
    assert exc.mine == "allreduce_rmsnorm_2stage(m=4, n=8192, fp16, grid 4)"
    assert exc.theirs == "allreduce_rmsnorm_2stage(m=8, n=8192, fp16, grid 8)"
    assert describe_call(tuple(theirs)) in str(exc) and "rank 0 called" in str(exc)


def test_unregistered_graph_replay():
    buf, ptr = _report([ERROR_UNREGISTERED, 0, 0, 0, 0, 0, 0, 0, 1])
    exc = pending_exception(ptr, 1, 30.0)
    assert type(exc) is FusedArError and "register_graph_buffers" in str(exc)


# -- the custom ops' fake implementations under torch.compile ---------------------------------------------
def test_custom_ops_trace_with_fake_tensors_under_torch_compile():
    import fused_ar.torch_ops  # noqa: F401  (defines torch.ops.fused_ar.*)
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    seen = {}

    def backend(gm, example_inputs):
        FakeTensorProp(gm).propagate(*example_inputs)  # runs the fake implementations
        seen["targets"] = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
        outs = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
        seen["shapes"] = [tuple(o.meta["val"].shape) for o in outs]
        return lambda *args: tuple(torch.zeros(s) for s in seen["shapes"])

    def layer(x, residual, w, norm):
        partial = x @ w
        out, ro = torch.ops.fused_ar.allreduce_rmsnorm(partial, residual, norm, 1e-6, 7, "auto")
        y = torch.ops.fused_ar.allreduce(out, 7, "auto")
        return torch.ops.fused_ar.add_rmsnorm(y, ro, norm, 1e-6)

    compiled = torch.compile(layer, fullgraph=True, backend=backend)
    x, w = torch.randn(5, 64), torch.randn(64, 128)
    compiled(x, torch.randn(5, 128), w, torch.ones(128))
    assert sum("fused_ar" in t for t in seen["targets"]) == 3, seen["targets"]
    assert seen["shapes"] == [(5, 128), (5, 128)]


@pytest.mark.parametrize("rank, rows", [(0, 3), (2, 3), (3, 2)])
def test_sequence_parallel_ops_trace_with_this_ranks_rows(rank, rows):
    """reduce_scatter_rmsnorm's fake gives this rank's shard of x's 11 rows over 4 ranks (3, 3, 3, 2 rows:
    ceil(11 / 4) each, the last one shorter), all_gather's the rows asked for; m stays symbolic."""
    import fused_ar.torch_ops  # noqa: F401
    from types import SimpleNamespace

    from fused_ar.comm import registry
    from fused_ar.comm.sequence import shard_bounds
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    lo, hi = shard_bounds(11, 4, rank)
    assert [shard_bounds(11, 4, r) for r in range(4)] == [(0, 3), (3, 6), (6, 9), (9, 11)]
    assert shard_bounds(2, 4, 3) == (2, 2)  # fewer rows than ranks: the last shards are empty
    stub = SimpleNamespace(handle=990000 + rank, world_size=4, rank=rank)
    registry.register(stub)
    seen = {}

    def backend(gm, example_inputs):
        FakeTensorProp(gm).propagate(*example_inputs)
        outs = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
        seen["shapes"] = [tuple(int(d) for d in o.meta["val"].shape) for o in outs]
        seen["dtypes"] = [o.meta["val"].dtype for o in outs]
        return lambda *args: tuple(torch.zeros(s) for s in seen["shapes"])

    def layer(x, residual, norm):
        out, ro = torch.ops.fused_ar.reduce_scatter_rmsnorm(x, residual, norm, 1e-6, stub.handle)
        q, _, scales = torch.ops.fused_ar.reduce_scatter_rmsnorm_fp8(x, residual, norm, 1e-6, stub.handle, 0.0, None,
                                                                     64, torch.float8_e4m3fn)
        return out, ro, q, scales, torch.ops.fused_ar.all_gather(out, stub.handle, 11)

    try:
        compiled = torch.compile(layer, fullgraph=True, backend=backend)
        compiled(torch.randn(11, 128), torch.randn(hi - lo, 128), torch.ones(128))
    finally:
        registry.unregister(stub)
    assert seen["shapes"] == [(rows, 128), (rows, 128), (rows, 128), (rows, 2), (11, 128)]
    assert seen["dtypes"][2] == torch.float8_e4m3fn


def test_custom_op_names_an_unknown_communicator():
    from fused_ar.torch_ops import lookup

    with pytest.raises(InputError, match="comm=424242: no open fused_ar Communicator"):
        lookup(424242)

"""The engine adapters called the way vLLM and SGLang call them, on the GPU, with N processes sharing it
through real IPC (N = 2 and 4; gloo groups, as the engines pass): should_custom_ar / custom_all_reduce
eager, inside the engine's capture context (warm-up, then a CUDA graph, registered on exit), with graph
inputs copied instead of registered, and declining above the limit; the fused methods and the op the vLLM
fusion pass places; each result bit for bit what fused_ar's own Communicator gives. The engines are not
installed on the GPU machine: the one vLLM call the vLLM adapter makes to learn the topology is answered
as vLLM answers it for ranks sharing one GPU. Then the batch-invariance guarantee: a row's bits do not
depend on the batch around it, its size, or the path."""

from __future__ import annotations

import pytest
import torch

from fused_ar import Communicator, add_rmsnorm, add_rmsnorm_fp4, add_rmsnorm_fp8
from tests.gpu.test_communicator_gpu import emulated_group, make_inputs, run_ranks, spawn_ranks
from tests.reference import allreduce_reference, assert_rmsnorm_matches

pytestmark = pytest.mark.gpu

MAX = 1 << 20
SHAPES = [(1, 4096), (3, 2880), (16, 8192), (48, 4096)]  # all under MAX in fp32 too


def _adapter(engine, group, invariant=False, register=True):
    if engine == "vllm":
        import fused_ar.integrations.vllm as vllm_adapter

        # vLLM's answer for ranks on one GPU: connected; the size cap and batch-invariant flag as given
        vllm_adapter.vllm_facts = lambda g, d, symm, max_size: (max_size, True, invariant)
        return vllm_adapter.VllmCustomAllreduce(group, 0, max_size=MAX, register_graph_buffers=register, name="tp:0")
    from fused_ar.integrations.sglang import SglangCustomAllreduce

    ca = SglangCustomAllreduce(group, 0, max_size=MAX, register_graph_buffers=register, name="tp:0")
    ca.any_size = invariant  # SGLang's deterministic mode is HIP-only; the behaviour is the same
    return ca


def _eager(ca, comm, rank, world):
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for m, n in SHAPES:
            xs, residual, weight = make_inputs(world, m, n, dtype, seed=m * 13 + n)
            x = xs[rank]
            assert ca.should_custom_ar(x), (dtype, m, n)
            got = ca.custom_all_reduce(x)
            assert torch.equal(got, comm.allreduce(x)) and torch.equal(got, allreduce_reference(xs))
            fused = ca.fused_allreduce_rmsnorm(x, residual, weight, 1e-6)
            ours = comm.allreduce_rmsnorm(x, residual, weight, 1e-6)
            assert torch.equal(fused[0], ours[0]) and torch.equal(fused[1], ours[1])
            assert_rmsnorm_matches(xs, residual, weight, 1e-6, *fused)
    # transposed (weakly contiguous) input: summed in storage order, returned in its layout
    xs, _, _ = make_inputs(world, 64, 256, torch.bfloat16, seed=7)
    xt = [x.t() for x in xs]
    assert ca.should_custom_ar(xt[rank])
    got = ca.custom_all_reduce(xt[rank])
    assert got.stride() == xt[rank].stride() and torch.equal(got, allreduce_reference(xt))


def _limit(ca, engine, rank, world):
    at = torch.randn(MAX // 2, device="cuda", dtype=torch.bfloat16)  # exactly max_size bytes
    over = torch.randn(MAX // 2 + 8, device="cuda", dtype=torch.bfloat16)
    assert ca.should_custom_ar(at) is (engine == "sglang")  # vLLM: nbytes < max_size; SGLang: <=
    assert not ca.should_custom_ar(over) and ca.custom_all_reduce(over) is None
    rows = torch.randn(MAX // 8192 + 1, 4096, device="cuda", dtype=torch.bfloat16)
    assert ca.fused_allreduce_rmsnorm(rows, rows, None, 1e-6) is None
    odd = torch.randn(4, 12, device="cuda", dtype=torch.bfloat16)  # 24-byte rows
    assert ca.fused_allreduce_rmsnorm(odd, odd, None, 1e-6) is None


def _graphs(ca, comm, engine, rank, world):
    n, dtype = 4096, torch.bfloat16
    xs, residual, weight = make_inputs(world, 16, n, dtype, seed=3)
    x = xs[rank]
    comm.allreduce(x)  # loads the kernels before capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with ca.capture(), torch.cuda.stream(stream):
        warm = ca.custom_all_reduce(x)  # the engine's warm-up inside its capture context: no communication
        assert warm.shape == x.shape
        if engine == "sglang":
            assert not warm.any()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = ca.custom_all_reduce(x)
            fused = ca.fused_allreduce_rmsnorm(x, residual, weight, 1e-6)
    torch.cuda.current_stream().wait_stream(stream)
    for rep in range(3):
        new, new_res, _ = make_inputs(world, 16, n, dtype, seed=100 + rep)
        x.copy_(new[rank])
        residual.copy_(new_res)
        for t in (out, *fused):
            t.fill_(float("nan"))
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        ca.comm.check()
        assert torch.equal(out, allreduce_reference(new))
        assert_rmsnorm_matches(new, new_res, weight, 1e-6, *fused)


def _any_size(ca, comm, rank, world):
    """The engines' deterministic mode: every size, in pieces through max_size, the same bits."""
    xs, residual, weight = make_inputs(world, 300, 4096, torch.bfloat16, seed=11)  # 2.3 MiB: 3 pieces
    assert ca.should_custom_ar(xs[rank])
    assert torch.equal(ca.custom_all_reduce(xs[rank]), allreduce_reference(xs))
    out, ro = ca.fused_allreduce_rmsnorm(xs[rank], residual, weight, 1e-6)
    assert_rmsnorm_matches(xs, residual, weight, 1e-6, out, ro)
    small = [x[:8] for x in xs]
    alone = ca.fused_allreduce_rmsnorm(small[rank], residual[:8], weight, 1e-6)
    assert torch.equal(alone[0], out[:8]) and torch.equal(alone[1], ro[:8]), "a row's bits depend on the batch"


def _vllm_ops(ca, comm, rank, world):
    import fused_ar.integrations.vllm_fusion  # noqa: F401  (defines the ops the fusion pass places)

    xs, residual, weight = make_inputs(world, 16, 4096, torch.bfloat16, seed=21)
    out, ro = torch.ops.fused_ar.vllm_allreduce_rmsnorm(xs[rank], residual, weight, 1e-6, "tp:0")
    ours = comm.allreduce_rmsnorm(xs[rank], residual, weight, 1e-6)
    assert torch.equal(out, ours[0]) and torch.equal(ro, ours[1])
    scale = torch.tensor([0.05], device="cuda")
    q, ro8 = torch.ops.fused_ar.vllm_allreduce_rmsnorm_fp8(xs[rank], residual, weight, 1e-6, "tp:0", scale, 0.0,
                                                         torch.float8_e4m3fn)
    q_ours, ro_ours, _ = comm.allreduce_rmsnorm_fp8(xs[rank], residual, weight, 1e-6, scale=scale,
                                                    fp8_dtype=torch.float8_e4m3fn)
    assert torch.equal(q.view(torch.uint8), q_ours.view(torch.uint8)) and torch.equal(ro8, ro_ours)


def _sglang_quant(ca, comm, rank, world):
    xs, residual, weight = make_inputs(world, 16, 4096, torch.bfloat16, seed=31)
    for transpose in (False, True):
        q, ro, scales = ca.custom_fused_ar_rms_per_group_quant(xs[rank], residual, weight, 1e-6, 128,
                                                               transpose_scale=transpose)
        q_ours, ro_ours, s_ours = comm.allreduce_rmsnorm_fp8(xs[rank], residual, weight, 1e-6, group_size=128)
        assert torch.equal(q.view(torch.uint8), q_ours.view(torch.uint8)) and torch.equal(ro, ro_ours)
        assert torch.equal(scales, s_ours) and (scales.stride() == (1, 16) if transpose else scales.is_contiguous())
    assert ca.custom_fused_ar_rms_per_group_quant(xs[rank], residual, weight, 1e-6, 128, emit_bf16=True) is None


def _worker(rank, world, init_file, result_dir, engine, what):
    import os

    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        ca = _adapter(engine, dist.group.WORLD, invariant=what == "any_size", register=what != "graphs_copied")
        assert not ca.disabled, ca.disabled_reason
        with Communicator(dist.group.WORLD, 0, max_bytes=MAX) as comm:
            if what == "eager":
                _eager(ca, comm, rank, world)
                _limit(ca, engine, rank, world)
                (_vllm_ops if engine == "vllm" else _sglang_quant)(ca, comm, rank, world)
            elif what in ("graphs", "graphs_copied"):
                _graphs(ca, comm, engine, rank, world)
            elif what == "any_size":
                _any_size(ca, comm, rank, world)
        ca.close()
        ca.close()
        assert ca.comm is None
        open(os.path.join(result_dir, f"ok-{rank}"), "w").close()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("what", ["eager", "graphs", "graphs_copied", "any_size"])
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("world", [2, 4], ids=lambda w: f"N{w}")
def test_adapter_as_the_engine_calls_it(tmp_path, monkeypatch, world, engine, what):
    monkeypatch.setenv("FUSED_AR_TIMEOUT_S", "30")
    spawn_ranks(_worker, world, tmp_path, engine, what)


# -- batch invariance ----------------------------------------------------------------------------------------
BATCHES = [1, 2, 7, 64, 300, 1024, 4096, 16384]
PROBES = 3


def _placed(m, probe, filler):
    """A batch of m rows with `probe` at the start, the middle and the end (where m allows)."""
    batch = filler[:m].clone()
    spots = sorted({0, m // 2, m - 1})
    for i in spots:
        batch[i] = probe
    return batch, spots


@pytest.mark.parametrize("variant", ["plain", "no_residual", "fp32_weight", "in_place", "fp8_per_token",
                                     "fp8_per_group", "nvfp4"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_local_rows_do_not_depend_on_the_batch(dtype, variant):
    n = 4096
    g = torch.Generator(device="cuda").manual_seed(5)
    filler = torch.randn(max(BATCHES), n, device="cuda", dtype=dtype, generator=g)
    res_filler = torch.randn(max(BATCHES), n, device="cuda", dtype=dtype, generator=g)
    weight = torch.rand(n, device="cuda", dtype=torch.float32 if variant == "fp32_weight" else dtype, generator=g) + .5
    for p in range(PROBES):
        x_row, r_row = filler[p].clone(), res_filler[p].clone()
        expected = None
        for m in BATCHES:
            x, spots = _placed(m, x_row, filler)
            r, _ = _placed(m, r_row, res_filler)
            if variant.startswith("fp8") or variant == "nvfp4":  # few rows take one pack a thread (kernels.py)
                if variant == "nvfp4":
                    q, ro, scales = add_rmsnorm_fp4(x, r, weight, 1e-6, global_scale=torch.ones(1, device="cuda"))
                else:
                    q, ro, scales = add_rmsnorm_fp8(x, r, weight, 1e-6, group_size=128 if "group" in variant else None)
                rows = [(q[i].view(torch.uint8), ro[i], scales[i].view(torch.uint8)) for i in spots]
            elif variant == "in_place":
                add_rmsnorm(x, r, weight, 1e-6, out=x, residual_out=r)
                rows = [(x[i], r[i]) for i in spots]
            else:
                out, ro = add_rmsnorm(x, None if variant == "no_residual" else r, weight, 1e-6)
                rows = [(out[i], ro[i]) for i in spots]
            expected = expected or rows[0]
            for row in rows:
                assert all(torch.equal(a, b) for a, b in zip(row, expected)), f"probe {p}: m={m} changed the row"


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"N{n}")
def group(request):
    yield from emulated_group(request.param, 16384 * 4096 * 2)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8_per_token"])
def test_fused_rows_do_not_depend_on_the_batch_or_the_path(group, fp8):
    """Across m = 1..16384 and the one-stage, two-stage and automatic paths (auto switches between them
    with m), the probe row's bits on every rank equal its bits alone at m = 1 on the one-stage path."""
    comms, _ = group
    world, n = len(comms), 4096
    g = torch.Generator(device="cuda").manual_seed(9)
    fillers = [torch.randn(max(BATCHES), n, device="cuda", dtype=torch.bfloat16, generator=g) for _ in comms]
    res_filler = torch.randn(max(BATCHES), n, device="cuda", dtype=torch.bfloat16, generator=g)
    weight = torch.rand(n, device="cuda", dtype=torch.bfloat16, generator=g) + 0.5
    probes = [f[0].clone() for f in fillers]
    r_probe = res_filler[0].clone()
    expected = None
    for path in ("1stage", "2stage", "auto"):
        for m in BATCHES:
            xs = [_placed(m, probes[r], fillers[r])[0] for r in range(world)]
            r, spots = _placed(m, r_probe, res_filler)
            if fp8:
                outs = run_ranks(group, lambda k, c: c.allreduce_rmsnorm_fp8(xs[k], r, weight, 1e-6, path=path))
                rows = [(q[i].view(torch.uint8), ro[i], s[i]) for q, ro, s in outs for i in spots]
            else:
                outs = run_ranks(group, lambda k, c: c.allreduce_rmsnorm(xs[k], r, weight, 1e-6, path=path))
                rows = [(out[i], ro[i]) for out, ro in outs for i in spots]
            expected = expected or rows[0]
            for row in rows:
                assert all(torch.equal(a, b) for a, b in zip(row, expected)), f"{path} m={m} changed the row"

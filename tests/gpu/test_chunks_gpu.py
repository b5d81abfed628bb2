"""Inputs over the communicator's buffer run through the IPC kernels in chunks of whole rows (flat packs for
the plain all-reduce), on one GPU: N ranks in one process with a buffer of a few rows, every path, dtype,
FP8 output, strided and in-place operands, graph capture, against the rank-order reference and bit for bit
against a group whose buffer holds the whole call."""

from __future__ import annotations

from contextlib import ExitStack

import pytest
import torch

from fused_ar import UnsupportedShapeError
from tests.gpu.test_communicator_gpu import emulated_group, make_inputs, poisoned, run_ranks
from tests.gpu.test_fp8_gpu import FORMATS, torch_quant
from tests.reference import allreduce_reference, assert_rmsnorm_matches

pytestmark = pytest.mark.gpu

# 5 rows of 4096 bf16 and a little: chunks of 5 rows (bf16/fp16), 2 (fp32), 2 (7168 bf16); never a
# multiple of a pack, so the flat all-reduce's chunks are whole packs below it
SMALL = 5 * 4096 * 2 + 100
BIG = 300 * 7168 * 4
MS = [1, 5, 6, 23, 300]


@pytest.fixture(scope="module", params=[2, 3, 5, 8], ids=lambda n: f"N{n}")
def groups(request):
    small = emulated_group(request.param, SMALL)
    big = emulated_group(request.param, BIG)
    yield next(small), next(big)
    for g in (small, big):
        next(g, None)


@pytest.mark.parametrize("path", ["auto", "1stage", "2stage"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("n", [4096, 7168])
def test_chunked_fused_and_plain_match_the_whole_call(groups, path, dtype, n):
    small, big = groups
    ranks = len(small[0])
    for m in MS:
        xs, residual, weight = make_inputs(ranks, m, n, dtype, seed=m * 7 + n + ranks)
        before = [x.clone() for x in xs]
        results = []
        for group in (small, big):
            # out with a row pitch of its own; residual_out over residual (in place) in the chunked group
            wide = [poisoned(torch.empty(m, n + 64, device="cuda", dtype=dtype)) for _ in xs]
            res = [residual.clone() for _ in xs]
            outs = run_ranks(group, lambda r, c: c.allreduce_rmsnorm(xs[r], res[r], weight, path=path,
                                                                      out=wide[r][:, :n], residual_out=res[r]))
            plain = [poisoned(x) for x in xs]
            run_ranks(group, lambda r, c: c.allreduce(xs[r], path=path, out=plain[r]))
            results.append((outs, plain))
        assert all(torch.equal(a, b) for a, b in zip(xs, before)), "an input was written"
        (outs, plain), (whole_outs, whole_plain) = results
        assert_rmsnorm_matches(xs, residual, weight, 1e-6, outs[0][0], outs[0][1])
        ref = allreduce_reference(xs)
        for r in range(ranks):
            assert torch.equal(outs[r][0], whole_outs[r][0]) and torch.equal(outs[r][1], whole_outs[r][1]), \
                f"m={m} rank {r}: chunked and whole calls differ"
            assert torch.equal(plain[r], ref) and torch.equal(whole_plain[r], ref), f"m={m} rank {r}: all-reduce"


@pytest.mark.parametrize("numel", [8, 20528 * 3 + 8, 123456 * 8])
def test_flat_all_reduce_in_chunks_of_packs_in_place(groups, numel):
    small, _ = groups
    g = torch.Generator(device="cuda").manual_seed(numel)
    xs = [torch.randn(numel, device="cuda", dtype=torch.bfloat16, generator=g) for _ in small[0]]
    ref = allreduce_reference(xs)
    outs = run_ranks(small, lambda r, c: c.allreduce(xs[r], out=xs[r]))  # out over x: each chunk is staged
    for r, out in enumerate(outs):
        assert out.data_ptr() == xs[r].data_ptr() and torch.equal(out, ref), f"rank {r}"


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("mode,group_size", [("static", None), ("token", None), ("group", 128)])
@pytest.mark.parametrize("path", ["1stage", "2stage"])
def test_chunked_fp8_is_the_quantization_of_the_chunked_out(groups, fmt, mode, group_size, path):
    small, _ = groups
    ranks, n, dtype, fp8 = len(small[0]), 4096, torch.bfloat16, FORMATS[fmt][0]
    scale = torch.tensor([0.05], device="cuda") if mode == "static" else None
    for m in (6, 23):
        xs, residual, weight = make_inputs(ranks, m, n, dtype, seed=m + ranks)
        plain = [(poisoned(residual), poisoned(residual)) for _ in xs]
        run_ranks(small, lambda r, c: c.allreduce_rmsnorm(xs[r], residual, weight, path=path, out=plain[r][0],
                                                          residual_out=plain[r][1]))
        ref_q, ref_s = torch_quant(plain[0][0], mode, fmt, scale, group_size)
        quant = [(torch.empty(m, n, device="cuda", dtype=fp8), poisoned(residual),
                  None if scale is not None else torch.full(ref_s.shape, float("nan"), device="cuda")) for _ in xs]
        run_ranks(small, lambda r, c: c.allreduce_rmsnorm_fp8(xs[r], residual, weight, scale=scale,
                                                              group_size=group_size, fp8_dtype=fp8, path=path,
                                                              out=quant[r][0], residual_out=quant[r][1],
                                                              scales_out=quant[r][2]))
        for r, (q, ro, s) in enumerate(quant):
            assert torch.equal(ro, plain[0][1]), f"m={m} rank {r}: residual_out"
            assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8)), f"m={m} rank {r}: FP8 bytes"
            if s is not None:
                assert torch.equal(s, ref_s), f"m={m} rank {r}: scales"


def test_chunked_calls_in_a_graph_replay_bit_exact(groups):
    small, _ = groups
    comms, streams = small
    ranks, m, n, dtype = len(comms), 23, 4096, torch.bfloat16
    xs, residual, weight = make_inputs(ranks, m, n, dtype, seed=11)
    run_ranks(small, lambda r, c: (c.allreduce_rmsnorm(xs[r], residual, weight), c.allreduce(xs[r])))  # warm
    outs, gs = [], []
    with ExitStack() as stack:
        for c in comms:
            stack.enter_context(c.capture())
        for r, (c, s) in enumerate(zip(comms, streams)):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s):
                outs.append((*c.allreduce_rmsnorm(xs[r], residual, weight), c.allreduce(xs[r])))
            gs.append(g)
    for rep in range(3):
        new, new_res, _ = make_inputs(ranks, m, n, dtype, seed=100 + rep)
        for r in range(ranks):
            xs[r].copy_(new[r])
            for t in outs[r]:
                t.fill_(float("nan"))
        residual.copy_(new_res)
        run_ranks(small, lambda r, c: gs[r].replay())
        for out, ro, ar in outs:
            assert_rmsnorm_matches(new, new_res, weight, 1e-6, out, ro)
            assert torch.equal(ar, allreduce_reference(new))


def test_a_row_over_the_buffer_is_refused_by_name(groups):
    small, _ = groups
    x = torch.ones(2, 16384, device="cuda", dtype=torch.float32)  # 64 KiB rows, the buffer holds 40 KiB
    with pytest.raises(UnsupportedShapeError, match=r"a row of x has 65536 bytes .*max_bytes=41060"):
        small[0][0].allreduce_rmsnorm(x, x.clone(), None)  # refused before any launch: no peer waits

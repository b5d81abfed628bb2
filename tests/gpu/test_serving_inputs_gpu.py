"""Tensors as serving frameworks pass them (the input cases of a peer's RMSNorm test suite): tokens 7/83/4096,
hidden 8/768/769/5120/5125/8192, fp16/bf16/fp32, rows that are a view into a buffer twice as wide, fp32
weight with 16-bit x, no weight, no residual, in place, a weight offset; for add_rmsnorm and for the
communicator (N ranks in one process), each against the float64 reference (residual_out bit-exact, out
within 1 ulp, all ranks equal); graph capture of a strided x."""

from __future__ import annotations

import contextlib

import pytest
import torch

import fused_ar
from fused_ar import UnsupportedShapeError
from tests.gpu.test_communicator_gpu import emulated_group, poisoned, run_ranks
from tests.reference import add_rmsnorm_reference, assert_rmsnorm_matches

pytestmark = pytest.mark.gpu
DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def _rows(m, n, dtype, strided, g):
    """m rows of n: contiguous, or the left half of a buffer twice as wide."""
    if strided:
        return torch.randn(m, 2 * n, device="cuda", dtype=dtype, generator=g)[:, :n]
    return torch.randn(m, n, device="cuda", dtype=dtype, generator=g)


def _weight(kind, n, dtype, g):
    if kind == "none":
        return None
    w = torch.rand(n, device="cuda", generator=g) + 0.5
    return w if kind == "fp32" else w.to(dtype)


@pytest.mark.parametrize("tokens", [7, 83, 4096])
@pytest.mark.parametrize("hidden", [8, 768, 769, 5120, 5125, 8192])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("weight_kind", ["same", "fp32", "none"])
def test_add_rmsnorm_serving_inputs(tokens, hidden, dtype, strided, weight_kind):
    if weight_kind == "fp32" and dtype is torch.float32:
        pytest.skip("an fp32 weight of fp32 x is the same-dtype case")
    g = torch.Generator(device="cuda").manual_seed(tokens * 7919 + hidden)
    x, residual = _rows(tokens, hidden, dtype, strided, g), _rows(tokens, hidden, dtype, strided, g)
    weight = _weight(weight_kind, hidden, dtype, g)
    _, ref_ro, ref_out = add_rmsnorm_reference([x], residual, weight, 1e-6)
    out, ro = fused_ar.add_rmsnorm(x, residual, weight, 1e-6)
    assert torch.equal(ro, ref_ro)
    assert_rmsnorm_matches([x], residual, weight, 1e-6, out, ro)
    # in place, as vLLM's fused_add_rms_norm: out over x, residual_out over residual (strides kept)
    x2, r2 = x.clone(), residual.clone()
    if strided:
        x2 = _rows(tokens, hidden, dtype, True, g).copy_(x)
        r2 = _rows(tokens, hidden, dtype, True, g).copy_(residual)
    fused_ar.add_rmsnorm(x2, r2, weight, 1e-6, out=x2, residual_out=r2)
    assert torch.equal(r2, ref_ro) and torch.equal(x2, out)
    # no residual, a Gemma weight offset
    out3, ro3 = fused_ar.add_rmsnorm(x, None, weight, 1e-6, weight_offset=1.0)
    assert torch.equal(ro3, x)
    assert_rmsnorm_matches([x], None, weight, 1e-6, out3, ro3, weight_offset=1.0)


def test_outputs_with_their_own_strides():
    g = torch.Generator(device="cuda").manual_seed(5)
    x, residual = _rows(33, 5120, torch.bfloat16, True, g), _rows(33, 5120, torch.bfloat16, False, g)
    weight = _weight("fp32", 5120, torch.bfloat16, g)
    wide = torch.full((33, 3 * 5120), float("nan"), device="cuda", dtype=torch.bfloat16)
    out, ro = wide[:, :5120], wide[:, 2 * 5120:]
    fused_ar.add_rmsnorm(x, residual, weight, 1e-6, out=out, residual_out=ro)
    assert_rmsnorm_matches([x], residual, weight, 1e-6, out, ro)
    assert torch.isnan(wide[:, 5120:2 * 5120]).all(), "wrote between the rows"


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"N{n}")
def group(request):
    yield from emulated_group(request.param, 4096 * 8192 * 4)


CASES = {
    "strided x": dict(strided_x=True),
    "strided residual and outputs": dict(strided_rest=True),
    "fp32 weight": dict(weight="fp32"),
    "no weight, no residual": dict(weight="none", residual=False),
    "in place": dict(in_place=True),
    "gemma offset": dict(offset=1.0),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("tokens", [7, 83])
@pytest.mark.parametrize("hidden", [768, 5120])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("path", ["1stage", "2stage"])
def test_communicator_serving_inputs(group, case, tokens, hidden, dtype, path):
    comms, _ = group
    opts = CASES[case]
    g = torch.Generator(device="cuda").manual_seed(tokens + hidden)
    n_ranks = len(comms)
    xs = [_rows(tokens, hidden, dtype, opts.get("strided_x", False), g) for _ in range(n_ranks)]
    residual = _rows(tokens, hidden, dtype, opts.get("strided_rest", False), g) if opts.get("residual", True) else None
    weight = _weight(opts.get("weight", "same"), hidden, dtype, g)  # "fp32" with fp32 x is its own dtype
    offset = opts.get("offset", 0.0)
    in_place = opts.get("in_place", False)
    if in_place:
        xs_in = [x.clone() for x in xs]
        residuals = [residual.clone() for _ in comms]
        outs = [(xs_in[r], residuals[r]) for r in range(n_ranks)]
    else:
        xs_in, residuals = xs, [residual] * n_ranks
        make = (lambda: _rows(tokens, hidden, dtype, True, g).fill_(float("nan"))) if opts.get("strided_rest") \
            else (lambda: poisoned(torch.empty(tokens, hidden, device="cuda", dtype=dtype)))
        outs = [(make(), make()) for _ in comms]
    run_ranks(group, lambda r, c: c.allreduce_rmsnorm(xs_in[r], residuals[r], weight, 1e-6, weight_offset=offset,
                                                      path=path, out=outs[r][0], residual_out=outs[r][1]))
    for out, ro in outs:
        assert torch.equal(out, outs[0][0]) and torch.equal(ro, outs[0][1]), "ranks disagree"
    assert_rmsnorm_matches(xs, residual, weight, 1e-6, outs[0][0], outs[0][1], weight_offset=offset)


def test_communicator_odd_hidden_is_refused_by_a_local_group(group):
    comms, _ = group
    x = torch.randn(3, 769, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(UnsupportedShapeError, match="n=769"):
        comms[0].allreduce_rmsnorm(x, x, None, path="1stage")


def test_graph_capture_of_a_strided_x(group):
    comms, streams = group
    m, n = 16, 4096
    wides = [torch.randn(m, 2 * n, device="cuda", dtype=torch.bfloat16) for _ in comms]
    xs = [w[:, :n] for w in wides]
    residual = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    weight = torch.rand(n, device="cuda", dtype=torch.bfloat16) + 0.5
    outs = [(poisoned(residual), poisoned(residual)) for _ in comms]
    run_ranks(group, lambda r, c: c.allreduce_rmsnorm(xs[r], residual, weight, out=outs[r][0], residual_out=outs[r][1]))
    graphs = []  # one graph per rank on its own stream, as one process per GPU captures it
    with contextlib.ExitStack() as stack:
        for c in comms:
            stack.enter_context(c.capture())
        for r, (c, s) in enumerate(zip(comms, streams)):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s):
                c.allreduce_rmsnorm(xs[r], residual, weight, out=outs[r][0], residual_out=outs[r][1])
            graphs.append(g)
    for trial in range(3):
        for w in wides:
            w.copy_(torch.randn_like(w))  # new rows, and new values between them
        for o in outs:
            o[0].fill_(float("nan")), o[1].fill_(float("nan"))
        torch.cuda.synchronize()
        for g, s in zip(graphs, streams):
            with torch.cuda.stream(s):
                g.replay()
        torch.cuda.synchronize()
        assert all(c.error_code() == 0 for c in comms)
        assert_rmsnorm_matches(xs, residual, weight, 1e-6, outs[0][0], outs[0][1])

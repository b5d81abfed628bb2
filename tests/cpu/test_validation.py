"""Every bad input of add_rmsnorm raises InputError naming the offending value, before any launch;
launch arguments are packed as exactly the kernel's C types."""

from __future__ import annotations

import ctypes

import pytest
import torch

import fused_ar.device.ops as ops
from fused_ar.errors import InputError, NoGpuError
from fused_ar.jit.kernels import ADD_RMSNORM
from fused_ar.device.plans import LaunchPlan
from fused_ar.jit.runtime import pack_args
from fused_ar.device.launch import launch
from fused_ar.jit.spec import KernelSpec
from fused_ar.device.validate import device_index, require_gpu


@pytest.fixture(autouse=True)
def no_launch(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a kernel was planned or launched for bad input")
    monkeypatch.setattr(ops, "AddRmsnormPlan", refuse)
    monkeypatch.setattr(LaunchPlan, "launch", refuse)


def _good(m=4, n=64, dtype=torch.bfloat16):
    return torch.randn(m, n, dtype=dtype), torch.randn(m, n, dtype=dtype), torch.randn(n, dtype=dtype)


CASES = {
    "x not a tensor": (lambda x, r, w: ([1.0], r, w, 1e-6), "x must be a torch.Tensor, got list"),
    "int dtype": (lambda x, r, w: (x.to(torch.int32), r, w, 1e-6), "x has dtype torch.int32"),
    "fp64": (lambda x, r, w: (x.double(), r.double(), w.double(), 1e-6), "x has dtype torch.float64"),
    "dtype mismatch residual": (lambda x, r, w: (x, r.half(), w, 1e-6),
                                r"residual has dtype torch.float16 but x has torch.bfloat16"),
    "dtype mismatch weight": (lambda x, r, w: (x, r, w.half(), 1e-6), r"weight has dtype torch.float16 but x has "
                              r"bfloat16: the weight takes x's dtype, or float32 with a 16-bit x"),
    "bf16 weight, fp32 x": (lambda x, r, w: (x.float(), r.float(), w, 1e-6), r"weight has dtype torch.bfloat16"),
    "strided weight": (lambda x, r, w: (x, r, torch.randn(128, dtype=x.dtype)[::2], 1e-6), "unit stride"),
    "shape mismatch": (lambda x, r, w: (x, r[:3], w, 1e-6), r"residual has shape \(3, 64\) but x has \(4, 64\)"),
    "weight length": (lambda x, r, w: (x, r, w[:32], 1e-6), r"weight has shape \(32,\); it must be 1-D of length n=64"),
    "weight 2-D": (lambda x, r, w: (x, r, w.view(1, 64), 1e-6), r"weight has shape \(1, 64\)"),
    "columns not unit stride": (lambda x, r, w: (torch.randn(64, 4, dtype=x.dtype).t(), r, w, 1e-6), "is not rows"),
    "rows closer than n": (lambda x, r, w: (x.view(-1).as_strided((4, 64), (32, 1)), r, w, 1e-6), "is not rows"),
    "residual rows overlap": (lambda x, r, w: (x, r.view(-1).as_strided((4, 64), (0, 1)), w, 1e-6),
                              "residual with shape .* is not rows"),
    "scalar x": (lambda x, r, w: (x[0, 0], r, w, 1e-6), r"x has shape \(\)"),
    "eps zero": (lambda x, r, w: (x, r, w, 0.0), "eps=0.0 must be finite and > 0"),
    "eps negative": (lambda x, r, w: (x, r, w, -1e-6), "eps=-1e-06"),
    "eps nan": (lambda x, r, w: (x, r, w, float("nan")), "eps=nan"),
    "eps inf": (lambda x, r, w: (x, r, w, float("inf")), "eps=inf"),
    "eps string": (lambda x, r, w: (x, r, w, "1e-6"), "eps='1e-6' must be a real number"),
    "eps bool": (lambda x, r, w: (x, r, w, True), "eps=True"),
    "cpu tensors": (lambda x, r, w: (x, r, w, 1e-6), "x is on cpu; fused_ar ops run on GPU tensors"),
}
ACCEPTED = "x is on cpu; fused_ar ops run on GPU tensors"  # every rule but the device passed


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_raises_before_launch(case):
    make, message = CASES[case]
    with pytest.raises(InputError, match=message):
        ops.add_rmsnorm(*make(*_good()))


def test_outputs_are_checked():
    x, r, w = _good()
    with pytest.raises(InputError, match=r"out has shape \(4, 32\)"):
        ops.add_rmsnorm(x, r, w, out=torch.empty(4, 32, dtype=x.dtype))
    with pytest.raises(InputError, match="residual_out overlaps x"):
        ops.add_rmsnorm(x, r, w, residual_out=x)
    with pytest.raises(InputError, match="out overlaps residual"):
        ops.add_rmsnorm(x, r, w, out=r)
    with pytest.raises(InputError, match="residual_out overlaps out"):
        o = torch.empty_like(x)
        ops.add_rmsnorm(x, r, w, out=o, residual_out=o)
    big = torch.randn(x.numel() + 8, dtype=x.dtype)
    x2 = big[:x.numel()].view(x.shape)
    with pytest.raises(InputError, match="out overlaps x"):  # a partial overlap, even in place
        ops.add_rmsnorm(x2, r, w, out=big[8:8 + x.numel()].view(x.shape))
    for offset in (float("nan"), float("inf"), "1", None, True):
        with pytest.raises(InputError, match="weight_offset"):
            ops.add_rmsnorm(x, r, w, weight_offset=offset)


# -- what serving frameworks pass (a peer's RMSNorm test cases) -----------------------------------------
@pytest.mark.parametrize("tokens", [7, 83])
@pytest.mark.parametrize("hidden", [8, 768, 769, 5120, 5125, 8192])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "rows of a 2x wide buffer"])
@pytest.mark.parametrize("weight", ["x's dtype", "fp32", "none"])
def test_framework_inputs_are_accepted(tokens, hidden, dtype, strided, weight):
    wide = torch.randn(tokens, 2 * hidden, dtype=dtype)
    x = wide[:, :hidden] if strided else torch.randn(tokens, hidden, dtype=dtype)
    residual = torch.randn(tokens, hidden, dtype=dtype)
    w = {"x's dtype": torch.randn(hidden, dtype=dtype), "fp32": torch.randn(hidden), "none": None}[weight]
    with pytest.raises(InputError, match=ACCEPTED):
        ops.add_rmsnorm(x, residual, w, 1e-6)
    with pytest.raises(InputError, match=ACCEPTED):  # in place, as vLLM's fused_add_rms_norm
        ops.add_rmsnorm(x, residual, w, 1e-6, out=x, residual_out=residual)
    with pytest.raises(InputError, match=ACCEPTED):  # no residual
        ops.add_rmsnorm(x, None, w, 1e-6)
    if strided:  # outputs in the other half of the wide buffer share no element with x
        with pytest.raises(InputError, match=ACCEPTED):
            ops.add_rmsnorm(x, residual, w, 1e-6, out=wide[:, hidden:])


def test_devices_must_agree():
    x, r, w = _good()
    with pytest.raises(InputError, match="on cpu"):
        ops.add_rmsnorm(x, r, w.to("meta"))


# By name, so the kernel's parameter order (kernels.py, chosen for the constant cache) is free to change.
GOOD = dict(x=1 << 40, residual=2, weight=3, x_stride=4096, residual_stride=4096, rows=7, cols=4096, residual_out=4,
            out=5, residual_out_stride=4096, out_stride=8192, eps=1e-6, weight_offset=1.0, scales=0,
            scales_stride=32, group=128, scales_col_stride=1, global_scale=0, scales_row0=0, scale_copy=0)
GOOD_ARGS = tuple(GOOD[name] for name, _ in ADD_RMSNORM.params)
INDEX = {name: i for i, (name, _) in enumerate(ADD_RMSNORM.params)}


def test_args_pack_as_c_types():
    packed = dict(zip(INDEX, pack_args(ADD_RMSNORM, GOOD_ARGS)))
    assert set(packed) == set(GOOD)
    kinds = {ctypes.c_void_p: ("x", "residual", "weight", "residual_out", "out", "scales", "global_scale", "scale_copy"),
             ctypes.c_int32: ("rows", "cols", "group", "scales_col_stride", "scales_row0"),
             ctypes.c_int64: ("x_stride", "residual_stride", "residual_out_stride", "out_stride", "scales_stride"),
             ctypes.c_float: ("eps", "weight_offset")}
    assert {name: type(value) for name, value in packed.items()} == \
        {name: kind for kind, names in kinds.items() for name in names}
    assert packed["x"].value == 1 << 40 and packed["eps"].value == pytest.approx(1e-6)
    assert packed["out_stride"].value == 8192


def _with(name, value):
    i = INDEX[name]
    return GOOD_ARGS[:i] + (value,) + GOOD_ARGS[i + 1:]


@pytest.mark.parametrize("args,message", [
    (_with("rows", 7.0), "argument rows of add_rmsnorm must be an int"),
    (_with("rows", 2**31), "rows=2147483648 .* does not fit int"),
    (_with("out", -1), "out=-1"),
    (_with("x", -1), "x=-1"),
    (GOOD_ARGS[:8], "takes 20 arguments"),
    (_with("rows", True), "argument rows of add_rmsnorm must be an int"),
    (_with("x_stride", 2**63), "x_stride=9223372036854775808 .* does not fit long long"),
    (_with("scales_col_stride", 2**31), "scales_col_stride=2147483648 .* does not fit int"),
])
def test_bad_launch_args(args, message):
    with pytest.raises(InputError, match=message):
        pack_args(ADD_RMSNORM, args)


@pytest.mark.parametrize("grid", [8, 9, 1 << 16])
def test_add_rmsnorm_grid_larger_than_its_rows_is_refused(grid, monkeypatch):
    """Each add_rmsnorm block takes a first row without testing it: a grid past the rows is refused before
    anything is compiled or launched (the stubbed loader fails the test if it is reached)."""
    import fused_ar.device.launch as launch_module

    monkeypatch.setattr(launch_module, "function", lambda *a: pytest.fail("compiled a kernel for a bad grid"))
    spec = KernelSpec("add_rmsnorm", "bf16", "sm_90")
    with pytest.raises(InputError, match=f"add_rmsnorm launched with {grid} blocks for rows=7: at most one block a row"):
        launch(spec, 0, grid, GOOD_ARGS, stream=0)


@pytest.mark.parametrize("grid", [1, 7])
def test_add_rmsnorm_grid_up_to_its_rows_goes_on_to_the_kernel(grid, monkeypatch):
    import fused_ar.device.launch as launch_module

    class Reached(Exception):
        pass

    def reached(*args):
        raise Reached

    monkeypatch.setattr(launch_module, "function", reached)
    with pytest.raises(Reached):
        launch(KernelSpec("add_rmsnorm", "bf16", "sm_90"), 0, grid, GOOD_ARGS, stream=0)


# -- devices, as torch users pass them ------------------------------------------------------------------
@pytest.fixture
def two_gpus(monkeypatch):
    """torch's view of a machine with two GPUs, GPU 1 current (only the device rules run here)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)


@pytest.mark.parametrize("device,index", [(0, 0), (1, 1), (None, 1), ("cuda", 1), ("cuda:0", 0),
                                          (torch.device("cuda", 0), 0), (torch.device("cuda"), 1)])
def test_device_forms(two_gpus, device, index):
    assert device_index(device) == index


@pytest.mark.parametrize("device,rule", [("cpu", "cpu device"), (torch.device("cpu"), "cpu device"),
                                         (2, "no GPU 2"), ("cuda:7", "no GPU 7"), (-1, "no GPU -1"),
                                         ("gpu:0", "not a device"), (True, "expected an int"),
                                         (1.0, "expected an int"), ("meta", "meta device")])
def test_bad_device_forms(two_gpus, device, rule):
    with pytest.raises(InputError, match=rule):
        device_index(device)


def test_no_gpu_is_one_line():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(NoGpuError, match="^fused_ar.Communicator needs a GPU, and torch .* sees none$"):
        require_gpu("fused_ar.Communicator")


class _At:
    """A stand-in operand for the per-call pointer checks: only its address is read."""

    def __init__(self, address: int) -> None:
        self.address = address

    def data_ptr(self) -> int:
        return self.address


def test_fp8_pointer_checks_match_the_byte_overlap_rule():
    """fp8_pointers_ok (straight-line, run on every quantized call) passes exactly the calls whose quantized out
    is aligned and whose out and scales share no byte with any other operand or each other: checked against
    that rule over random layouts with absent operands, touching spans and exact overlaps."""
    import random

    from fused_ar.device.plans import fp8_pointers_ok

    def apart(a, a_size, b, b_size):
        return a_size == 0 or b_size == 0 or a + a_size <= b or b + b_size <= a

    rng = random.Random(7)
    seen = {True: 0, False: 0}
    for _ in range(20000):
        def place(absent_ok=True):
            if absent_ok and rng.random() < 0.2:
                return None
            return rng.choice([0x1000, 0x1040, 0x1080, 0x10c0, 0x1100]) + rng.choice([0, 0, 1, 8, 16])
        x, r, w, ro, out, sc, g = place(False), place(), place(), place(), place(), place(), place()
        spans = (0x40, 0 if r is None else rng.choice([0x10, 0x40]), 0 if w is None else 0x20, 0,
                 0 if ro is None else 0x40)
        q_spans = (rng.choice([0x10, 0x40]), rng.choice([4, 0x10]))
        q_align = rng.choice([1, 8])
        operands = [(x, spans[0]), (r, spans[1]), (w, spans[2]), (ro, spans[4]), (g, 4)]
        want = True
        if out is not None:
            want = out % q_align == 0 and all(apart(out, q_spans[0], a, s) for a, s in operands if a is not None)
            operands.append((out, q_spans[0]))
        if sc is not None and want:
            want = all(apart(sc, q_spans[1], a, s) for a, s in operands if a is not None)
        got = fp8_pointers_ok(spans, q_spans, q_align, (x, r or 0, w or 0), None if ro is None else _At(ro),
                              None if out is None else _At(out), None if sc is None else _At(sc),
                              None if g is None else _At(g))
        assert got == want, (x, r, w, ro, out, sc, g, spans, q_spans, q_align)
        seen[got] += 1
    assert min(seen.values()) > 1000, seen  # both outcomes well covered

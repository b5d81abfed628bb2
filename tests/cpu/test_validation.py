"""Every bad input of add_rmsnorm raises InputError naming the offending value, before any launch;
launch arguments are packed as exactly the kernel's C types."""

from __future__ import annotations

import ctypes

import pytest
import torch

import fused_ar.ops as ops
from fused_ar.errors import InputError, NoGpuError
from fused_ar.kernels import ADD_RMSNORM
from fused_ar.plans import LaunchPlan
from fused_ar.runtime import pack_args
from fused_ar.validate import device_index, require_gpu


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
    "dtype mismatch weight": (lambda x, r, w: (x, r, w.float(), 1e-6), r"weight has dtype torch.float32"),
    "shape mismatch": (lambda x, r, w: (x, r[:3], w, 1e-6), r"residual has shape \(3, 64\) but x has \(4, 64\)"),
    "weight length": (lambda x, r, w: (x, r, w[:32], 1e-6), r"weight has shape \(32,\); it must be 1-D of length n=64"),
    "weight 2-D": (lambda x, r, w: (x, r, w.view(1, 64), 1e-6), r"weight has shape \(1, 64\)"),
    "non-contiguous rows": (lambda x, r, w: (torch.randn(64, 4, dtype=x.dtype).t(), r, w, 1e-6), "not contiguous"),
    "n not a pack multiple": (lambda x, r, w: (x[:, :60].contiguous(), r[:, :60].contiguous(), w[:60].contiguous(),
                                               1e-6), "n=60: n must be a positive multiple of 8 for bf16"),
    "misaligned view": (lambda x, r, w: (x.view(-1)[4:4 + 3 * 64].view(3, 64), r[:3], w, 1e-6),
                        "not 16-byte aligned"),
    "scalar x": (lambda x, r, w: (x[0, 0], r, w, 1e-6), r"x has shape \(\)"),
    "eps zero": (lambda x, r, w: (x, r, w, 0.0), "eps=0.0 must be finite and > 0"),
    "eps negative": (lambda x, r, w: (x, r, w, -1e-6), "eps=-1e-06"),
    "eps nan": (lambda x, r, w: (x, r, w, float("nan")), "eps=nan"),
    "eps inf": (lambda x, r, w: (x, r, w, float("inf")), "eps=inf"),
    "eps string": (lambda x, r, w: (x, r, w, "1e-6"), "eps='1e-6' must be a real number"),
    "eps bool": (lambda x, r, w: (x, r, w, True), "eps=True"),
    "cpu tensors": (lambda x, r, w: (x, r, w, 1e-6), "x is on cpu; fused_ar ops run on GPU tensors"),
}


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
    with pytest.raises(InputError, match="residual_out overlaps out"):
        o = torch.empty_like(x)
        ops.add_rmsnorm(x, r, w, out=o, residual_out=o)


def test_devices_must_agree():
    x, r, w = _good()
    with pytest.raises(InputError, match="on cpu"):
        ops.add_rmsnorm(x, r, w.to("meta"))


def test_args_pack_as_c_types():
    packed = pack_args(ADD_RMSNORM, (1 << 40, 2, 3, 4, 5, 7, 4096, 1e-6))
    assert [type(v) for v in packed] == [ctypes.c_void_p] * 5 + [ctypes.c_int32, ctypes.c_int32, ctypes.c_float]
    assert packed[0].value == 1 << 40 and packed[7].value == pytest.approx(1e-6)


@pytest.mark.parametrize("args,message", [
    ((1, 2, 3, 4, 5, 7.0, 4096, 1e-6), "argument rows of add_rmsnorm must be an int"),
    ((1, 2, 3, 4, 5, 2**31, 4096, 1e-6), "rows=2147483648 .* does not fit int"),
    ((-1, 2, 3, 4, 5, 7, 4096, 1e-6), "out=-1"),
    ((1, 2, 3, 4, 5, 7, 4096), "takes 8 arguments"),
    ((1, 2, 3, 4, 5, True, 4096, 1e-6), "argument rows of add_rmsnorm must be an int"),
])
def test_bad_launch_args(args, message):
    with pytest.raises(InputError, match=message):
        pack_args(ADD_RMSNORM, args)


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

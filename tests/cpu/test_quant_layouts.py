"""Per-group FP8 scales in their formats and layouts (docs/design.md section 1b), on the CPU: the shape, dtype
and strides each call returns (and the kernel's steps), the same layout as fused_ar.reference.pack_ue8m0
builds, what the torch op's fake gives when traced, bad arguments refused before anything is planned, and
what the kernels are rendered with."""

from __future__ import annotations

import pytest
import torch

import fused_ar.device.ops as ops
from fused_ar.device.plans import LaunchPlan
from fused_ar.device.validate import check_quant
from fused_ar.errors import InputError
from fused_ar.jit.render import render
from fused_ar.jit.spec import DType, Fp8Format, KernelSpec, Quant
from fused_ar.reference import pack_ue8m0


_SCALE = torch.ones(1)


def quant(shape, scales_format="fp32", mn_major=False, group=128):
    x = torch.empty(shape, dtype=torch.bfloat16)
    return check_quant(x, shape[-1], DType.BF16, None, group, None, Fp8Format.E4M3FN, scales_format, mn_major)


@pytest.mark.parametrize("m", [1, 5, 8, 130])
@pytest.mark.parametrize("groups", [1, 3, 4, 17])
def test_packed_layouts_are_the_references(m, groups):
    """ue8m0_packed: ceil(g / 4) int32 words a row, row-major (contiguous) or MN-major (strides (1, m rounded
    up to 4)), exactly the tensor pack_ue8m0 returns; the kernel steps in words between rows and columns."""
    for mn_major in (False, True):
        q = quant((m, groups * 128), "ue8m0_packed", mn_major)
        ref = pack_ue8m0(torch.ones(m, groups), mn_major)
        assert (q.kind, q.scales_dtype, q.scales_shape, q.scales_strides) == \
            (Quant.GROUP_UE8M0, "int32", tuple(ref.shape), ref.stride())
        new = q.new_scales("cpu")
        assert new.dtype == torch.int32 and new.shape == ref.shape and new.stride() == ref.stride()
        fixed, shared = q.launch_args(groups * 128)
        words = -(-groups // 4)
        assert fixed == {"group": 128, "scales_stride": 1 if mn_major else words,
                         "scales_col_stride": -(-m // 4) * 4 if mn_major else 1}
        assert shared == 4 * groups


def test_fp32_layouts_and_leading_dimensions():
    q = quant((7, 1024))
    assert (q.kind, q.scales_dtype, q.scales_shape, q.scales_strides) == (Quant.GROUP, "float32", (7, 8), (8, 1))
    q = quant((7, 1024), "ue8m0", True)
    assert (q.kind, q.scales_shape, q.scales_strides, q.row_stride, q.col_stride) == \
        (Quant.GROUP_POW2, (7, 8), (1, 8), 1, 8)
    q = quant((2, 3, 1024), "ue8m0_packed", True)  # rows flattened over the leading dimensions
    assert (q.scales_shape, q.scales_strides) == ((2, 3, 2), (3, 1, 8))
    assert q.new_scales("cpu").stride() == (3, 1, 8)
    q = quant((0, 1024), "ue8m0_packed", True)
    assert q.new_scales("cpu").shape == (0, 2)


@pytest.fixture
def no_plan(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a kernel was planned or launched for bad input")
    monkeypatch.setattr(ops, "AddRmsnormPlan", refuse)
    monkeypatch.setattr(LaunchPlan, "launch", refuse)


@pytest.mark.parametrize("kwargs,match", [
    ({"group_size": 128, "scales_format": "e8m0"}, r"scales_format='e8m0': it must be one of 'fp32', 'ue8m0', "
                                                   r"'ue8m0_packed'"),
    ({"group_size": 128, "scales_format": 8}, "scales_format=8"),
    ({"scales_format": "ue8m0"}, r"scales_format='ue8m0' applies to per-group scales: give group_size"),
    ({"scales_mn_major": True}, r"scales_mn_major=True applies to per-group scales"),
    ({"scale": torch.ones(1), "scales_format": "ue8m0_packed"}, "give group_size"),
    ({"group_size": 128, "scales_mn_major": "yes"}, "scales_mn_major='yes': it must be True or False"),
    ({"group_size": 128, "scales_format": "ue8m0_packed", "scales_out": torch.empty(4, 2)},
     r"scales_out has dtype torch.float32.*it must be int32 of shape \(4, 1\)"),
    ({"group_size": 128, "scales_format": "ue8m0_packed", "scales_mn_major": True,
      "scales_out": torch.empty(4, 1, dtype=torch.int32)}, r"strides \(1, 1\): it must be int32 .* strides \(1, 4\)"),
    ({"group_size": 128, "scales_mn_major": True, "scales_out": torch.empty(4, 2)}, r"strides \(1, 4\)"),
    ({"scale": torch.ones(1), "scales_out": torch.empty(1, dtype=torch.float16)},
     r"scales_out has dtype torch.float16 and shape \(1,\): with a static scale it receives the scale's value"),
    ({"scale": torch.ones(1), "scales_out": torch.empty(())}, r"float32 of shape \(1,\)"),
    ({"scale": _SCALE, "scales_out": _SCALE}, "scales_out overlaps scale"),
])
def test_bad_scale_arguments_are_refused(no_plan, kwargs, match):
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    with pytest.raises(InputError, match=match):
        ops.add_rmsnorm_fp8(x, x.clone(), None, **kwargs)


def test_torch_op_fake_gives_the_scales_layout():
    """Traced by torch.compile, the op's fake returns the scales the call returns: packed MN-major int32."""
    import fused_ar.torch_ops  # noqa: F401
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    seen = {}

    def backend(gm, example_inputs):
        FakeTensorProp(gm).propagate(*example_inputs)
        outs = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
        seen["vals"] = [(tuple(o.meta["val"].shape), o.meta["val"].dtype, o.meta["val"].stride()) for o in outs]
        return lambda *args: tuple(torch.zeros(s[0]) for s in seen["vals"])

    def layer(x, residual, norm):
        return torch.ops.fused_ar.add_rmsnorm_fp8(x, residual, norm, 1e-6, 0.0, None, 128, torch.float8_e4m3fn,
                                                  "ue8m0_packed", True)

    torch.compile(layer, fullgraph=True, backend=backend)(torch.randn(6, 2176), torch.randn(6, 2176), torch.ones(2176))
    assert seen["vals"][0][:2] == ((6, 2176), torch.float8_e4m3fn)
    assert seen["vals"][2] == ((6, 5), torch.int32, (1, 8))


def test_kernels_are_rendered_with_the_scale_format():
    for kind, pow2, ue8m0 in ((Quant.GROUP, 0, 0), (Quant.GROUP_POW2, 1, 0), (Quant.GROUP_UE8M0, 1, 1)):
        text = render(KernelSpec("add_rmsnorm", "bf16", "sm_90", quant=kind)).text
        assert "#define FA_QUANT FA_QUANT_GROUP\n" in text
        assert f"#define FA_SCALE_POW2 {pow2}\n" in text and f"#define FA_SCALE_UE8M0 {ue8m0}\n" in text
    names = {KernelSpec("add_rmsnorm", "bf16", "sm_90", quant=k).kernel_name for k in Quant}
    assert len(names) == len(Quant)  # one kernel, one name, per kind


def test_fp4_layouts():
    """FP4: values n / 2 bytes a row; NVFP4 E4M3 scales per 16 (row-major, or the swizzled tiles: rows padded to
    128, blocks to 4, as fused_ar.reference.swizzle_nvfp4_scales lays them out), MXFP4 bytes per 32."""
    from fused_ar.device.validate import check_fp4
    from fused_ar.reference import swizzle_nvfp4_scales

    x = torch.empty(130, 2080, dtype=torch.bfloat16)
    g = torch.ones(1)
    q = check_fp4(x, 2080, "nvfp4", False, g)
    assert (q.kind, q.scales_dtype, q.scales_shape, q.out_dtype, q.out_cols, q.row_stride) == \
        (Quant.NVFP4, "float8_e4m3fn", (130, 130), "uint8", 1040, 130)
    q = check_fp4(x, 2080, "nvfp4", True, g)
    ref = swizzle_nvfp4_scales(torch.zeros(130, 130, dtype=torch.float8_e4m3fn))
    assert (q.kind, q.scales_shape, q.row_stride, q.zeroed) == (Quant.NVFP4_SWIZZLED, tuple(ref.shape), 0, True)
    assert q.new_scales("cpu").view(torch.uint8).eq(0).all()
    q = check_fp4(x[:, :2048], 2048, "mxfp4", False, None)
    assert (q.kind, q.scales_dtype, q.scales_shape, q.group) == (Quant.MXFP4, "uint8", (130, 64), 32)
    assert KernelSpec("add_rmsnorm", "bf16", "sm_90", quant=Quant.MXFP4, fp8="e4m3fnuz").fp8 is Fp8Format.E4M3FN
    for fmt, kind, rounding in (("mxfp4_rceil", Quant.MXFP4_RCEIL, 1), ("mxfp4_even", Quant.MXFP4_EVEN, 2)):
        q = check_fp4(x[:, :2048], 2048, fmt, False, None)
        assert (q.kind, q.scales_dtype, q.scales_shape, q.group) == (kind, "uint8", (130, 64), 32)
        text = render(KernelSpec("add_rmsnorm", "bf16", "sm_90", quant=kind)).text
        assert "#define FA_QUANT FA_QUANT_MXFP4" in text and f"#define FA_MXFP4_ROUNDING {rounding}" in text
    with pytest.raises(ValueError, match="FP4 output takes 16-byte packs"):
        KernelSpec("add_rmsnorm", "bf16", "sm_90", quant=Quant.NVFP4, pack=2)


@pytest.mark.parametrize("kwargs,match", [
    ({"fp4_format": "e2m1"}, "fp4_format='e2m1'"),
    ({}, "needs global_scale"),
    ({"global_scale": torch.ones(2)}, "one float32"),
    ({"fp4_format": "mxfp4", "global_scale": torch.ones(1)}, "powers of two alone"),
    ({"fp4_format": "mxfp4", "scales_swizzled": True}, "NVFP4's layout"),
    ({"fp4_format": "mxfp4_even", "global_scale": torch.ones(1)}, "fp4_format='mxfp4_even': MXFP4's scales"),
    ({"global_scale": torch.ones(1), "scales_swizzled": "no"}, "scales_swizzled='no'"),
])
def test_bad_fp4_arguments_are_refused(no_plan, kwargs, match):
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    with pytest.raises(InputError, match=match):
        ops.add_rmsnorm_fp4(x, x.clone(), None, **kwargs)
    with pytest.raises(InputError, match="n=200: nvfp4 quantizes blocks of 16"):
        ops.add_rmsnorm_fp4(x[:, :200], None, None, global_scale=torch.ones(1))


# Values the per-call plan key cannot hold (unhashable): the full checks still name them, never a TypeError.
@pytest.mark.parametrize("op,kwargs,match", [
    ("fp8", {"group_size": [128]}, r"group_size=\[128\]"),
    ("fp8", {"group_size": 128, "scales_format": ["fp32"]}, r"scales_format=\['fp32'\]"),
    ("fp8", {"group_size": 128, "scales_mn_major": [True]}, r"scales_mn_major=\[True\]"),
    ("fp8", {"fp8_dtype": [torch.float8_e4m3fn]}, r"fp8_dtype=\[torch.float8_e4m3fn\]"),
    ("fp8", {"weight_offset": [0.0]}, r"weight_offset=\[0.0\]"),
    ("fp4", {"fp4_format": ["nvfp4"], "global_scale": torch.ones(1)}, r"fp4_format=\['nvfp4'\]"),
    ("fp4", {"global_scale": torch.ones(1), "scales_swizzled": {}}, r"scales_swizzled=\{\}"),
])
def test_unhashable_arguments_are_input_errors(no_plan, op, kwargs, match):
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    call = ops.add_rmsnorm_fp8 if op == "fp8" else ops.add_rmsnorm_fp4
    with pytest.raises(InputError, match=match):
        call(x, x.clone(), None, **kwargs)


class _KeptPlan:
    """Stands for the plan a valid call left under its key: a call that reaches it skipped the full checks."""

    def __getattr__(self, name):
        raise AssertionError(f"a call reused the plan of a valid call (read its {name})")


# Values equal to a valid one (128.0 == 128, 1 == True) that the full checks refuse: a plan kept under the valid
# call's key must not serve them, or the same call would be refused or accepted by whether that call came first.
@pytest.mark.parametrize("op,valid,bad,match", [
    ("fp8", {"group_size": 128}, {"group_size": 128.0}, r"group_size=128.0"),
    ("fp8", {"group_size": 128, "scales_mn_major": True}, {"group_size": 128, "scales_mn_major": 1},
     r"scales_mn_major=1: it must be True or False"),
    ("fp8", {"group_size": 128, "scales_mn_major": False}, {"group_size": 128, "scales_mn_major": 0},
     r"scales_mn_major=0: it must be True or False"),
    ("fp4", {"global_scale": torch.ones(1), "scales_swizzled": True},
     {"global_scale": torch.ones(1), "scales_swizzled": 1}, r"scales_swizzled=1"),
])
def test_a_kept_plan_never_serves_an_equal_value_of_another_type(monkeypatch, op, valid, bad, match):
    from fused_ar import env
    from fused_ar.device.plans import PLAN_ENV, fp4_arguments, fp8_arguments, quant_key, rmsnorm_key

    x = torch.randn(4, 256, dtype=torch.bfloat16)
    residual = x.clone()
    if op == "fp8":
        args = lambda kw: fp8_arguments(None, kw["group_size"], None, "fp32", kw.get("scales_mn_major", False), None)
        call = ops.add_rmsnorm_fp8
    else:
        args = lambda kw: fp4_arguments("nvfp4", kw["global_scale"], kw["scales_swizzled"], None)
        call = ops.add_rmsnorm_fp4
    assert quant_key(args(valid)) != quant_key(args(bad))
    key = (rmsnorm_key(x, residual, None, None, None), env.raw_values(PLAN_ENV), quant_key(args(valid)))
    monkeypatch.setitem(ops._plans, key, _KeptPlan())
    with pytest.raises(InputError, match=match):
        call(x, residual, None, **bad)


def test_torch_op_fakes_take_keywords_and_left_out_defaults():
    """torch passes a traced op's arguments as the caller wrote them: keywords, defaults left out."""
    import fused_ar.torch_ops  # noqa: F401
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    seen = {}

    def backend(gm, example_inputs):
        FakeTensorProp(gm).propagate(*example_inputs)
        outs = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
        seen["vals"] = [(tuple(o.meta["val"].shape), o.meta["val"].dtype) for o in outs]
        return lambda *args: tuple(torch.zeros(s[0]) for s in seen["vals"])

    def layer(x, residual, norm, g):
        a = torch.ops.fused_ar.add_rmsnorm_fp4(x, residual, norm, 1e-6, global_scale=g, scales_swizzled=True)
        b = torch.ops.fused_ar.add_rmsnorm_fp4(x, residual, norm, 1e-6, fp4_format="mxfp4")
        c = torch.ops.fused_ar.add_rmsnorm_fp8(x, residual, norm, 1e-6, group_size=128, fp8_dtype=torch.float8_e4m3fn)
        return a[0], a[2], b[2], c[0], c[2]

    torch.compile(layer, fullgraph=True, backend=backend)(torch.randn(6, 2048), torch.randn(6, 2048), torch.ones(2048),
                                                          torch.ones(1))
    assert seen["vals"] == [((6, 1024), torch.uint8), ((128 * 128,), torch.float8_e4m3fn), ((6, 64), torch.uint8),
                            ((6, 2048), torch.float8_e4m3fn), ((6, 16), torch.float32)]

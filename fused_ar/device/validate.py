"""Input rules shared by every op (the local add_rmsnorm, the communicator's ops, the fallback's epilogue):
checked before any launch.

Tensors are rows: any leading dimensions over a last dimension n of unit stride, rows a uniform stride apart
(at least n). Each violation raises InputError naming the offending value and the rule. Nothing here
allocates, compiles or launches. Device placement is checked last, so every other rule is checkable anywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from ..errors import InputError, NoGpuError
from ..jit.spec import DEFAULT_PACK, DType, Fp8Format, Quant, WeightKind

INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class RowsShape:
    """A tensor seen as rows: its dtype, row count, row length and row stride."""

    dtype: DType
    rows: int
    cols: int
    row_stride: int  # elements between row starts (n for contiguous rows)


def require_gpu(what: str) -> None:
    """Raises NoGpuError (one line) where torch sees no GPU: `what` needs one."""
    import torch

    if not torch.cuda.is_available():
        build = f"ROCm {torch.version.hip}" if getattr(torch.version, "hip", None) else (
            f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build")
        raise NoGpuError(f"{what} needs a GPU, and torch {torch.__version__} ({build}) sees none")


def device_index(device: Any, what: str = "device") -> int:
    """The GPU index of what torch users pass for a device: an int, a torch.device or a string such as
    "cuda:1" ("cuda" alone: the current device); None is the current device. InputError for a CPU
    device or an index out of range, NoGpuError where there is no GPU."""
    import torch

    require_gpu(f"{what}={device!r}")
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, bool) or not isinstance(device, (int, str, torch.device)):
        raise InputError(f"{what}={device!r}: expected an int, a torch.device or a string such as 'cuda:0'")
    if isinstance(device, int):
        index = device
    else:
        try:
            parsed = torch.device(device)
        except (RuntimeError, ValueError) as exc:
            raise InputError(f"{what}={device!r}: not a device ({exc})") from None
        if parsed.type != "cuda":
            raise InputError(f"{what}={device!r} is a {parsed.type} device: fused_ar runs on GPUs ('cuda:N', "
                             f"also under ROCm)")
        index = torch.cuda.current_device() if parsed.index is None else parsed.index
    count = torch.cuda.device_count()
    if not 0 <= index < count:
        raise InputError(f"{what}={device!r}: there is no GPU {index} (this process sees {count})")
    return index


def _tensor(name: str, t: Any) -> None:
    import torch

    if not isinstance(t, torch.Tensor):
        raise InputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def check_eps(eps: Any) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise InputError(f"eps={eps!r} must be a real number")
    eps = float(eps)
    if not math.isfinite(eps) or eps <= 0:
        raise InputError(f"eps={eps!r} must be finite and > 0")
    return eps


def check_offset(offset: Any) -> float:
    if isinstance(offset, bool) or not isinstance(offset, (int, float)) or not math.isfinite(offset):
        raise InputError(f"weight_offset={offset!r} must be a finite real number (0 by default, 1 for Gemma)")
    return float(offset)


def row_stride(t: Any) -> Optional[int]:
    """The uniform distance between the rows of t (its last dimension, unit stride, is a row), or None when
    t is not laid out as such rows. Dimensions of size 1 may have any stride."""
    shape, strides = t.shape, t.stride()
    cols = shape[-1]
    if cols > 1 and strides[-1] != 1:
        return None
    dims = [(n, st) for n, st in zip(shape[:-1], strides[:-1]) if n != 1]
    if not dims:
        return cols
    for (n_outer, st_outer), (n_inner, st_inner) in zip(dims, dims[1:]):
        if st_outer != st_inner * n_inner:
            return None
    stride = dims[-1][1]
    return stride if stride >= cols else None


def check_rows(name: str, x: Any) -> RowsShape:
    """x: a tensor of rows (any leading dims over n > 0, rows at least n apart, unit stride along n)."""
    _tensor(name, x)
    try:
        dtype = DType.parse(x.dtype)
    except ValueError:
        raise InputError(f"{name} has dtype {x.dtype}; fused_ar takes bfloat16, float16 or float32") from None
    if x.dim() < 1:
        raise InputError(f"{name} has shape {tuple(x.shape)}: it needs at least one dimension (n)")
    cols = x.shape[-1]
    if cols == 0:
        raise InputError(f"{name} has n=0: n must be positive")
    rows = x.numel() // cols
    stride = row_stride(x)
    if stride is None:
        raise InputError(f"{name} with shape {tuple(x.shape)} and strides {x.stride()} is not rows: the last "
                         "dimension must have stride 1 and the rows one stride of at least n apart")
    if cols > INT32_MAX or rows > INT32_MAX:
        raise InputError(f"{name} has shape {tuple(x.shape)}: rows and n must each fit in int32")
    return RowsShape(dtype, rows, cols, stride)


def check_like(name: str, t: Any, ref_name: str, ref: Any) -> RowsShape:
    """t must be rows of ref's dtype and shape, with a row layout of its own (device: check_devices)."""
    _tensor(name, t)
    if t.dtype != ref.dtype:
        raise InputError(f"{name} has dtype {t.dtype} but {ref_name} has {ref.dtype}; they must match")
    if tuple(t.shape) != tuple(ref.shape):
        raise InputError(f"{name} has shape {tuple(t.shape)} but {ref_name} has {tuple(ref.shape)}; they must match")
    return check_rows(name, t)


def check_weight(weight: Any, x_dtype: DType, cols: int) -> WeightKind:
    """None (ones), x's dtype, or fp32 with a 16-bit x; 1-D of length n, unit stride."""
    if weight is None:
        return WeightKind.NONE
    _tensor("weight", weight)
    if weight.dim() != 1 or weight.shape[0] != cols:
        raise InputError(f"weight has shape {tuple(weight.shape)}; it must be 1-D of length n={cols}")
    if cols > 1 and weight.stride(0) != 1:
        raise InputError(f"weight has stride {weight.stride()}; it must have unit stride")
    name = str(weight.dtype).removeprefix("torch.")
    if name == x_dtype.torch_name:
        return WeightKind.SAME
    if name == "float32" and x_dtype.itemsize == 2:
        return WeightKind.FP32
    raise InputError(f"weight has dtype {weight.dtype} but x has {x_dtype.torch_name}: the weight takes x's dtype, "
                     "or float32 with a 16-bit x")


@dataclass(frozen=True)
class RmsnormCall:
    """What validation learned of one add + RMSNorm call."""

    x: RowsShape
    residual_stride: Optional[int]  # None: no residual
    weight: WeightKind
    eps: float
    offset: float
    out_stride: Optional[int] = None  # given outputs' layouts (None: allocated, contiguous)
    residual_out_stride: Optional[int] = None
    inplace: bool = False  # an output is its input (out is x, residual_out is residual)


def check_rmsnorm_inputs(x: Any, residual: Any, weight: Any, eps: Any, offset: Any = 0.0) -> RmsnormCall:
    shape = check_rows("x", x)
    residual_stride = None if residual is None else check_like("residual", residual, "x", x).row_stride
    kind = check_weight(weight, shape.dtype, shape.cols)
    return RmsnormCall(shape, residual_stride, kind, check_eps(eps), check_offset(offset))


def check_devices(**tensors: Any) -> None:
    """All tensors on one GPU (torch calls both CUDA and ROCm devices 'cuda'); None entries are absent."""
    given = [(name, t) for name, t in tensors.items() if t is not None]
    (first_name, first), *rest = given
    if first.device.type != "cuda":
        raise InputError(f"{first_name} is on {first.device}; fused_ar ops run on GPU tensors")
    for name, t in rest:
        if t.device != first.device:
            raise InputError(f"{name} is on {t.device} but {first_name} is on {first.device}")


# Outputs that may be the very same memory as an input (in place, as vLLM's fused_add_rms_norm writes x and
# residual): each element is read before it is written, by the same thread.
IN_PLACE = {("out", "x"), ("residual_out", "residual")}


def check_outputs(inputs: dict[str, Any], outputs: dict[str, Optional[Any]], ref: Any,
                  in_place: Optional[set] = None) -> dict[str, RowsShape]:
    """Caller-provided outputs: rows of x's shape and dtype, sharing no memory with an input or each other,
    except an output that is exactly its input where `in_place` (default IN_PLACE) allows it. Returns the
    layouts of the given outputs."""
    allowed = IN_PLACE if in_place is None else in_place
    layouts = {name: check_like(name, t, "x", ref) for name, t in outputs.items() if t is not None}
    seen = [(k, v) for k, v in inputs.items() if v is not None]
    for name, t in ((k, v) for k, v in outputs.items() if v is not None):
        for other_name, other in seen:
            if same_memory(t, other) and (name, other_name) in allowed:
                continue
            if overlaps(t, other):
                rule = " (only out=x and residual_out=residual may be the very same tensor)" if allowed else ""
                raise InputError(f"{name} overlaps {other_name}: outputs must not alias the inputs or each other{rule}")
        seen.append((name, t))
    return layouts


def same_memory(a: Any, b: Any) -> bool:
    return (a.data_ptr() == b.data_ptr() and a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
            and a.device == b.device)


def extent(t: Any) -> int:
    """Elements from a tensor's first element to one past its last, whatever its strides (0 if empty)."""
    if not t.numel():
        return 0
    return 1 + sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()))


def _span(t: Any) -> tuple[int, int, int, int]:
    """(first byte, one past the last byte, row stride in bytes, row bytes) of a tensor of rows; a tensor
    that is not rows (MN-major scales) gives its whole extent and row stride 0."""
    cols = t.shape[-1] if t.dim() else 1
    stride = row_stride(t) if t.dim() else 1
    size = t.element_size()
    start = t.data_ptr()
    end = start + extent(t) * size
    return start, end, 0 if stride is None else stride * size, cols * size


def overlaps(a: Any, b: Any) -> bool:
    """Whether two tensors of rows share a byte. Exact for rows at one stride (two halves of a wider
    buffer are disjoint); otherwise whether their spans meet."""
    if a.device != b.device or not a.numel() or not b.numel():
        return False
    a0, a1, sa, wa = _span(a)
    b0, b1, sb, wb = _span(b)
    if a1 <= b0 or b1 <= a0:
        return False
    if sa != sb or sa == 0:
        return True
    lo, hi, w_lo, w_hi = (a0, b0, wa, wb) if a0 <= b0 else (b0, a0, wb, wa)
    r = (hi - lo) % sa  # where the later tensor's rows start within the earlier one's row period
    return r < w_lo or sa - r < w_hi


# -- FP8 output (docs/design.md section 1b) --------------------------------------------------------------
# How a call's per-group scales are returned: fp32 (max(amax / M, 1 / (512 M))), those rounded up to powers of
# two as fp32, or as UE8M0 bytes (the exponent) four to an int32 (docs/design.md section 1b).
SCALES_FORMATS = {"fp32": Quant.GROUP, "ue8m0": Quant.GROUP_POW2, "ue8m0_packed": Quant.GROUP_UE8M0}
SCALE_ROWS_ALIGN = 4  # MN-major scales: each column starts 16 bytes (four 32-bit words) after the previous one


@dataclass(frozen=True)
class QuantCall:
    """How a call quantizes its out: the kind, the FP8 format, the group width (per-group kinds; the block of
    FP4 kinds), out's dtype and row length (x's n in FP8, n / 2 bytes in FP4), and the scales' shape, dtype
    and strides (TOKEN: one per row; per group: one per group of each row, or one int32 per four groups;
    FP4: a byte per block, or the swizzled tiles; STATIC: the given scale's shape). `row_stride` and
    `col_stride` are the kernel's steps, in scale elements (`scale_bytes` each), from a row's scales to the
    next row's and from one scale element of a row to the next; `zeroed`: new scales start as zeros (the
    swizzled tiles' padding rows, which no row writes)."""

    kind: Quant
    fmt: Fp8Format
    group: int
    scales_shape: tuple
    scales_strides: tuple = ()
    scales_dtype: str = "float32"
    row_stride: int = 1
    col_stride: int = 1
    out_dtype: str = ""
    out_cols: int = 0
    scale_bytes: int = 4
    zeroed: bool = False
    # Elements of x per byte of out, over one (2 for FP4): scales out's addresses to x's alignment. A field, not
    # a property: the per-call path reads it, and Quant's kind properties cost 0.4 us a read.
    out_ratio: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "out_ratio", 2 if self.kind.fp4 else 1)

    def launch_args(self, cols: int) -> tuple[dict[str, int], int]:
        """(the kernel's fixed scale arguments, dynamic shared memory bytes) for rows of `cols` columns."""
        if self.kind is Quant.STATIC:
            return {}, 0
        fixed = {"group": self.group, "scales_stride": self.row_stride, "scales_col_stride": self.col_stride}
        return fixed, 4 * (cols // self.group) if self.kind.per_group else 0

    def new_out(self, x: Any, lead: Optional[tuple] = None) -> Any:
        """A quantized out on x's device for the rows `lead` (None: x's own rows; then FP8's is empty_like(x),
        which costs half of empty on the per-call path, and a valid x is dense only where it is contiguous, so
        its rows come out contiguous, as the plan writes them)."""
        import torch

        dtype = getattr(torch, self.out_dtype)
        if lead is None and self.out_ratio == 1:
            return torch.empty_like(x, dtype=dtype)
        return torch.empty((tuple(x.shape[:-1]) if lead is None else lead) + (self.out_cols,), dtype=dtype,
                           device=x.device)

    def new_scales(self, device: Any) -> Any:
        """An output tensor for the scales, laid out as the kernel writes them."""
        import torch

        dtype = getattr(torch, self.scales_dtype)
        if self.zeroed:  # the swizzled tiles: contiguous
            return torch.zeros(self.scales_shape, dtype=dtype, device=device)
        return torch.empty_strided(self.scales_shape, self.scales_strides, dtype=dtype, device=device)


def fp8_format(fp8_dtype: Any, native: Fp8Format) -> Fp8Format:
    """A torch float8 dtype (or its name, 'e4m3fn' / 'e4m3fnuz') as a format; None is the target's native one."""
    if fp8_dtype is None:
        return native
    name = str(fp8_dtype).removeprefix("torch.").removeprefix("float8_")
    try:
        return Fp8Format(name)
    except ValueError:
        raise InputError(f"fp8_dtype={fp8_dtype!r}: fused_ar writes float8_e4m3fn or float8_e4m3fnuz") from None


def _contiguous_strides(shape: tuple) -> tuple:
    """Row-major strides of `shape` (symbolic sizes stay symbolic: no comparison, so no guard)."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step = step * n
    return tuple(reversed(strides))


def _group_scales(kind: Quant, fmt: Fp8Format, group: int, lead: tuple, groups: int, mn_major: bool,
                  cols: int) -> QuantCall:
    """The per-group QuantCall: `groups` scales of each row, as fp32 or packed four to an int32 word, row-major
    or MN-major (each word column holds every row's word, the columns SCALE_ROWS_ALIGN words aligned)."""
    words = -(-groups // 4) if kind is Quant.GROUP_UE8M0 else groups
    dtype = "int32" if kind is Quant.GROUP_UE8M0 else "float32"
    shape = lead + (words,)
    if not mn_major:
        return QuantCall(kind, fmt, group, shape, _contiguous_strides(shape), dtype, words, 1, fmt.torch_name, cols)
    rows = _contiguous_strides((1,) + lead)[0]  # the product of lead (symbolic sizes stay symbolic)
    column = -(-rows // SCALE_ROWS_ALIGN) * SCALE_ROWS_ALIGN
    return QuantCall(kind, fmt, group, shape, _contiguous_strides(lead) + (column,), dtype, 1, column, fmt.torch_name,
                     cols)


def check_quant(x: Any, cols: int, dtype: DType, scale: Any, group_size: Any, fp8_dtype: Any,
                native: Fp8Format, scales_format: Any = "fp32", scales_mn_major: Any = False) -> QuantCall:
    fmt = fp8_format(fp8_dtype, native)
    lead = tuple(x.shape[:-1])
    if not isinstance(scales_format, str) or scales_format not in SCALES_FORMATS:
        raise InputError(f"scales_format={scales_format!r}: it must be one of {', '.join(map(repr, SCALES_FORMATS))}")
    if not isinstance(scales_mn_major, bool):
        raise InputError(f"scales_mn_major={scales_mn_major!r}: it must be True or False")
    if (scales_format != "fp32" or scales_mn_major) and (scale is not None or group_size is None):
        given = f"scales_format={scales_format!r}" if scales_format != "fp32" else "scales_mn_major=True"
        raise InputError(f"{given} applies to per-group scales: give group_size (and no static scale)")
    if scale is not None:
        if group_size is not None:
            raise InputError(f"scale and group_size={group_size!r} were both given: a static scale, or scales per "
                             "group computed by the kernel, not both")
        _tensor("scale", scale)
        if scale.dtype != _torch_dtype("float32") or scale.numel() != 1:
            raise InputError(f"scale has dtype {scale.dtype} and {scale.numel()} elements: it must be one float32")
        return QuantCall(Quant.STATIC, fmt, 0, tuple(scale.shape), tuple(scale.stride()), out_dtype=fmt.torch_name,
                         out_cols=cols)
    if group_size is None:
        shape = lead + (1,)
        return QuantCall(Quant.TOKEN, fmt, 0, shape, _contiguous_strides(shape), out_dtype=fmt.torch_name, out_cols=cols)
    per_pack = DEFAULT_PACK // dtype.itemsize
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0 or cols % group_size \
            or group_size % per_pack:
        raise InputError(f"group_size={group_size!r}: it must divide n={cols} into groups of whole "
                         f"{DEFAULT_PACK}-byte packs (a multiple of {per_pack} for {dtype.value})")
    return _group_scales(SCALES_FORMATS[scales_format], fmt, group_size, lead, cols // group_size, scales_mn_major, cols)


def check_fp8_call(x: Any, call: RmsnormCall, fp8: dict[str, Any], native: Fp8Format, out: Any) -> tuple[QuantCall, Optional[RowsShape]]:
    """The quantization rules of a call (its fp8_arguments or fp4_arguments): how it quantizes, and out's
    layout when given."""
    if fp8["fp4"] is not None:
        quant = check_fp4(x, call.x.cols, fp8["fp4"], fp8["swizzled"], fp8["global_scale"])
    else:
        quant = check_quant(x, call.x.cols, call.x.dtype, fp8["scale"], fp8["group_size"], fp8["fp8_dtype"], native,
                            fp8["scales_format"], fp8["scales_mn_major"])
    static = quant.kind is Quant.STATIC
    return quant, check_quant_outputs(quant, x, out, fp8["scale_copy"] if static else fp8["scales"])


# fp4_format -> the kind: NVFP4, or MXFP4 with OCP's rounding of the scale, AMD aiter's (RCEIL) or Quark's (EVEN)
FP4_FORMATS = {"nvfp4": Quant.NVFP4, "mxfp4": Quant.MXFP4, "mxfp4_rceil": Quant.MXFP4_RCEIL,
               "mxfp4_even": Quant.MXFP4_EVEN}


def check_fp4(x: Any, cols: int, fp4_format: Any, swizzled: Any, global_scale: Any) -> QuantCall:
    """FP4 output: E2M1 values two a byte (..., n / 2); NVFP4 takes a global scale (one float32 on x's device)
    and returns E4M3 block scales per 16 columns, row-major (..., n / 16) or swizzled (1-D, the 128 x 4 tiles);
    MXFP4 (each rounding of its scale) UE8M0 bytes per 32 columns (..., n / 32). n must be a multiple of the
    block."""
    if not isinstance(fp4_format, str) or fp4_format not in FP4_FORMATS:
        raise InputError(f"fp4_format={fp4_format!r}: it must be one of {', '.join(map(repr, FP4_FORMATS))}")
    if not isinstance(swizzled, bool):
        raise InputError(f"scales_swizzled={swizzled!r}: it must be True or False")
    kind = FP4_FORMATS[fp4_format]
    if kind.mxfp4:
        if swizzled:
            raise InputError("scales_swizzled=True: the swizzled tiles are NVFP4's layout; MXFP4 scales are row-major")
        if global_scale is not None:
            raise InputError(f"global_scale was given with fp4_format={fp4_format!r}: MXFP4's scales are powers of two "
                             "alone")
    else:
        kind = Quant.NVFP4_SWIZZLED if swizzled else Quant.NVFP4
        if global_scale is None:
            raise InputError("fp4_format='nvfp4' needs global_scale (one float32 on x's device: the per-tensor scale "
                             "of the NVFP4 convention, block scale = e4m3(global_scale * amax / 6))")
        _tensor("global_scale", global_scale)
        if global_scale.dtype != _torch_dtype("float32") or global_scale.numel() != 1:
            raise InputError(f"global_scale has dtype {global_scale.dtype} and {global_scale.numel()} elements: it "
                             "must be one float32")
    block = kind.fp4_block
    if cols % block:
        raise InputError(f"x has n={cols}: {fp4_format} quantizes blocks of {block} columns, so n must be a multiple "
                         f"of {block}")
    lead = tuple(x.shape[:-1])
    blocks = cols // block
    dtype = "uint8" if kind.mxfp4 else "float8_e4m3fn"
    common = dict(out_dtype="uint8", out_cols=cols // 2, scale_bytes=1)
    if kind is Quant.NVFP4_SWIZZLED:
        rows = _contiguous_strides((1,) + lead)[0]
        size = -(-rows // 128) * 128 * (-(-blocks // 4) * 4)
        return QuantCall(kind, Fp8Format.E4M3FN, block, (size,), (1,), dtype, 0, 1, zeroed=True, **common)
    shape = lead + (blocks,)
    return QuantCall(kind, Fp8Format.E4M3FN, block, shape, _contiguous_strides(shape), dtype, blocks, 1, **common)


def check_scale_value(scale: Any, name: str = "scale") -> None:
    """A given scale's value (a static FP8 scale, NVFP4's global scale): positive and finite (one device read;
    the first call of a shape makes it)."""
    value = float(scale.reshape(-1)[0])
    if not math.isfinite(value) or value <= 0:
        what = "a static FP8 scale" if name == "scale" else f"the {name}"
        raise InputError(f"{name}={value!r}: {what} must be positive and finite")


def check_quant_outputs(quant: QuantCall, x: Any, out: Any, scales_out: Any) -> Optional[RowsShape]:
    """The quantized out (FP8: x's shape in the format's dtype; FP4: uint8 bytes of n / 2; rows) and the
    scales (quant's shape, dtype and strides; with a static scale, the copy of it: one float32 of its shape).
    Returns out's layout when given."""
    layout = None
    if out is not None:
        _tensor("out", out)
        shape = tuple(x.shape[:-1]) + (quant.out_cols,)
        if str(out.dtype).removeprefix("torch.") != quant.out_dtype or tuple(out.shape) != shape:
            raise InputError(f"out has dtype {out.dtype} and shape {tuple(out.shape)}: it must be "
                             f"{quant.out_dtype} of shape {shape}")
        stride = row_stride(out)
        if stride is None:
            raise InputError(f"out with shape {tuple(out.shape)} and strides {out.stride()} is not rows")
        layout = RowsShape(DType.FP32, x.numel() // x.shape[-1], quant.out_cols, stride)  # dtype: unused here
    if scales_out is not None:
        _tensor("scales_out", scales_out)
        if quant.kind is Quant.STATIC:  # the scale's copy: one float32, shaped as the scale
            if scales_out.dtype != _torch_dtype("float32") or tuple(scales_out.shape) != quant.scales_shape:
                raise InputError(f"scales_out has dtype {scales_out.dtype} and shape {tuple(scales_out.shape)}: with "
                                 f"a static scale it receives the scale's value, float32 of shape {quant.scales_shape}")
            return layout
        if scales_out.dtype != _torch_dtype(quant.scales_dtype) or tuple(scales_out.shape) != quant.scales_shape \
                or (scales_out.numel() and tuple(scales_out.stride()) != quant.scales_strides):
            raise InputError(f"scales_out has dtype {scales_out.dtype}, shape {tuple(scales_out.shape)} and strides "
                             f"{tuple(scales_out.stride())}: it must be {quant.scales_dtype} of shape "
                             f"{quant.scales_shape} and strides {quant.scales_strides}")
    return layout


def _torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


# -- what the kernels take ------------------------------------------------------------------------------
def row_pack(itemsize: int, pointers: list[int], strides: list[int]) -> int:
    """add_rmsnorm's bytes per access: 16 where every row start is 16-byte aligned, else one element."""
    if all(p % DEFAULT_PACK == 0 for p in pointers) and all(st * itemsize % DEFAULT_PACK == 0 for st in strides):
        return DEFAULT_PACK
    return itemsize


def cross_gpu_limit(cols: int, dtype: DType, named: dict[str, Any]) -> Optional[str]:
    """What the cross-GPU kernels cannot take (they move whole 16-byte packs; x itself is copied into the
    staging buffer, or read in place where it is contiguous), or None: the communicator then serves the
    call through its fallback, or refuses a forced path."""
    per_pack = DEFAULT_PACK // dtype.itemsize
    if cols % per_pack:
        return (f"x has n={cols}: the cross-GPU kernels take a multiple of {per_pack} for {dtype.value} "
                f"({DEFAULT_PACK}-byte accesses)")
    for name, t in named.items():
        if t is None:
            continue
        stride = row_stride(t) if t.dim() else 1
        if t.data_ptr() % DEFAULT_PACK or (stride or 0) * t.element_size() % DEFAULT_PACK:
            return (f"{name} has rows at address {t.data_ptr():#x} with stride {stride}: the cross-GPU kernels "
                    f"need every row {DEFAULT_PACK}-byte aligned (a view at an odd offset?)")
    return None

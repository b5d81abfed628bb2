"""Input rules shared by every op (local and, later, the communicator's): checked before any launch.

Each violation raises InputError naming the offending value and the rule. Nothing here allocates,
compiles or launches. Device placement is checked last, so every other rule is checkable anywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from .errors import InputError, NoGpuError, UnsupportedShapeError
from .spec import DEFAULT_PACK, DType

INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class RowsShape:
    dtype: DType
    rows: int
    cols: int


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


def check_rows(name: str, x: Any, pack: int = DEFAULT_PACK, *, kernel: bool = True) -> RowsShape:
    """x: a contiguous tensor of rows (any leading dims, last dim n > 0). With `kernel`, also what the
    kernels take (kernel_limits); the communicator's fallback serves the rest."""
    _tensor(name, x)
    try:
        dtype = DType.parse(x.dtype)
    except ValueError:
        raise InputError(f"{name} has dtype {x.dtype}; fused_ar takes bfloat16, float16 or float32") from None
    if x.dim() < 1:
        raise InputError(f"{name} has shape {tuple(x.shape)}: it needs at least one dimension (n)")
    if not x.is_contiguous():
        raise InputError(f"{name} with shape {tuple(x.shape)} and strides {x.stride()} is not contiguous")
    cols = x.shape[-1]
    rows = x.numel() // cols if cols else 0
    if cols == 0:
        raise InputError(f"{name} has n=0: n must be positive")
    if cols > INT32_MAX or rows > INT32_MAX:
        raise InputError(f"{name} has shape {tuple(x.shape)}: rows and n must each fit in int32")
    problem = kernel_limits(name, x, pack) if kernel else None
    if problem is not None:
        raise UnsupportedShapeError(problem)
    return RowsShape(dtype, rows, cols)


def kernel_limits(name: str, x: Any, pack: int = DEFAULT_PACK) -> Optional[str]:
    """What the kernels cannot take in a valid tensor of rows (row width, alignment), or None."""
    per_pack = pack // x.element_size()
    if x.shape[-1] % per_pack:
        return (f"{name} has n={x.shape[-1]}: n must be a positive multiple of {per_pack} for "
                f"{DType.parse(x.dtype).value} ({pack}-byte accesses)")
    if x.data_ptr() % pack:
        return (f"{name} starts at address {x.data_ptr():#x}, not {pack}-byte aligned (a view at an odd "
                "offset?); pass a contiguous copy")
    return None


def first_kernel_limit(tensors: dict[str, Any]) -> Optional[str]:
    for name, t in tensors.items():
        problem = kernel_limits(name, t.reshape(-1) if t.dim() == 0 else t)
        if problem is not None:
            return problem
    return None


def check_like(name: str, t: Any, ref_name: str, ref: Any, *, kernel: bool = True) -> None:
    """t must be a tensor of ref's dtype and shape (device is checked by check_devices)."""
    _tensor(name, t)
    if t.dtype != ref.dtype:
        raise InputError(f"{name} has dtype {t.dtype} but {ref_name} has {ref.dtype}; they must match")
    if tuple(t.shape) != tuple(ref.shape):
        raise InputError(f"{name} has shape {tuple(t.shape)} but {ref_name} has {tuple(ref.shape)}; they must match")
    check_rows(name, t, kernel=kernel)


def check_devices(**tensors: Any) -> None:
    """All tensors on one GPU (torch calls both CUDA and ROCm devices 'cuda')."""
    (first_name, first), *rest = tensors.items()
    if first.device.type != "cuda":
        raise InputError(f"{first_name} is on {first.device}; fused_ar ops run on GPU tensors")
    for name, t in rest:
        if t.device != first.device:
            raise InputError(f"{name} is on {t.device} but {first_name} is on {first.device}")


def check_outputs(inputs: dict[str, Any], outputs: dict[str, Optional[Any]], ref: Any, *,
                  kernel: bool = True) -> None:
    """Caller-provided outputs: the shape and dtype of x, and sharing memory with no input or each other."""
    given = {k: v for k, v in outputs.items() if v is not None}
    for name, t in given.items():
        check_like(name, t, "x", ref, kernel=kernel)
    seen = list(inputs.items())
    for name, t in given.items():
        for other_name, other in seen:
            if _overlaps(t, other):
                raise InputError(f"{name} overlaps {other_name}: the op is out-of-place, outputs must not alias")
        seen.append((name, t))


def _overlaps(a: Any, b: Any) -> bool:
    a0, b0 = a.data_ptr(), b.data_ptr()
    a1, b1 = a0 + a.numel() * a.element_size(), b0 + b.numel() * b.element_size()
    return a.device == b.device and a0 < b1 and b0 < a1


def check_rmsnorm_inputs(x: Any, residual: Any, weight: Any, eps: Any, *,
                         kernel: bool = True) -> tuple[RowsShape, float]:
    shape = check_rows("x", x, kernel=kernel)
    check_like("residual", residual, "x", x, kernel=kernel)
    _tensor("weight", weight)
    if weight.dtype != x.dtype:
        raise InputError(f"weight has dtype {weight.dtype} but x has {x.dtype}; they must match")
    if weight.dim() != 1 or weight.shape[0] != shape.cols:
        raise InputError(f"weight has shape {tuple(weight.shape)}; it must be 1-D of length n={shape.cols}")
    check_rows("weight", weight, kernel=kernel)
    eps = check_eps(eps)
    return shape, eps

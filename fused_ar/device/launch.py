"""From spec to a running kernel: cached compile, per-process function handles, typed launch.

The hot path is one dict lookup per (spec, device) plus argument packing; rendering, hashing and the
disk are touched only on a process's first use of a spec.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Iterable, Optional, Sequence

from ..jit.cache import default_cache
from ..jit.kernels import kernel_def
from ..backends import compiler_for, current_runtime, device_arch
from ..jit.runtime import check_grid, pack_args
from ..jit.spec import DEFAULT_PACK, DType, Fp8Format, KernelSpec, Op, Quant, WeightKind

# Per-process memos: a device's arch never changes, and a loaded function stays valid for the process.
_archs: dict[int, str] = {}
_functions: dict[tuple[KernelSpec, int], Any] = {}


def arch_of(device: int) -> str:
    arch = _archs.get(device)
    if arch is None:
        arch = _archs[device] = device_arch(device)
    return arch


def spec_for(op: Op, dtype: DType, device: int, block: int, ngpus: int = 1, pack: int = DEFAULT_PACK,
             weight: WeightKind = WeightKind.SAME, residual: bool = True, inplace: bool = False,
             quant: Quant = Quant.NONE, fp8: Fp8Format = Fp8Format.E4M3FN, short_rows: bool = False) -> KernelSpec:
    return _spec(op, dtype, arch_of(device), pack, ngpus, block, weight, residual, inplace, quant, fp8, short_rows)


@lru_cache(maxsize=4096)
def _spec(op: Op, dtype: DType, arch: str, pack: int, ngpus: int, block: int, weight: WeightKind, residual: bool,
          inplace: bool, quant: Quant, fp8: Fp8Format, short_rows: bool) -> KernelSpec:
    """Specs are values: build (and validate) each once per process, not on every call."""
    return KernelSpec(op, dtype, arch, pack, ngpus, block, weight, residual, inplace, quant, fp8, short_rows)


def function(spec: KernelSpec, device: int) -> Any:
    """The loaded function for `spec` on `device`, compiling (or reading the disk cache) on first use."""
    fn = _functions.get((spec, device))
    if fn is None:
        kernel = default_cache().get(spec, compiler_for(spec.arch)).kernel
        fn = _functions[(spec, device)] = current_runtime().load(kernel, spec.kernel_name, device)
    return fn


def preload(specs: Iterable[KernelSpec], device: int) -> None:
    """Loads every spec's function now (compiling or reading the disk cache). Loading
    waits for the whole device, so whoever launches ranks that spin for each other from one thread must
    load first: a load between two ranks' launches would wait on the launched rank, which waits on the
    unlaunched one, until FUSED_AR_TIMEOUT_S."""
    for spec in specs:
        function(spec, device)


def named_args(spec: KernelSpec, **values: Any) -> list[Any]:
    """A kernel's arguments in its C parameter order from their names; the ones not named are 0."""
    params = kernel_def(spec.op).params
    unknown = set(values) - {name for name, _ in params}
    if unknown:
        raise ValueError(f"{spec.op.value} has no parameter {sorted(unknown)}")
    return [values.get(name, 0) for name, _ in params]


def launch(spec: KernelSpec, device: int, grid: int, args: Sequence[Any], stream: Optional[int] = None) -> None:
    """Launches `spec` with `args` (Python values, packed by the op's C parameter list) on `stream`,
    torch's current stream of `device` by default."""
    kdef = kernel_def(spec.op)
    packed = pack_args(kdef, args)
    check_grid(kdef, grid, {name: value for (name, _), value in zip(kdef.params, args)})
    fn = function(spec, device)
    if stream is None:
        import torch

        stream = torch.cuda.current_stream(device).cuda_stream
    current_runtime().launch(fn, grid, spec.block, packed, stream)

"""fused_ar: JIT-compiled GPU kernels fusing the tensor-parallel AllReduce with residual add + RMSNorm.

`import fused_ar` is cheap: torch, hip-python and cuda-python load only when a name that needs them is
first used (module-level __getattr__), so serving processes can import it anywhere.

The sub-packages follow one call's flow, and imports point down it only: jit/ (spec, render, the compiler
and runtime interfaces, cache) <- backends/ (nvidia/, amd/, and the one chooser) <- device/ (launch, plans,
input rules, the single-GPU ops) <- comm/ (the communicator and its IPC, graphs, policy, probe) <- this
level (the public names, torch ops, CLI, demo, bench). errors, env and _version sit below them all.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from ._version import __version__

# public name -> module that defines it (relative to this package)
_LAZY = {
    "add_rmsnorm": "device.ops",
    "add_rmsnorm_fp8": "device.ops",
    "add_rmsnorm_fp4": "device.ops",
    "Communicator": "comm.communicator",
    "KernelSpec": "jit.spec",
    "DType": "jit.spec",
    "Op": "jit.spec",
    "compiler_for": "backends",
    "default_cache": "jit.cache",
    "FusedArError": "errors",
    "InputError": "errors",
    "CompileError": "errors",
    "CompilerUnavailableError": "errors",
    "UnsupportedArchError": "errors",
    "CacheTrustError": "errors",
    "ConfigError": "errors",
    "DeviceError": "errors",
    "NoGpuError": "errors",
    "require_gpu": "device.validate",
    "device_index": "device.validate",
    "UnsupportedShapeError": "errors",
    "PeerTimeoutError": "errors",
    "MismatchError": "errors",
    "register_torch_ops": "torch_ops",
}
# Names whose first use also defines torch.ops.fused_ar.* (a communicator is what those ops call).
_WITH_TORCH_OPS = frozenset({"Communicator"})

__all__ = ["__version__", "vllm_fusion_pass", *_LAZY]


def vllm_fusion_pass(graph: Any) -> None:
    """vLLM's `post_grad_custom_post_pass` by name, without the platform plug-in:
    `--compilation-config '{"inductor_passes": {"post_grad_custom_post_pass": "fused_ar.vllm_fusion_pass"}}'`.
    Rewrites all-reduce -> RMSNorm (-> static FP8) chains of a post-grad graph into fused_ar's op (vLLM looks
    the name up in this module's namespace, so it is defined here; the work is imported on first call)."""
    from .integrations.vllm_fusion import rewrite

    rewrite(graph)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fused_ar' has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    if name in _WITH_TORCH_OPS:
        import_module(".torch_ops", __name__)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)

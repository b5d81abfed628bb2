"""The classes vLLM resolves by name once fused_ar's platform plug-in is active: subclasses of vLLM's CUDA and
ROCm platforms naming fused_ar's device communicator and pass manager, and those two subclasses.

Each class is built on first access (module `__getattr__`), importing only the vLLM module it derives
from: vLLM resolves the platform class while it is still defining `vllm.platforms.current_platform`, so
importing vLLM's communicator or pass manager (which read `current_platform`) then would recurse. They are
resolved later, when vLLM builds its groups and its compiler.
"""

from __future__ import annotations

from typing import Any, Callable

_HERE = __name__
_built: dict[str, type] = {}


def _cuda_platform() -> type:
    from vllm.platforms.cuda import CudaPlatform

    return _platform(CudaPlatform, "FusedArCudaPlatform")


def _rocm_platform() -> type:
    from vllm.platforms.rocm import RocmPlatform

    return _platform(RocmPlatform, "FusedArRocmPlatform")


def _platform(base: type, name: str) -> type:
    def get_device_communicator_cls(cls: type) -> str:
        return f"{_HERE}.FusedArCudaCommunicator"

    def get_pass_manager_cls(cls: type) -> str:
        return f"{_HERE}.FusedArPassManager"

    return type(name, (base,), {"__module__": _HERE, "__doc__": f"vLLM's {base.__name__}, with fused_ar's device "
                                "communicator and pass manager.",
                                "get_device_communicator_cls": classmethod(get_device_communicator_cls),
                                "get_pass_manager_cls": classmethod(get_pass_manager_cls)})


def _communicator() -> type:
    from vllm.distributed.device_communicators.cuda_communicator import CudaCommunicator

    from .vllm import install

    class FusedArCudaCommunicator(CudaCommunicator):
        """vLLM's communicator (CUDA and ROCm); a `tp` group's custom all-reduce is fused_ar's
        (fused_ar.integrations.vllm.install)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            install(self)

    FusedArCudaCommunicator.__module__ = _HERE
    return FusedArCudaCommunicator


def _pass_manager() -> type:
    from vllm.compilation.passes.pass_manager import PostGradPassManager

    from .vllm import tp_adapter
    from .vllm_fusion import fusion_pass

    class FusedArPassManager(PostGradPassManager):
        """vLLM's post-grad passes, then fused_ar's all-reduce + RMSNorm fusion (after the built-in ones, so it
        also meets norm + FP8 that vLLM fused already)."""

        def configure(self, config: Any) -> None:
            super().configure(config)
            extra = fusion_pass(config, tp_adapter())
            if extra is not None:
                self.passes.append(extra)

    FusedArPassManager.__module__ = _HERE
    return FusedArPassManager


_BUILDERS: dict[str, Callable[[], type]] = {"FusedArCudaPlatform": _cuda_platform, "FusedArRocmPlatform": _rocm_platform,
                                            "FusedArCudaCommunicator": _communicator,
                                            "FusedArPassManager": _pass_manager}


def __getattr__(name: str) -> type:
    builder = _BUILDERS.get(name)
    if builder is None:
        raise AttributeError(f"module {_HERE!r} has no attribute {name!r}")
    if name not in _built:
        _built[name] = builder()
        _built[name].__qualname__ = name
    return _built[name]

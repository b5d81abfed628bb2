"""Shared fixtures: a private kernel cache per test session, and the `gpu` marker's skip rule."""

from __future__ import annotations

import os

import pytest

# N emulated ranks on one GPU run on N streams that must all make progress at once; CUDA maps streams onto
# CUDA_DEVICE_MAX_CONNECTIONS hardware queues (8 by default), and two ranks sharing one would wait on each
# other. Read when the CUDA context is created, so set before any test touches the GPU.
os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")


def _gpu_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def pytest_addoption(parser):
    parser.addoption("--require-hiprtc", action="store_true",
                     help="fail (not skip) the real-hiprtc tests where hiprtc cannot be loaded (the CI command)")
    parser.addoption("--require-engines", action="store_true",
                     help="fail (not skip) the engine plug-in tests where scripts/engines.sh did not unpack vLLM and "
                          "SGLang (they still skip when the package registry could not be reached)")


def pytest_collection_modifyitems(config, items):
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a GPU (torch.cuda.is_available() is False here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    """Tests never read or write the user's real cache."""
    root = tmp_path_factory.mktemp("fused_ar_cache")
    old = {k: os.environ.get(k) for k in ("FUSED_AR_CACHE_DIR", "FUSED_AR_LOCK_DIR")}
    os.environ["FUSED_AR_CACHE_DIR"] = str(root / "cache")
    os.environ["FUSED_AR_LOCK_DIR"] = str(root / "locks")
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v

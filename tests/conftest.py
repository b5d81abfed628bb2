"""Shared fixtures: a private kernel cache per test session, and the `gpu` marker's skip rule."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ENGINES = Path(__file__).resolve().parents[1] / ".venv" / "engines"  # what scripts/engines.sh unpacks

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


@pytest.fixture(scope="session")
def engines_site(request) -> Path:
    """The directory holding vLLM's and SGLang's own modules (and triton, which SGLang imports); skips where
    the package registry could not be reached, fails under --require-engines where they were never unpacked."""
    unreachable = ENGINES / "unreachable"
    if unreachable.is_file():
        pytest.skip(f"the engines' modules could not be downloaded: {unreachable.read_text().strip()}")
    if not (ENGINES / "site" / "vllm").is_dir() or not (ENGINES / "site" / "sglang").is_dir():
        message = "vLLM's and SGLang's modules are not unpacked: run bash scripts/engines.sh"
        if request.config.getoption("--require-engines"):
            pytest.fail(message)
        pytest.skip(message)
    return ENGINES / "site"

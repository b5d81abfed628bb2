"""Path choice for the cross-GPU kernels: the threshold table, its environment overrides, forced paths."""

from __future__ import annotations

import pytest

from fused_ar.errors import ConfigError, InputError
from fused_ar.jit.kernels import CROSS_GPU_NGPUS
from fused_ar.comm.policy import ONE_STAGE_MAX_BYTES, KiB, one_stage_max_bytes, use_two_stage
from fused_ar.jit.spec import Platform


def test_table_covers_every_platform_and_group_size():
    assert {(p, n) for p in Platform for n in CROSS_GPU_NGPUS} == set(ONE_STAGE_MAX_BYTES)
    assert ONE_STAGE_MAX_BYTES[(Platform.HIP, 8)] == 224 * KiB and ONE_STAGE_MAX_BYTES[(Platform.HIP, 2)] == 896 * KiB
    assert ONE_STAGE_MAX_BYTES[(Platform.CUDA, 8)] == 512 * KiB


@pytest.mark.parametrize("platform,ngpus", [(Platform.HIP, 4), (Platform.CUDA, 8)])
def test_auto_switches_at_the_threshold(platform, ngpus):
    limit = ONE_STAGE_MAX_BYTES[(platform, ngpus)]
    assert not use_two_stage("auto", platform, ngpus, limit)
    assert use_two_stage("auto", platform, ngpus, limit + 16)


def test_forced_paths_ignore_size_and_environment(monkeypatch):
    monkeypatch.setenv("FUSED_AR_1STAGE", "1")
    assert use_two_stage("2stage", Platform.CUDA, 8, 16)
    assert not use_two_stage("1stage", Platform.CUDA, 8, 1 << 30)


def test_environment_overrides(monkeypatch):
    monkeypatch.setenv("FUSED_AR_1STAGE", "0")
    assert use_two_stage("auto", Platform.CUDA, 2, 16)
    monkeypatch.setenv("FUSED_AR_1STAGE", "1")
    assert not use_two_stage("auto", Platform.CUDA, 2, 1 << 30)
    monkeypatch.delenv("FUSED_AR_1STAGE")
    monkeypatch.setenv("FUSED_AR_1STAGE_MAX_BYTES", "4096")
    assert one_stage_max_bytes(Platform.HIP, 8) == 4096
    assert use_two_stage("auto", Platform.HIP, 8, 4112) and not use_two_stage("auto", Platform.HIP, 8, 4096)


@pytest.mark.parametrize("var,value", [("FUSED_AR_1STAGE", "yes"), ("FUSED_AR_1STAGE_MAX_BYTES", "-1"),
                                       ("FUSED_AR_1STAGE_MAX_BYTES", "lots")])
def test_bad_environment_values_name_the_variable(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError, match=var):
        use_two_stage("auto", Platform.CUDA, 8, 16)


def test_unknown_path():
    with pytest.raises(InputError, match="path='fast'"):
        use_two_stage("fast", Platform.CUDA, 8, 16)

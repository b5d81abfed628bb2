"""The peer table and signal layout the kernels read, and the IPC handle round trip through the bindings'
struct (no GPU needed to build and read the struct)."""

from __future__ import annotations

import ctypes
import struct
import types

import pytest

from fused_ar.comm.ipc import TABLE_STRIDE, PeerView
from fused_ar.jit.kernels import DESC_WORDS, MAX_BLOCKS, MAX_RANKS, PEER_TABLE_BYTES, SIGNAL_BYTES, Arg
from fused_ar.comm.report import REPORT_BYTES


def test_peer_table_is_fa_peers_t():
    view = PeerView([0x1000, 0x2000], [0x3000, 0x4000], [0x5000, 0x6000])
    raw = view.table_bytes(0x7000)
    assert len(raw) == TABLE_STRIDE and PEER_TABLE_BYTES == (3 * MAX_RANKS + 2) * 8
    fields = struct.unpack(f"<{3 * MAX_RANKS + 2}Q", raw[:PEER_TABLE_BYTES])
    assert fields[0:2] == (0x1000, 0x2000) and fields[MAX_RANKS:MAX_RANKS + 2] == (0x3000, 0x4000)
    assert fields[2 * MAX_RANKS:2 * MAX_RANKS + 2] == (0x5000, 0x6000) and fields[2] == 0
    assert fields[-2:] == (0x7000, 1)  # report, registered
    assert not any(raw[PEER_TABLE_BYTES:])


def test_graph_tables_name_their_inputs_or_stay_unregistered():
    view = PeerView([0x1000, 0x2000], [0x3000, 0x4000], [0x5000, 0x6000])
    graph = struct.unpack(f"<{3 * MAX_RANKS + 2}Q", view.table_bytes(0x7000, [0xa000, 0xb000])[:PEER_TABLE_BYTES])
    assert graph[0:2] == (0xa000, 0xb000) and graph[MAX_RANKS:MAX_RANKS + 2] == (0x3000, 0x4000) and graph[-1] == 1
    blank = struct.unpack(f"<{3 * MAX_RANKS + 2}Q", view.table_bytes(0x7000, [])[:PEER_TABLE_BYTES])
    assert blank[0:2] == (0, 0) and blank[-2:] == (0x7000, 0)  # a replay records its error, reads nothing


def test_signal_and_report_sizes_match_the_structs():
    assert SIGNAL_BYTES == 4 * (3 * MAX_BLOCKS * MAX_RANKS + MAX_BLOCKS * MAX_RANKS * DESC_WORDS + MAX_BLOCKS + 1)
    assert REPORT_BYTES == 4 * (3 + 2 * DESC_WORDS)


def test_cuda_ipc_handle_bytes_round_trip():
    from cuda.bindings import driver

    from fused_ar.backends.nvidia.runtime import IPC_HANDLE_BYTES

    handle = driver.CUipcMemHandle()
    payload = bytes(range(IPC_HANDLE_BYTES))
    ctypes.memmove(handle.getPtr(), payload, IPC_HANDLE_BYTES)
    assert ctypes.string_at(handle.getPtr(), IPC_HANDLE_BYTES) == payload


def test_hip_ipc_handle_bytes_round_trip():
    from hip import hip

    from fused_ar.backends.amd.runtime import IPC_HANDLE_BYTES

    handle = hip.hipIpcMemHandle_t()
    payload = bytes(range(100, 100 + IPC_HANDLE_BYTES))
    ctypes.memmove(handle.as_c_void_p(), payload, IPC_HANDLE_BYTES)
    assert ctypes.string_at(handle.as_c_void_p(), IPC_HANDLE_BYTES) == payload


def test_cross_gpu_kernels_let_dependents_launch_early_only_for_a_rank_alone_on_its_gpu(monkeypatch):
    """PDL: a dependent resident early on one rank's stream could hold the SM slots another rank sharing the
    GPU needs for the same call; each cross-GPU kernel releases through fa_peer_release(release_early), and
    the communicator passes 1 only where its rank is alone on its device."""
    import fused_ar.comm.communicator as communicator
    from fused_ar.jit.kernels import CROSS_GPU_NGPUS, all_kernels
    from fused_ar.jit.render import kernels_src_dir

    for kdef in all_kernels():
        if kdef.ngpus != CROSS_GPU_NGPUS:
            continue
        assert ("release_early", Arg.I32) in kdef.params, kdef.op
        text = (kernels_src_dir() / kdef.template).read_text()
        assert "fa_peer_release(release_early);" in text and "fa_grid_launch_dependents" not in text, kdef.template
    monkeypatch.setattr(communicator, "current_runtime", lambda: None)  # no device is touched
    comm = communicator.Communicator.__new__(communicator.Communicator)
    comm._init_fields(1, 2, 0, 1 << 20)
    comm._mem = types.SimpleNamespace(signal=0x7F0000001000)  # the rank's memory, as _allocate leaves it
    assert comm._peer_args() == {"own_signal": 0x7F0000001000, "rank": 1, "timeout_ns": comm._timeout_ns,
                                 "release_early": 1}
    comm._ranks_per_device = 2  # Communicator.local_group, or two processes on one GPU
    assert comm._peer_args()["release_early"] == 0


def test_launch_code_writes_only_kernel_parameters():
    """Argument buffers take only their kernel's parameters (a name the kernel does not take raises instead of
    staying a Python attribute), and every field the launch code writes on one is some kernel's parameter."""
    import ast
    from pathlib import Path

    import fused_ar
    from fused_ar.device.plans import ArgBuffer
    from fused_ar.jit.kernels import all_kernels

    for kdef in all_kernels():
        values = ArgBuffer(kdef, {}).values
        for name, _ in kdef.params:
            setattr(values, name, getattr(values, name))
        with pytest.raises(AttributeError):
            values.not_a_parameter = 1
    params = {name for kdef in all_kernels() for name, _ in kdef.params}
    package = Path(fused_ar.__file__).parent
    written = {}
    for path in list((package / "comm").glob("*.py")) + list((package / "device").glob("*.py")):
        assigns = [a for a in ast.walk(ast.parse(path.read_text())) if isinstance(a, ast.Assign)]
        for target in (t for a in assigns for t in a.targets):
            for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
                if isinstance(t, ast.Attribute) and (isinstance(t.value, ast.Name) and t.value.id == "v" or
                                                     isinstance(t.value, ast.Attribute) and t.value.attr == "values"):
                    written.setdefault(t.attr, path.name)
    assert {"peers", "stage_src", "out", "residual_out", "eps"} <= set(written), sorted(written)
    assert set(written) <= params, {n: f for n, f in written.items() if n not in params}

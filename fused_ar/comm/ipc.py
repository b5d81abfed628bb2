"""The memory one rank shares with its group: allocation, the peer table, IPC export and import.

Per rank: a signal allocation (flags and error word, layout of kernels_src/fa_peers.h; uncached on AMD),
a data allocation (tmp buffer, then the input staging buffer, max_bytes each), the peer tables (the eager
one, then GRAPH_TABLES for graph-captured calls) and the host-visible error report (mapped pinned host
memory). Allocated with the platform allocator, never torch's.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Optional

from ..jit.kernels import MAX_RANKS, PEER_TABLE_BYTES, SIGNAL_BYTES
from .report import REPORT_BYTES
from ..jit.runtime import Runtime

_PAGE = 4096
# Peer tables sit TABLE_STRIDE bytes apart; GRAPH_TABLES of them serve graph-captured calls (one per
# captured call, as vLLM's 8 MiB rank_data does: a serving engine captures a few thousand).
TABLE_STRIDE = 256
GRAPH_TABLES = 16384
assert PEER_TABLE_BYTES <= TABLE_STRIDE


def _round_up(n: int, to: int = _PAGE) -> int:
    return (n + to - 1) // to * to


@dataclass
class RankMemory:
    """One rank's own allocations on its device."""

    device: int
    max_bytes: int
    signal: int
    data: int
    table: int
    report_host: int
    report_dev: int
    freed: bool = False

    @property
    def tmp(self) -> int:
        return self.data

    @property
    def staging(self) -> int:
        return self.data + self.max_bytes

    def graph_table(self, entry: int) -> int:
        """Device address of the peer table of graph-captured call `entry` (0 <= entry < GRAPH_TABLES)."""
        return self.table + (1 + entry) * TABLE_STRIDE

    @property
    def error_word(self) -> int:
        """Address of fa_signal_t::error (last field)."""
        return self.signal + SIGNAL_BYTES - 4

    @classmethod
    def allocate(cls, runtime: Runtime, device: int, max_bytes: int) -> "RankMemory":
        max_bytes = _round_up(max_bytes, 16)
        made: list[int] = []
        try:
            made.append(runtime.alloc(_round_up(SIGNAL_BYTES), device, uncached=True))
            made.append(runtime.alloc(2 * max_bytes, device))
            made.append(runtime.alloc((1 + GRAPH_TABLES) * TABLE_STRIDE, device))
            report_host, report_dev = runtime.alloc_host_mapped(_round_up(REPORT_BYTES, 64), device)
        except BaseException:
            for ptr in made:
                runtime.free(ptr, device)
            raise
        return cls(device, max_bytes, *made, report_host, report_dev)

    def free(self, runtime: Runtime) -> None:
        if not self.freed:
            self.freed = True
            for ptr in (self.table, self.data, self.signal):
                runtime.free(ptr, self.device)
            runtime.free_host(self.report_host, self.device)


@dataclass
class PeerView:
    """Every rank's addresses as valid in this process (own ones included), in rank order."""

    inputs: list[int]
    tmps: list[int]
    signals: list[int]
    opened: list[int] = field(default_factory=list)  # IPC mappings this process must close

    def table_bytes(self, report: int, inputs: Optional[list[int]] = None) -> bytes:
        """fa_peers_t, TABLE_STRIDE bytes: input[MAX_RANKS], tmp[MAX_RANKS], signal[MAX_RANKS], report,
        registered, as 64-bit words. `inputs` replaces the staging buffers (a graph-captured call's
        tensors); an empty list gives a table not registered yet."""
        inputs = self.inputs if inputs is None else inputs
        pad = [0] * (MAX_RANKS - len(self.tmps))
        ins = inputs + [0] * (MAX_RANKS - len(inputs))
        table = struct.pack(f"<{3 * MAX_RANKS + 2}Q", *ins, *(self.tmps + pad), *(self.signals + pad), report,
                            int(bool(inputs)))
        return table + bytes(TABLE_STRIDE - len(table))


def export_handles(runtime: Runtime, mem: RankMemory) -> tuple[bytes, bytes]:
    return runtime.ipc_handle(mem.signal), runtime.ipc_handle(mem.data)


def import_peers(runtime: Runtime, rank: int, mem: RankMemory, handles: list[tuple[bytes, bytes]],
                 max_bytes: int) -> PeerView:
    """Opens every other rank's (signal, data) handles; closes what it opened if one fails."""
    view = PeerView([], [], [])
    try:
        for peer, (signal_handle, data_handle) in enumerate(handles):
            if peer == rank:
                signal, data = mem.signal, mem.data
            else:
                signal = runtime.ipc_open(signal_handle, mem.device)
                view.opened.append(signal)
                data = runtime.ipc_open(data_handle, mem.device)
                view.opened.append(data)
            view.signals.append(signal)
            view.tmps.append(data)
            view.inputs.append(data + max_bytes)
    except BaseException:
        close_peers(runtime, view, mem.device)
        raise
    return view


def close_peers(runtime: Runtime, view: PeerView, device: int) -> None:
    while view.opened:
        runtime.ipc_close(view.opened.pop(), device)

"""The memory one rank shares with its group: allocation, the peer table, IPC export and import.

Per rank: a signal allocation (flags and error word, layout of kernels_src/fa_peers.h; uncached on AMD),
a data allocation (tmp buffer, then the input staging buffer, max_bytes each) and a small device table
of every rank's addresses as this process sees them. Allocated with the platform allocator, never torch's.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from .kernels import MAX_RANKS, PEER_TABLE_BYTES, SIGNAL_BYTES
from .runtime import Runtime

_PAGE = 4096


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
    freed: bool = False

    @property
    def tmp(self) -> int:
        return self.data

    @property
    def staging(self) -> int:
        return self.data + self.max_bytes

    @property
    def error_word(self) -> int:
        """Address of fa_signal_t::error (last field)."""
        return self.signal + SIGNAL_BYTES - 4

    @classmethod
    def allocate(cls, runtime: Runtime, device: int, max_bytes: int) -> "RankMemory":
        max_bytes = _round_up(max_bytes, 16)
        signal = runtime.alloc(_round_up(SIGNAL_BYTES), device, uncached=True)
        try:
            data = runtime.alloc(2 * max_bytes, device)
        except BaseException:
            runtime.free(signal, device)
            raise
        try:
            table = runtime.alloc(_round_up(PEER_TABLE_BYTES, 256), device)
        except BaseException:
            runtime.free(signal, device)
            runtime.free(data, device)
            raise
        return cls(device, max_bytes, signal, data, table)

    def free(self, runtime: Runtime) -> None:
        if not self.freed:
            self.freed = True
            for ptr in (self.table, self.data, self.signal):
                runtime.free(ptr, self.device)


@dataclass
class PeerView:
    """Every rank's addresses as valid in this process (own ones included), in rank order."""

    inputs: list[int]
    tmps: list[int]
    signals: list[int]
    opened: list[int] = field(default_factory=list)  # IPC mappings this process must close

    def table_bytes(self) -> bytes:
        """fa_peers_t: input[MAX_RANKS], tmp[MAX_RANKS], signal[MAX_RANKS] as 64-bit addresses."""
        pad = [0] * (MAX_RANKS - len(self.inputs))
        return struct.pack(f"<{3 * MAX_RANKS}Q", *(self.inputs + pad), *(self.tmps + pad), *(self.signals + pad))


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

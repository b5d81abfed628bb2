"""Graph-captured calls: each gets its own peer table whose inputs are the captured tensors' addresses,
filled in when the graph's buffers are registered (after capture, collectively), so replays need no copy.

A rank records (table entry, input address, how peers reach it) per captured call; registration
exchanges those records (over the group, or through a LocalHub for ranks in one process), opens the
peers' allocations and writes every entry's table. Entries are consumed in call order on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..errors import DeviceError, FusedArError
from .ipc import GRAPH_TABLES, PeerView, RankMemory
from ..jit.runtime import Runtime


@dataclass(frozen=True)
class Captured:
    """One captured call's input as its peers can reach it: `handle` (IPC) of the allocation at `base`,
    plus `offset`; no handle for ranks sharing this process (the address itself is valid)."""

    entry: int
    base: int
    offset: int
    handle: Optional[bytes]


class GraphBuffers:
    """One rank's graph tables: which entries are taken, which wait for registration, what it opened."""

    def __init__(self, runtime: Runtime, mem: RankMemory, local: bool) -> None:
        self._runtime, self._mem, self._local = runtime, mem, local
        self.next_entry = 0
        self.pending: list[Captured] = []
        self._exported: dict[int, bytes] = {}  # allocation base -> its IPC handle
        self._opened: dict[bytes, int] = {}  # peer handle -> address here

    def record(self, ptr: int) -> Optional[int]:
        """Takes the next table for a captured call reading `ptr`; returns its device address, or None when
        peers cannot map `ptr` (not exportable: an expandable segment) and the call must stage a copy."""
        if self.next_entry >= GRAPH_TABLES:
            raise FusedArError(f"{GRAPH_TABLES} graph-captured calls on one communicator: no peer table left; "
                               "create the communicator again before capturing more graphs")
        if self._local:
            captured = Captured(self.next_entry, ptr, 0, None)
        else:
            try:
                base, _ = self._runtime.allocation_range(ptr, self._mem.device)
                handle = self._exported.get(base)
                if handle is None:
                    handle = self._exported[base] = self._runtime.ipc_handle(base)
            except DeviceError:
                return None
            captured = Captured(self.next_entry, base, ptr - base, handle)
        self.pending.append(captured)
        self.next_entry += 1
        return self._mem.graph_table(captured.entry)

    def apply(self, rank: int, view: PeerView, everyone: list[list[Captured]]) -> int:
        """Writes the tables of the pending entries from every rank's records (rank order); returns how many."""
        mine = everyone[rank]
        for peer, records in enumerate(everyone):
            if [c.entry for c in records] != [c.entry for c in mine]:
                raise FusedArError(f"rank {peer} captured {len(records)} calls, rank {rank} {len(mine)}: every rank "
                                   "must capture the same calls in the same order")
        for i, own in enumerate(mine):
            inputs = [self._address(peer, rank, records[i]) for peer, records in enumerate(everyone)]
            self._runtime.copy_to_device(self._mem.graph_table(own.entry), view.table_bytes(self._mem.report_dev, inputs),
                                         self._mem.device)
        self.pending = []
        return len(mine)

    def _address(self, peer: int, rank: int, c: Captured) -> int:
        if c.handle is None or peer == rank:
            return c.base + c.offset
        base = self._opened.get(c.handle)
        if base is None:
            base = self._opened[c.handle] = self._runtime.ipc_open(c.handle, self._mem.device)
        return base + c.offset

    def prefill(self, view: PeerView) -> None:
        """Every graph table starts unregistered (a replay before registration records an error, reads nothing)."""
        blank = view.table_bytes(self._mem.report_dev, inputs=[])
        self._runtime.copy_to_device(self._mem.graph_table(0), blank * GRAPH_TABLES, self._mem.device)

    def close(self) -> None:
        while self._opened:
            _, ptr = self._opened.popitem()
            self._runtime.ipc_close(ptr, self._mem.device)


class LocalHub:
    """Registration for ranks in one process: each rank hands in its records; when the last one has,
    every rank's tables are written."""

    def __init__(self, world_size: int) -> None:
        self._records: dict[int, list[Captured]] = {}
        self._world_size = world_size
        self._members: dict[int, Callable[[list[list[Captured]]], Any]] = {}

    def join(self, rank: int, apply: Callable[[list[list[Captured]]], Any]) -> None:
        self._members[rank] = apply

    def submit(self, rank: int, records: list[Captured]) -> bool:
        """True once every rank has submitted and all tables are written."""
        self._records[rank] = records
        if len(self._records) < self._world_size:
            return False
        everyone = [self._records[r] for r in range(self._world_size)]
        self._records = {}
        for r in range(self._world_size):
            self._members[r](everyone)
        return True


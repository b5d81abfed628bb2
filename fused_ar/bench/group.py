"""The ranks one benchmark process drives for one TP size: all N in this process on one GPU (the single-GPU
emulation, `Communicator.local_group`) or its own rank of a one-process-per-GPU group. The sweep and the
timing are written once against this; only how ranks meet differs.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from ..comm.communicator import Communicator


class Group:
    def __init__(self, world: int, device: int, emulated: bool, rank: int = 0, object_group: Any = None,
                 device_group: Any = None) -> None:
        import torch

        self.world, self.device, self.emulated = world, device, emulated
        self.rank = rank  # this process's rank (0 when emulated: it drives them all)
        self.object_group = object_group  # gloo: handles, barriers, results
        self.device_group = device_group  # NCCL / RCCL: the baselines' collectives
        self.local = list(range(world)) if emulated else [rank]
        self.streams = [torch.cuda.Stream(device=device) for _ in self.local]
        self.comms: list[Communicator] = []

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def open(self, max_bytes: int) -> list[Communicator]:
        """Fresh communicators (their graph tables are consumed by capture: one set per measured case)."""
        self.close()
        if self.emulated:
            self.comms = Communicator.local_group(self.world, self.device, max_bytes=max_bytes)
        else:
            self.comms = [Communicator(self.object_group, self.device, max_bytes=max_bytes,
                                       device_group=self.device_group)]
        return self.comms

    def close(self) -> None:
        import torch

        torch.cuda.synchronize(self.device)
        for comm in self.comms:
            comm.close()
        self.comms = []

    def sync(self) -> None:
        """Every rank's work done, and (several processes) every rank here, before the next step."""
        import torch

        torch.cuda.synchronize(self.device)
        if not self.emulated:
            import torch.distributed as dist

            dist.barrier(group=self.object_group)

    def each(self, fn: Callable[[int, Any], Any]) -> list[Any]:
        """fn(local index, stream) for every local rank, each on its stream, all enqueued before one sync."""
        import torch

        results = []
        for i, stream in enumerate(self.streams):
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                results.append(fn(i, stream))
        self.sync()
        for comm in self.comms:
            comm.check()
        return results

    def gather(self, mine: list[Any]) -> Optional[list[Any]]:
        """Every rank's value, in rank order, on the leader (None elsewhere). `mine`: one per local rank."""
        if self.emulated:
            return mine
        import torch.distributed as dist

        everyone: list[Any] = [None] * self.world
        dist.all_gather_object(everyone, mine[0], group=self.object_group)
        return everyone if self.is_leader else None

    def agree(self, reason: Optional[str]) -> Optional[str]:
        """The first rank's reason to skip something, on every rank (all skip together or none does)."""
        if self.emulated:
            return reason
        import torch.distributed as dist

        everyone: list[Any] = [None] * self.world
        dist.all_gather_object(everyone, reason, group=self.object_group)
        return next((f"rank {r}: {why}" for r, why in enumerate(everyone) if why), None)

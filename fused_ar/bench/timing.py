"""The field's timing method (docs/design.md section 7): K op calls captured into one CUDA graph per rank, each
replay timed with events on that rank's stream, R replays, all ranks' replays started together. Also the
bandwidth ceilings the floors are computed from.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable

from .group import Group

COPY_BYTES = 1 << 30


def capture(group: Group, calls: int, run: Callable[[int], Any]) -> tuple[list[Any], list[Any]]:
    """Per local rank, a graph of `calls` calls of run(i) on its stream, registered with the peers on the
    way out (Communicator.capture). Returns (graphs, the last call's result per rank)."""
    import torch

    graphs, last = [], []
    for i, (comm, stream) in enumerate(zip(group.comms, group.streams)):
        graph = torch.cuda.CUDAGraph()
        stream.wait_stream(torch.cuda.current_stream(group.device))
        with comm.capture(), torch.cuda.graph(graph, stream=stream):
            result = None
            for _ in range(calls):
                result = run(i)
        graphs.append(graph)
        last.append(result)
    return graphs, last


def replay_times(group: Group, graphs: list[Any], calls: int, replays: int) -> list[list[float]]:
    """us per call of each replay, per local rank. Every rank's work (and every process) meets before each
    replay, so the replays of all ranks start together."""
    import torch

    times: list[list[float]] = [[] for _ in graphs]
    for _ in range(replays):
        group.sync()
        events = []
        for graph, stream in zip(graphs, group.streams):
            with torch.cuda.stream(stream):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                graph.replay()
                end.record()
                events.append((start, end))
        torch.cuda.synchronize(group.device)
        for mine, (start, end) in zip(times, events):
            mine.append(start.elapsed_time(end) * 1e3 / calls)
    for comm in group.comms:
        comm.check()
    return times


def _median_copy_seconds(copy: Callable[[], Any]) -> float:
    import torch

    for _ in range(3):
        copy()
    samples = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        copy()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3)
    return statistics.median(samples)


def copy_bandwidth(device: int) -> float:
    """Device memory: bytes read + written per second by a large device-to-device copy."""
    import torch

    with torch.cuda.device(device):
        src = torch.empty(COPY_BYTES, dtype=torch.uint8, device=f"cuda:{device}").random_(0, 255)
        dst = torch.empty_like(src)
        return 2 * src.numel() / _median_copy_seconds(lambda: dst.copy_(src))


def peer_bandwidth(src_device: int, dst_device: int) -> float:
    """Bytes per second one GPU reads from another (a large peer copy, one direction)."""
    import torch

    with torch.cuda.device(dst_device):
        src = torch.empty(COPY_BYTES, dtype=torch.uint8, device=f"cuda:{src_device}").random_(0, 255)
        dst = torch.empty(COPY_BYTES, dtype=torch.uint8, device=f"cuda:{dst_device}")
        return src.numel() / _median_copy_seconds(lambda: dst.copy_(src))


def floor_us(world: int, nbytes: int, emulated: bool, copy_bw: float, peer_bw: float) -> float:
    """The fewest bytes over bandwidth for one call. Each rank reads all N inputs and the residual and
    writes two outputs: in an emulation all N ranks do so through one GPU's memory; on N GPUs each reads
    the N - 1 peer inputs over the link, and its own traffic through its memory."""
    local = (world + 3) * nbytes
    if emulated:
        return world * local / copy_bw * 1e6
    return max(local / copy_bw, (world - 1) * nbytes / peer_bw) * 1e6

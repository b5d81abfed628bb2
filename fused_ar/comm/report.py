"""The host side of kernels_src/fa_peers.h's error report: one small record per rank in mapped pinned host
memory, read on every call without a device synchronization, and decoded into the exception to raise.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass
from typing import Optional

from ..errors import FusedArError, MismatchError, PeerTimeoutError
from ..jit.kernels import DESC_WORDS, ERROR_MISMATCH, ERROR_TIMEOUT, ERROR_UNREGISTERED, REPORT_WORDS
from ..jit.spec import DType, Op

REPORT_BYTES = 4 * REPORT_WORDS
_PHASES = ("start", "mid", "end")
# A recorder fills the fields after winning the error word; the host waits this long for `ready`.
_READY_WAIT_S = 1.0


@dataclass(frozen=True)
class Report:
    error: int
    missing: int
    mine: tuple[int, ...]
    theirs: tuple[int, ...]
    ready: bool

    @classmethod
    def read(cls, host_ptr: int) -> "Report":
        w = list((ctypes.c_uint32 * REPORT_WORDS).from_address(host_ptr))
        return cls(w[0], w[1], tuple(w[2:2 + DESC_WORDS]), tuple(w[2 + DESC_WORDS:2 + 2 * DESC_WORDS]), bool(w[-1]))


def read_error_word(host_ptr: int) -> int:
    """The first word alone: what every call checks."""
    return ctypes.c_uint32.from_address(host_ptr).value


def wait_ready(host_ptr: int) -> Report:
    deadline = time.monotonic() + _READY_WAIT_S
    report = Report.read(host_ptr)
    while not report.ready and time.monotonic() < deadline:
        time.sleep(1e-4)
        report = Report.read(host_ptr)
    return report


def describe_call(desc: tuple[int, ...]) -> str:
    """A call descriptor (op | dtype << 8 | grid << 16, rows, cols) as text."""
    op_code, dtype_code, grid = desc[0] & 0xFF, (desc[0] >> 8) & 0xFF, desc[0] >> 16
    op = list(Op)[op_code].value if op_code < len(Op) else f"op#{op_code}"
    dtype = list(DType)[dtype_code].value if dtype_code < len(DType) else f"dtype#{dtype_code}"
    return f"{op}(m={desc[1]}, n={desc[2]}, {dtype}, grid {grid})"


def describe_error(code: int) -> str:
    """Decodes an error word: what happened, at which block and barrier, with which peer."""
    if not code:
        return "no error"
    block, phase, peer = (code >> 12) & 0xFFF, (code >> 8) & 0xF, code & 0xFF
    where = _PHASES[phase] if phase < len(_PHASES) else "?"
    if code & ERROR_TIMEOUT:
        return f"block {block} timed out at the {where} barrier waiting for rank {peer}"
    if code & ERROR_MISMATCH:
        return f"block {block} found rank {peer} making a different call"
    if code & ERROR_UNREGISTERED:
        return "a CUDA/HIP graph was replayed before its buffers were registered"
    return f"unknown error word {code:#x}"


def to_exception(report: Report, rank: int, timeout_s: float) -> FusedArError:
    """The exception a rank raises for the error its kernels recorded."""
    if report.error & ERROR_TIMEOUT:
        ranks = [r for r in range(32) if report.missing >> r & 1]
        return PeerTimeoutError(
            f"rank {rank}: rank(s) {ranks} did not arrive within FUSED_AR_TIMEOUT_S={timeout_s:g} s "
            f"({describe_error(report.error)}; this rank's call: {describe_call(report.mine)}); a peer died, hung "
            "or skipped a call. This communicator is unusable now: create a new one", ranks)
    if report.error & ERROR_MISMATCH:
        peer = report.error & 0xFF
        mine, theirs = describe_call(report.mine), describe_call(report.theirs)
        return MismatchError(f"rank {rank} called {mine} but rank {peer} called {theirs}: every rank must make "
                             "the same call (op, shape, dtype, path); nothing was computed. This communicator is "
                             "unusable now: create a new one", peer, mine, theirs)
    return FusedArError(f"rank {rank}: {describe_error(report.error)}: call comm.register_graph_buffers() (or "
                        "capture inside `with comm.capture():`) before replaying. This communicator is unusable "
                        "now: create a new one")


def pending_exception(host_ptr: int, rank: int, timeout_s: float) -> Optional[FusedArError]:
    if not read_error_word(host_ptr):
        return None
    return to_exception(wait_ready(host_ptr), rank, timeout_s)

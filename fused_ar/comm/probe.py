"""Does peer access really work on this node? Probed once per boot and set of GPUs, remembered on disk.

The driver can claim peer access that does not work, so the probe does what the kernels do: this process
exports a buffer per GPU; a child process opens every handle on every GPU and runs our add_rmsnorm kernel
there, loading the peer's data through the mapping and storing it back through it; this process then
checks the bytes. The verdict is kept under the cache directory (one JSON file per key), behind a file
lock, so the ranks of a node probe once between them.

    python -m fused_ar probe 0 1 2 3      # probe those GPUs now, print the verdict
"""

from __future__ import annotations

import hashlib
import json
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from .. import env
from .._version import __version__
from ..jit.verdicts import remembered

ROWS, COLS = 4, 512  # bf16: one region is 4 KiB
REGION = ROWS * COLS * 2
CHILD_TIMEOUT_S = 120.0


def _pattern(device: int) -> bytes:
    """Distinct, exactly representable bf16 values per device (never -0: x + 0 must give x back)."""
    values = [float(1 + (i * 7 + device * 13) % 200) for i in range(ROWS * COLS)]
    return b"".join(struct.pack("<I", struct.unpack("<I", struct.pack("<f", v))[0])[2:] for v in values)


def _key(uuids: Sequence[str]) -> str:
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "unknown-boot"
    text = json.dumps([__version__, socket.gethostname(), boot, sorted(uuids)])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def peer_access(devices: Sequence[int]) -> tuple[bool, str]:
    """(works, detail) for IPC peer access among `devices` (this node's GPUs of a group), probed once."""
    import torch

    devices = sorted(set(int(d) for d in devices))
    key = _key([str(torch.cuda.get_device_properties(d).uuid) for d in devices])
    return remembered(key, lambda: run_probe(devices), {"devices": devices})


def run_probe(devices: Sequence[int]) -> tuple[bool, str]:
    """Exports one buffer per device (pattern, then a region per reader device), lets a child read and
    write every one from every device, and checks what came back."""
    from ..backends import current_runtime

    rt = current_runtime()
    bufs = []
    try:
        for d in devices:
            ptr = rt.alloc(REGION * (1 + len(devices)), d)
            bufs.append((d, ptr))
            rt.copy_to_device(ptr, _pattern(d), d)
        request = {"devices": list(devices), "handles": [rt.ipc_handle(ptr).hex() for _, ptr in bufs]}
        try:
            done = subprocess.run([sys.executable, "-m", "fused_ar.comm.probe", "--child", json.dumps(request)],
                                  capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, env=env.child_environ())
        except subprocess.TimeoutExpired:
            return False, f"the probe child did not finish within {CHILD_TIMEOUT_S:g} s"
        if done.returncode != 0:
            return False, f"the probe child failed: {(done.stderr or done.stdout).strip()[-400:]}"
        for d, ptr in bufs:
            for i, e in enumerate(devices):
                got = rt.read_bytes(ptr + REGION * (1 + i), REGION, d)
                if got != _pattern(d):
                    return False, f"GPU {e} read or wrote GPU {d}'s memory through IPC and the bytes differ"
        return True, f"GPUs {list(devices)}: every GPU loaded and stored every other's memory through IPC"
    finally:
        for d, ptr in bufs:
            rt.free(ptr, d)


def _child(request: dict) -> None:
    import torch

    from ..jit.kernels import add_rmsnorm_kernel
    from ..device.launch import launch, named_args, spec_for
    from ..backends import current_runtime
    from ..jit.spec import DType, Op

    rt = current_runtime()
    devices, handles = request["devices"], [bytes.fromhex(h) for h in request["handles"]]
    for i, e in enumerate(devices):
        torch.cuda.set_device(e)
        residual = torch.zeros(ROWS, COLS, device=f"cuda:{e}", dtype=torch.bfloat16)
        weight = torch.ones(COLS, device=f"cuda:{e}", dtype=torch.bfloat16)
        out = torch.empty_like(residual)
        block, short_rows = add_rmsnorm_kernel(COLS * 2 // 16)
        spec = spec_for(Op.ADD_RMSNORM, DType.BF16, e, block, short_rows=short_rows)
        for handle in handles:
            peer = rt.ipc_open(handle, e)
            try:
                # residual_out = T(x + 0) = x: loaded from the peer's pattern, stored into its region i
                launch(spec, e, ROWS, named_args(spec, out=out.data_ptr(), residual_out=peer + REGION * (1 + i),
                                                 x=peer, residual=residual.data_ptr(), weight=weight.data_ptr(),
                                                 rows=ROWS, cols=COLS, eps=1e-6, x_stride=COLS, residual_stride=COLS,
                                                 out_stride=COLS, residual_out_stride=COLS))
                torch.cuda.synchronize(e)
            finally:
                rt.ipc_close(peer, e)


def probe_command(gpus: Sequence[str]) -> int:
    """`python -m fused_ar probe [GPU ...]`: probes those GPUs (default GPU 0) now and prints the verdict;
    exit 0 when peer access works, 1 when it does not."""
    from ..device.validate import device_index, require_gpu

    require_gpu("python -m fused_ar probe")
    devices = [device_index(int(a) if a.isdigit() else a, "GPU") for a in gpus] or [device_index(0, "GPU")]
    ok, detail = peer_access(devices)
    print(("peer access works: " if ok else "peer access does NOT work: ") + detail)
    return 0 if ok else 1


if __name__ == "__main__":  # the probe's child process: python -m fused_ar.comm.probe --child REQUEST
    if sys.argv[1:2] != ["--child"] or len(sys.argv) != 3:
        sys.exit("usage: python -m fused_ar.comm.probe --child REQUEST (run by the probe; use `python -m fused_ar probe`)")
    _child(json.loads(sys.argv[2]))

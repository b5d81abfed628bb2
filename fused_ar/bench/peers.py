"""The add + RMSNorm kernels serving engines already ship, for `bench add_rmsnorm` to time beside ours in the same
run and the same way: FlashInfer's `fused_add_rmsnorm` (PDL on and off) and its FP8 forms
(`fused_add_rmsnorm_quant`: one static scale; `fused_add_rmsnorm_fp8_block_quant`: dynamic 1 x 128 groups),
Liger's fused add + RMSNorm, torch.compile (compiled afresh for each shape: dynamo's recompile limit would
otherwise turn it into eager after a few shapes) and torch eager.

A peer is made once per shape: `make()` returns run(x, r, w, eps) -> (out, residual_out[, scales]) on the
tensors given, which it may write (in place is how the engines call them). A peer that cannot be imported is
a row that says so, never an error.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Optional

Run = Callable[..., tuple]


@dataclass(frozen=True)
class Peer:
    name: str
    make: Optional[Callable[[], Run]]  # None: not importable here
    missing: str = ""  # why not
    note: str = ""  # what it does beyond the op (extra outputs), for the table


def _module(name: str) -> tuple[Any, str]:
    """(module, "") or (None, why it is not importable)."""
    try:
        return importlib.import_module(name), ""
    except Exception as e:  # a peer broken on import is as absent as a missing one
        return None, f"not installed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"


def _eager(torch: Any) -> Run:
    import torch.nn.functional as F

    def run(x: Any, r: Any, w: Any, eps: float) -> tuple:
        ro = x + r
        return F.rms_norm(ro, (ro.shape[-1],), w, eps), ro
    return run


def _compiled(torch: Any, fn: Run) -> Callable[[], Run]:
    def make() -> Run:
        torch._dynamo.reset()  # one specialization per shape, as a server with captured graphs has
        return torch.compile(fn, dynamic=False)
    return make


def t_peers(torch: Any) -> list[Peer]:
    """The peers of add + RMSNorm in T (x's dtype)."""
    peers = []
    fi, why = _module("flashinfer.norm")
    for pdl in (True, False):
        name = f"FlashInfer fused_add_rmsnorm, PDL {'on' if pdl else 'off'}"
        if fi is None:
            peers.append(Peer(name, None, why))
            continue

        def flashinfer(x: Any, r: Any, w: Any, eps: float, pdl: bool = pdl) -> tuple:
            fi.fused_add_rmsnorm(x, r, w, eps, enable_pdl=pdl)
            return x, r
        peers.append(Peer(name, lambda f=flashinfer: f))
    liger, why = _module("liger_kernel.ops.fused_add_rms_norm")
    if liger is None:
        peers.append(Peer("Liger fused add + RMSNorm", None, why))
    else:
        def liger_run(x: Any, r: Any, w: Any, eps: float) -> tuple:
            out, ro, *_ = liger.fused_add_rms_norm_forward(x, r, w, eps, 0.0, "llama")
            return out, ro
        peers.append(Peer("Liger fused add + RMSNorm", lambda: liger_run, note="allocates its outputs"))
    peers.append(Peer("torch.compile", _compiled(torch, _eager(torch))))
    peers.append(Peer("torch eager", lambda: _eager(torch)))
    return peers


# `bench add_rmsnorm --peers`: each selectable peer by the start of its rows' names.
PEER_KINDS = {"flashinfer": "FlashInfer", "liger": "Liger", "compile": "torch.compile", "eager": "torch eager"}


def parse_peers(text: str) -> tuple[str, ...]:
    """`--peers`: a comma-separated list of PEER_KINDS, "all" or "none" (ValueError naming the choices)."""
    if text in ("all", "none"):
        return tuple(PEER_KINDS) if text == "all" else ()
    items = text.split(",")
    unknown = [item for item in items if item not in PEER_KINDS]
    if not text or unknown:
        raise ValueError(f"must be all, none or a comma-separated list of {', '.join(PEER_KINDS)}")
    return tuple(dict.fromkeys(items))


def selected(peers: list[Peer], kinds: tuple[str, ...]) -> list[Peer]:
    """The peers of the given PEER_KINDS, in their order (an unselected peer has no row at all)."""
    return [p for p in peers if any(p.name.startswith(PEER_KINDS[k]) for k in kinds)]


# The benches' NVFP4 global scale: block scales of unit-RMS rows well inside E4M3's normal range.
NVFP4_GLOBAL_SCALE = 20.0


def quantize(torch: Any, y: Any, mode: str, big: float, fp8: Any, scale: Any, group: Optional[int]) -> tuple[Any, Any]:
    """torch's quantization of an RMSNorm output y, as docs/design.md section 1b writes it: (q, scales); the
    UE8M0, NVFP4 (`scale`: its global scale) and MXFP4 modes through fused_ar.reference."""
    from .. import reference

    if mode == "group_ue8m0":
        q, s = reference.fp8_group_ue8m0_reference(y, group, fp8)
        return q, reference.pack_ue8m0(s)
    if mode == "nvfp4":
        return reference.nvfp4_reference(y, scale)
    if mode == "mxfp4":
        return reference.mxfp4_reference(y)
    y = y.float()
    if mode == "static":
        s = s_full = scale.reshape(())
    elif mode == "token":  # amax / M as IEEE division (dividing by a Python scalar multiplies by its reciprocal)
        amax = y.abs().amax(-1, keepdim=True)
        s = s_full = torch.clamp(amax / torch.full_like(amax, big), min=1 / (512 * big))
    else:
        amax = y.view(*y.shape[:-1], -1, group).abs().amax(-1)
        s = torch.clamp(amax / torch.full_like(amax, big), min=1 / (512 * big))
        s_full = s.repeat_interleave(group, dim=-1)
    return (y * (1.0 / s_full)).clamp(-big, big).to(fp8), s


def fp8_peers(torch: Any, mode: str, group: Optional[int], scale: Any, fp8: Any, big: float) -> list[Peer]:
    """The peers of add + RMSNorm + FP8 with `mode`'s scales (static: `scale`; group: `group` columns), or of
    the UE8M0 / FP4 modes (FlashInfer's FP4 quantization is another module than the norm's: not timed)."""
    peers = []
    fi, why = _module("flashinfer.norm")
    if mode == "static":
        for pdl in (True, False):
            name = f"FlashInfer fused_add_rmsnorm_quant, PDL {'on' if pdl else 'off'}"
            if fi is None:
                peers.append(Peer(name, None, why))
                continue

            def quant(x: Any, r: Any, w: Any, eps: float, pdl: bool = pdl) -> tuple:
                q = torch.empty(x.shape, dtype=fp8, device=x.device)
                fi.fused_add_rmsnorm_quant(q, x, r, w, scale, eps, enable_pdl=pdl)
                return q, r, scale
            peers.append(Peer(name, lambda f=quant: f))
    elif mode == "group" and group == 128:
        name = "FlashInfer fused_add_rmsnorm_fp8_block_quant"
        if fi is None:
            peers.append(Peer(name, None, why))
        else:
            def block(x: Any, r: Any, w: Any, eps: float) -> tuple:
                m, n = x.shape
                q = torch.empty(x.shape, dtype=fp8, device=x.device)
                scales = torch.empty(n // 128, -(-m // 4) * 4, dtype=torch.float32, device=x.device)
                normed = torch.empty_like(x)
                fi.fused_add_rmsnorm_fp8_block_quant(q, scales, normed, x, r, w, eps)
                return q, r, scales.transpose(0, 1)[:m]
            peers.append(Peer(name, lambda: block, note="also writes the T out"))
    eager = _eager(torch)

    def unfused(x: Any, r: Any, w: Any, eps: float) -> tuple:
        out, ro = eager(x, r, w, eps)
        q, s = quantize(torch, out, mode, big, fp8, scale, group)
        return q, ro, s
    peers.append(Peer("torch.compile", _compiled(torch, unfused)))
    peers.append(Peer("torch eager", lambda: unfused))
    return peers

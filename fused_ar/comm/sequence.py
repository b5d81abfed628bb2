"""Sequence parallelism on the communicator: `reduce_scatter_rmsnorm` (each rank gets the fully reduced rows
of its shard, added to its residual shard and normalized, in T or FP8) and `all_gather` (every rank gets
every shard), mixed into `Communicator`.

Rows are split as serving engines split them: contiguous blocks of S = ceil(m / N) rows, rank r's being
[r*S, min((r+1)*S, m)). That is what padding m up to a multiple of N gives, without computing the padding
rows: the last shards are shorter, or empty. The reduce-scatter is the one-stage fused kernel restricted to
this rank's rows (FA_SCATTER), so its rows are bit for bit those of `allreduce_rmsnorm` on the same inputs;
the all-gather copies. A call whose staged input is over `max_bytes` runs in chunks of c rows of every
shard, which the staging buffer holds as N blocks of c rows (inside a captured graph the peers read the
registered input itself).
"""

from __future__ import annotations

import math
from typing import Any, Optional

from ..errors import InputError
from ..device.plans import CallPlan, fp4_arguments, fp8_arguments, is_capturing, raw_stream, rmsnorm_key
from ..device.launch import spec_for
from ..device.ops import add_rmsnorm_into, returned_scales
from ..device.validate import check_devices, check_outputs, check_rmsnorm_inputs, check_rows, cross_gpu_limit
from ..jit.kernels import ALL_GATHER, REDUCE_SCATTER_RMSNORM, allreduce_rmsnorm_block
from ..jit.spec import DEFAULT_PACK
from .policy import Path, overrides, parse_path

GATHER_BLOCK = ALL_GATHER.warm_blocks[0]


def shard_bounds(rows: int, world: int, rank: int) -> tuple[int, int]:
    """[first, end) of `rank`'s rows when `rows` are split over `world` ranks (see the module docstring)."""
    per = -(-rows // world)
    return min(rank * per, rows), min((rank + 1) * per, rows)


def _scatter_path(path: str) -> Path:
    chosen = parse_path(path)
    if chosen not in (Path.AUTO, Path.FALLBACK):
        raise InputError(f"path={path!r}: the sequence-parallel ops take 'auto' or 'fallback' (one kernel each)")
    return chosen


class SequenceParallel:
    """The sequence-parallel ops of `Communicator` (which provides the memory, plans and helpers used here)."""

    def shard_rows(self, rows: int, rank: Optional[int] = None) -> tuple[int, int]:
        """[first, end) of the rows of `rank` (default: this rank) in a split of `rows` over the group:
        contiguous blocks of ceil(rows / N), the last ones shorter or empty."""
        return shard_bounds(rows, self.world_size, self.rank if rank is None else rank)

    # -- reduce-scatter + add + RMSNorm -------------------------------------------------------------------
    def reduce_scatter_rmsnorm(self, x: Any, residual: Optional[Any], weight: Optional[Any], eps: float = 1e-6, *,
                               weight_offset: float = 0.0, path: str = "auto", out: Optional[Any] = None,
                               residual_out: Optional[Any] = None) -> tuple[Any, Any]:
        """(out, residual_out) of this rank's shard: rows `shard_rows(m)` of allreduce_rmsnorm(x, ...), bit for
        bit. x: (m, n), this rank's partial sums of every row; residual, out, residual_out: this rank's
        rows only (residual_out=residual in place). Every rank calls it together with the same m."""
        out, residual_out, _ = self._scatter(x, residual, weight, eps, weight_offset, path, out, residual_out, None)
        return out, residual_out

    def reduce_scatter_rmsnorm_fp8(self, x: Any, residual: Optional[Any], weight: Optional[Any], eps: float = 1e-6, *,
                                   weight_offset: float = 0.0, scale: Optional[Any] = None,
                                   group_size: Optional[int] = None, fp8_dtype: Any = None,
                                   scales_format: str = "fp32", scales_mn_major: bool = False, path: str = "auto",
                                   out: Optional[Any] = None, residual_out: Optional[Any] = None,
                                   scales_out: Optional[Any] = None) -> tuple[Any, Any, Any]:
        """(q, residual_out, scales) of this rank's shard: reduce_scatter_rmsnorm's out quantized as
        allreduce_rmsnorm_fp8 quantizes (static, per row or per group, its scales formats and layouts of this
        rank's rows), bit for bit."""
        fp8 = fp8_arguments(scale, group_size, fp8_dtype, scales_format, scales_mn_major, scales_out)
        return self._scatter(x, residual, weight, eps, weight_offset, path, out, residual_out, fp8)

    def reduce_scatter_rmsnorm_fp4(self, x: Any, residual: Optional[Any], weight: Optional[Any], eps: float = 1e-6, *,
                                   fp4_format: str = "nvfp4", global_scale: Optional[Any] = None,
                                   scales_swizzled: bool = False, weight_offset: float = 0.0, path: str = "auto",
                                   out: Optional[Any] = None, residual_out: Optional[Any] = None,
                                   scales_out: Optional[Any] = None) -> tuple[Any, Any, Any]:
        """(values, residual_out, scales) of this rank's shard: reduce_scatter_rmsnorm's out quantized as
        allreduce_rmsnorm_fp4 quantizes (the swizzled tiles over this rank's rows), bit for bit."""
        fp8 = fp4_arguments(fp4_format, global_scale, scales_swizzled, scales_out)
        return self._scatter(x, residual, weight, eps, weight_offset, path, out, residual_out, fp8)

    def _scatter(self, x: Any, residual: Any, weight: Any, eps: Any, offset: Any, path: str, out: Any,
                 residual_out: Any, fp8: Optional[dict]) -> tuple[Any, Any, Any]:
        self.check()
        scales = None if fp8 is None else fp8["scales"]
        plan, eps, offset, inputs = self._rmsnorm_plan(self._checked_scatter, x, residual, weight, eps, offset, path,
                                                       out, residual_out, fp8)
        lo, hi = self.shard_rows(x.shape[0])
        # the scales of this rank's rows: the plan's quantization was checked on them
        out, residual_out, scales = self._outputs(plan, x, (hi - lo, x.shape[1]), out, residual_out, scales)
        if plan.fallback:
            if x.shape[0]:
                self._fallback_scatter(x, residual, weight, eps, offset, out, residual_out, fp8, scales, lo, hi)
            return out, residual_out, returned_scales(fp8, scales, launched=bool(x.shape[0]))
        if x.shape[0]:
            stream = raw_stream(self.device)
            xp, rp, wp = inputs
            op, rop = out.data_ptr(), residual_out.data_ptr()
            sp = 0 if scales is None else scales.data_ptr()
            gp = 0 if fp8 is None or fp8["global_scale"] is None else fp8["global_scale"].data_ptr()
            cp = 0 if fp8 is None or fp8["scale_copy"] is None else fp8["scale_copy"].data_ptr()
            px, pr, po, pro, ps = plan.pitches
            per = plan.chunks[1][0] if len(plan.chunks) > 1 else -(-x.shape[0] // self.world_size)
            for first, sub in plan.chunks:
                buf = sub.buffer()
                v = buf.values
                v.residual, v.weight = rp and rp + first * pr, wp
                v.out, v.residual_out, v.scales = op + first * po, rop + first * pro, sp and sp + first * ps
                v.global_scale, v.scales_row0 = gp, first  # the swizzled scales' tiles place rows by index
                v.scale_copy = cp
                v.peers, v.first_row = self._shard_table(xp, px, plan, first, per, stream)
                v.eps, v.weight_offset = eps, offset
                sub.launch(stream, buf)
        return out, residual_out, returned_scales(fp8, scales, launched=bool(x.shape[0]))

    def _shard_table(self, xp: int, pitch: int, plan: CallPlan, first: int, per: int, stream: int) -> tuple[int, int]:
        """(peer table, the row where this rank's rows of the launch start in every input) for the launch over
        rows [first, first + per) of every shard: x itself where it is registered in a captured graph, else
        N blocks of `per` rows in the staging buffer (one copy of x where that is x's own layout)."""
        rows, row_bytes, _ = plan.x_layout
        shard = -(-rows // self.world_size)
        if is_capturing():
            table = None if plan.stage_x or not self._register_graph_inputs else self._graphs.record(xp)
            if table is not None:
                return table, self.rank * shard + first
        elif self._graphs.pending:
            self.register_graph_buffers()
        if per == shard and not first:
            self._stage(self._mem.staging, xp, rows, row_bytes, pitch, stream)
        else:
            for r in range(self.world_size):
                n = min(max(rows - r * shard - first, 0), per)
                if n:
                    self._stage(self._mem.staging + r * per * row_bytes, xp + (r * shard + first) * pitch, n,
                                row_bytes, pitch, stream)
        return self._mem.table, self.rank * per

    def _checked_scatter(self, key: Optional[tuple], x: Any, residual: Any, weight: Any, eps: Any, offset: Any,
                         path: str, out: Any, residual_out: Any, fp8: Optional[dict]) -> tuple[CallPlan, float, float]:
        """Every rule of the call (InputError naming the value), the path, and the plan of its key."""
        check_rows("x", x)
        if x.dim() != 2:
            raise InputError(f"x has shape {tuple(x.shape)}: the sequence-parallel ops take 2-D x (tokens, hidden)")
        chosen = _scatter_path(path)
        m, cols = x.shape
        lo, hi = self.shard_rows(m)
        for name, t in (("residual", residual), ("out", out), ("residual_out", residual_out)):
            if hasattr(t, "shape") and (len(t.shape) != 2 or t.shape[0] != hi - lo):
                raise InputError(f"{name} has shape {tuple(getattr(t, 'shape', ()))}: rank {self.rank}'s shard of "
                                 f"m={m} rows over {self.world_size} ranks is rows [{lo}, {hi}), so it takes "
                                 f"({hi - lo}, {cols})")
        mine = x[lo:hi]
        call = check_rmsnorm_inputs(mine, residual, weight, eps, offset)
        quant, q_layout, layouts, unsupported = self._checked_operands(x, mine, call, residual, weight, out, residual_out,
                                                                       fp8, {("residual_out", "residual")})
        row_bytes = cols * call.x.dtype.itemsize
        shard = -(-m // self.world_size)
        per = shard if m * row_bytes <= self.max_bytes else self.max_bytes // (self.world_size * row_bytes)
        if unsupported is None and m and not per:
            unsupported = (f"{self.world_size} rows of x have {self.world_size * row_bytes} bytes (n={cols}, "
                           f"{call.x.dtype.value}), over this communicator's max_bytes={self.max_bytes}: each launch "
                           "stages a row of every shard")
        if chosen is not Path.FALLBACK:
            chosen = self._choose(path, x, unsupported, per * self.world_size * row_bytes)
        # An empty shard's tensors all have address 0: there only the call's own words say in place, so the
        # rank picks the kernel its peers do (in a local group a kernel loaded while they spin waits on them).
        in_place = residual_out is not None and residual is not None and (
            residual_out is residual if hi == lo else residual_out.data_ptr() == residual.data_ptr())
        tensors = (x, residual, weight, out if fp8 is None else None, residual_out)
        q_tensors = () if fp8 is None else (out, fp8["scales"])
        if chosen is Path.FALLBACK:
            if self._device_group is None:
                raise InputError(f"path={path!r}: this communicator has no device group to fall back on")
            plan = CallPlan.fallback_plan(tensors, m, quant, q_tensors)
        else:
            variant = {"weight": call.weight, "residual": call.residual_stride is not None, "inplace": in_place}
            if quant is not None:
                variant.update(quant=quant.kind, fp8=quant.fmt)
            packs = row_bytes // DEFAULT_PACK
            spec = spec_for(REDUCE_SCATTER_RMSNORM.op, call.x.dtype, self.device, allreduce_rmsnorm_block(packs),
                            self.world_size, **variant)
            fixed = {**self._peer_args(), "cols": cols, "all_rows": m,
                     "residual_stride": call.residual_stride or 0,
                     "out_stride": (q_layout or layouts.get("out") or call.x).row_stride if out is not None else
                         (quant.out_cols if quant else cols),
                     "residual_out_stride": layouts["residual_out"].row_stride if "residual_out" in layouts else cols}
            scale_args, shared_mem = ({}, 0) if quant is None else quant.launch_args(cols)
            fixed.update(scale_args)
            grid = min(max(per, 1), self._grid_cap(spec))  # the same on every rank, whatever its shard
            made: dict[int, CallPlan] = {}  # this rank's rows in a launch -> its plan (at most 3 kinds)

            def part(n: int) -> CallPlan:
                if n not in made:
                    made[n] = CallPlan(spec, self.device, grid, {**fixed, "rows": n}, tensors, n, in_place, quant,
                                       q_tensors, shared_mem=shared_mem)
                return made[n]
            mine_rows = hi - lo
            chunks = tuple((first, part(min(max(mine_rows - first, 0), per))) for first in range(0, max(shard, 1), per))
            x_pitch = call.x.row_stride * call.x.dtype.itemsize
            pitches = (x_pitch, (call.residual_stride or 0) * call.x.dtype.itemsize,
                       fixed["out_stride"] * (1 if quant is not None else call.x.dtype.itemsize),
                       fixed["residual_out_stride"] * call.x.dtype.itemsize,
                       (quant.scale_bytes if quant else 0) * fixed.get("scales_stride", 0))
            plan = CallPlan.chunked_plan(tensors, m, in_place, quant, q_tensors, chunks, pitches)
            plan.x_layout = (m, row_bytes, x_pitch)
        # the registered x is read in place under capture: only contiguous, aligned rows
        plan.stage_x = call.x.row_stride != cols or x.data_ptr() % DEFAULT_PACK != 0
        if unsupported is None and key is not None:
            self._plans[key] = plan
        return plan, call.eps, call.offset

    def _fallback_scatter(self, x: Any, residual: Any, weight: Any, eps: float, offset: float, out: Any,
                          residual_out: Any, fp8: Optional[dict], scales: Any, lo: int, hi: int) -> None:
        """The collective's all-reduce of x in T, then add + RMSNorm (and FP8) of this rank's rows."""
        import torch

        ar = self._fallback_allreduce(x, torch.empty(x.shape, dtype=x.dtype, device=x.device))[lo:hi]
        add_rmsnorm_into(out, residual_out, ar, residual, weight, eps, offset, fp8, scales)

    # -- all-gather ---------------------------------------------------------------------------------------
    def all_gather(self, x: Any, rows: Optional[int] = None, *, path: str = "auto", out: Optional[Any] = None) -> Any:
        """(rows, n): every rank's shard of a split of `rows` (default: out's rows, else N × x's rows), in rank
        order. x: this rank's shard, rows `shard_rows(rows)` (any row stride); out: contiguous. Every rank
        calls it together with the same rows."""
        import torch

        self.check()
        try:
            total = rows if rows is not None else out.shape[0] if out is not None else self.world_size * x.shape[0]
            key = ("all_gather", rmsnorm_key(x, None, None, out, None), total, path, overrides())
            plan = self._plans.get(key)
        except (AttributeError, IndexError, TypeError):  # a value that cannot key: the full checks say what it is
            key, total, plan = None, rows, None
        if plan is None or not self._gather_pointers_ok(plan, x, out):
            plan, total = self._checked_gather(key, x, rows, path, out)
        out = torch.empty((total, x.shape[1]), dtype=x.dtype, device=x.device) if out is None else out
        if plan.fallback:
            if total:
                self._fallback_gather(x, out, total)
            return out
        if not total:
            return out
        stream = raw_stream(self.device)
        xp, op = x.data_ptr(), out.data_ptr()
        pitch = plan.pitches[0]
        for first, sub in plan.chunks:
            buf = sub.buffer()
            v = buf.values
            v.out, v.first = op, first
            v.peers, v.source_first = self._gathered_table(xp, pitch, plan, sub, first, stream)
            sub.launch(stream, buf)
        return out

    @staticmethod
    def _gather_pointers_ok(plan: CallPlan, x: Any, out: Any) -> bool:
        """Per call: x aligned (else the full checks make the plan stage it) and out aligned, apart from x."""
        if out is None:
            return not x.data_ptr() % DEFAULT_PACK
        xp, op = x.data_ptr(), out.data_ptr()
        return not (op | xp) % DEFAULT_PACK and (op + plan.spans[1] <= xp or xp + plan.spans[0] <= op)

    def _gathered_table(self, xp: int, pitch: int, plan: CallPlan, sub: CallPlan, first: int,
                        stream: int) -> tuple[int, int]:
        """(peer table, the row of this launch's first in every input): the shard itself where it is registered
        in a captured graph, else its rows [first, first + count) copied to the staging buffer."""
        if is_capturing():
            table = None if plan.stage_x or not self._register_graph_inputs else self._graphs.record(xp)
            if table is not None:
                return table, first
        elif self._graphs.pending:
            self.register_graph_buffers()
        mine, row_bytes, _ = plan.x_layout
        n = min(max(mine - first, 0), sub.fixed["count"])
        if n:
            self._stage(self._mem.staging, xp + first * pitch, n, row_bytes, pitch, stream)
        return self._mem.table, 0

    def _checked_gather(self, key: Optional[tuple], x: Any, rows: Any, path: str, out: Any) -> tuple[CallPlan, int]:
        shape = check_rows("x", x)
        if x.dim() != 2:
            raise InputError(f"x has shape {tuple(x.shape)}: the sequence-parallel ops take 2-D x (tokens, hidden)")
        chosen = _scatter_path(path)
        if rows is None:
            rows = out.shape[0] if out is not None and getattr(out, "dim", lambda: 0)() == 2 else \
                self.world_size * x.shape[0]
        if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0:
            raise InputError(f"rows={rows!r}: the rows of the gathered tensor, a non-negative int")
        lo, hi = self.shard_rows(rows)
        if x.shape[0] != hi - lo:
            raise InputError(f"x has {x.shape[0]} rows: rank {self.rank}'s shard of rows={rows} over "
                             f"{self.world_size} ranks is rows [{lo}, {hi}), {hi - lo} rows")
        cols = shape.cols
        if out is not None:
            check_devices(x=x, out=out)
            if out.dtype != x.dtype or tuple(out.shape) != (rows, cols) or not out.is_contiguous():
                raise InputError(f"out has dtype {out.dtype} and shape {tuple(out.shape)}: it must be contiguous "
                                 f"{x.dtype} of shape {(rows, cols)}")
            check_outputs({"x": x}, {"out": out}, out, in_place=set())
        self._check_device(x=x, out=out)
        unsupported = cross_gpu_limit(cols, shape.dtype, {"out": out})
        row_bytes = cols * shape.dtype.itemsize
        shard = -(-rows // self.world_size)
        per = min(shard, self.max_bytes // row_bytes)
        if unsupported is None and rows and not per:
            unsupported = (f"a row of x has {row_bytes} bytes (n={cols}, {shape.dtype.value}), over this "
                           f"communicator's max_bytes={self.max_bytes}: each launch stages whole rows")
        if chosen is not Path.FALLBACK:
            chosen = self._choose(path, x, unsupported, per * row_bytes)
        if chosen is Path.FALLBACK:
            if self._device_group is None:
                raise InputError(f"path={path!r}: this communicator has no device group to fall back on")
            plan = CallPlan.fallback_plan((x, out), rows)
        else:
            spec = spec_for(ALL_GATHER.op, shape.dtype, self.device, GATHER_BLOCK, self.world_size)
            packs = per * row_bytes // DEFAULT_PACK
            sub = CallPlan(spec, self.device, min(max(math.ceil(packs / GATHER_BLOCK), 1), self._grid_cap(spec)),
                           {**self._peer_args(), "all_rows": rows, "cols": cols, "shard_rows": shard, "count": per},
                           (x, out), rows)
            chunks = tuple((first, sub) for first in range(0, max(shard, 1), per)) if rows else ()
            plan = CallPlan.chunked_plan((x, out), rows, False, None, (), chunks,
                                         (shape.row_stride * shape.dtype.itemsize, 0, 0, 0, 0))
            plan.x_layout = (hi - lo, row_bytes, shape.row_stride * shape.dtype.itemsize)
        plan.stage_x = shape.row_stride != cols or x.data_ptr() % DEFAULT_PACK != 0
        if unsupported is None and key is not None:
            self._plans[key] = plan
        return plan, rows

    def _fallback_gather(self, x: Any, out: Any, rows: int) -> None:
        """The collective's all-gather of shards padded to ceil(rows / N) rows, then the rows copied out."""
        import torch
        import torch.distributed as dist

        shard = -(-rows // self.world_size)
        padded = torch.zeros((shard * self.world_size, x.shape[1]), dtype=x.dtype, device=x.device)
        mine = torch.zeros((shard, x.shape[1]), dtype=x.dtype, device=x.device)
        mine[:x.shape[0]].copy_(x)
        dist.all_gather_into_tensor(padded, mine, group=self._device_group)
        out.copy_(padded[:rows])


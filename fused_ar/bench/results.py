"""What one benchmark run measured, as plain values: a `Point` per (TP, hidden, dtype, m, path) with every
raw replay time of every rank, the paths skipped and why, and the environment. JSON in and out; no
devices, no torch (the report is built from this alone, on any machine).

The statistic of docs/design.md section 7: per rank the minimum over replays, then the maximum over ranks
(`best_us`); `median_us` is the same with the median. Times are microseconds per op call.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..jit.spec import DType


@dataclass(frozen=True)
class Point:
    tp: int
    hidden: int
    dtype: str
    m: int
    path: str
    calls: int  # op calls per graph replay
    per_rank_us: tuple[tuple[float, ...], ...]  # [rank][replay], us per call

    def __post_init__(self) -> None:
        if not self.per_rank_us or any(not r for r in self.per_rank_us):
            raise ValueError(f"{self.key}: no replay times")

    @property
    def key(self) -> tuple[int, int, str, int, str]:
        return self.tp, self.hidden, self.dtype, self.m, self.path

    @property
    def best_us(self) -> float:
        return max(min(r) for r in self.per_rank_us)

    @property
    def median_us(self) -> float:
        return max(statistics.median(r) for r in self.per_rank_us)

    @property
    def per_replay_us(self) -> list[float]:
        """Each replay's time of the slowest rank: what the group waited for."""
        return [max(times) for times in zip(*self.per_rank_us)]

    @property
    def nbytes(self) -> int:
        """Input bytes per rank."""
        return self.m * self.hidden * DType.parse(self.dtype).itemsize


@dataclass(frozen=True)
class Skip:
    tp: int
    path: str
    reason: str


@dataclass
class Run:
    """A whole sweep: its command, how each TP ran (`modes`: 'N GPUs, one process each' or a single-GPU
    emulation), the environment as read, and what was measured or skipped."""

    command: str
    environment: dict[str, Any] = field(default_factory=dict)
    modes: dict[int, str] = field(default_factory=dict)
    emulated: dict[int, bool] = field(default_factory=dict)
    floors_us: dict[str, float] = field(default_factory=dict)  # "tp,hidden,dtype,m" -> bytes / bandwidth
    points: list[Point] = field(default_factory=list)
    skips: list[Skip] = field(default_factory=list)

    def add(self, point: Point) -> None:
        self.points.append(point)

    def skip(self, tp: int, path: str, reason: str) -> None:
        if not any(s.tp == tp and s.path == path for s in self.skips):
            self.skips.append(Skip(tp, path, reason))

    def find(self, tp: int, hidden: int, dtype: str, m: int, path: str) -> Optional[Point]:
        for p in self.points:
            if p.key == (tp, hidden, dtype, m, path):
                return p
        return None

    def set_floor(self, tp: int, hidden: int, dtype: str, m: int, us: float) -> None:
        self.floors_us[f"{tp},{hidden},{dtype},{m}"] = us

    def floor(self, tp: int, hidden: int, dtype: str, m: int) -> Optional[float]:
        return self.floors_us.get(f"{tp},{hidden},{dtype},{m}")

    def cases(self) -> list[tuple[int, int, str]]:
        """(tp, hidden, dtype) in the order measured."""
        seen: dict[tuple[int, int, str], None] = {}
        for p in self.points:
            seen.setdefault((p.tp, p.hidden, p.dtype), None)
        return list(seen)

    def ms(self, tp: int, hidden: int, dtype: str) -> list[int]:
        return sorted({p.m for p in self.points if (p.tp, p.hidden, p.dtype) == (tp, hidden, dtype)})

    def paths(self, tp: int) -> list[str]:
        seen: dict[str, None] = {}
        for p in self.points:
            if p.tp == tp:
                seen.setdefault(p.path, None)
        return list(seen)

    def to_dict(self) -> dict[str, Any]:
        return {"command": self.command, "environment": self.environment,
                "modes": {str(k): v for k, v in self.modes.items()},
                "emulated": {str(k): v for k, v in self.emulated.items()}, "floors_us": self.floors_us,
                "points": [dict(asdict(p), best_us=p.best_us, median_us=p.median_us) for p in self.points],
                "skips": [asdict(s) for s in self.skips]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Run":
        run = cls(d["command"], d.get("environment", {}), {int(k): v for k, v in d.get("modes", {}).items()},
                  {int(k): bool(v) for k, v in d.get("emulated", {}).items()}, dict(d.get("floors_us", {})))
        for p in d["points"]:
            run.add(Point(p["tp"], p["hidden"], p["dtype"], p["m"], p["path"], p["calls"],
                          tuple(tuple(float(t) for t in r) for r in p["per_rank_us"])))
        for s in d.get("skips", []):
            run.skip(s["tp"], s["path"], s["reason"])
        return run

    def merge(self, other: "Run") -> None:
        """Adds another run's TPs (a worker's results) to this one."""
        self.modes.update(other.modes)
        self.emulated.update(other.emulated)
        self.floors_us.update(other.floors_us)
        for key, value in other.environment.items():
            self.environment.setdefault(key, value)
        self.points.extend(other.points)
        for s in other.skips:
            self.skip(s.tp, s.path, s.reason)

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: Path) -> "Run":
        return cls.from_dict(json.loads(Path(path).read_text()))


def publish(table: str, out: Optional[str], name: str, data: dict[str, Any], echo: bool = True, **extra: str) -> None:
    """A single-table benchmark's results: the markdown table printed (unless not `echo`: a partial table a run
    rewrites as it goes); with an output directory, also written there as `<name>.md`, the data as
    `<name>.json`, and each extra file (file name -> text)."""
    if echo:
        print(table)
    if not out:
        return
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.md").write_text(table)
    (folder / f"{name}.json").write_text(json.dumps(data, indent=1))
    for file_name, text in extra.items():
        (folder / file_name).write_text(text)

"""The files ``@performance_monitor`` writes beside its traces: ``comm_step{N}.json``
(:class:`CommLog`) and ``flops_step{N}.json`` (:class:`FlopsReport`). Bytes in B, times in ns."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from meshprof.events import CommEvent


@dataclass(frozen=True, slots=True)
class CommLogRow:
    """One collective of the logged step and who issued it."""

    event: CommEvent
    """The collective as recorded."""
    module: str
    """Dotted module name ("" when none applies)."""
    phase: str
    """"forward", "backward" or "other"."""

    def to_dict(self) -> dict[str, Any]:
        return {**self.event.to_dict(), "module": self.module, "phase": self.phase}


@dataclass(frozen=True, slots=True)
class CommLog:
    """What ``comm_step{N}.json`` holds."""

    step: int
    """The step logged."""
    rank: int
    """Global rank."""
    world_size: int
    """Ranks in the job."""
    rows: list[CommLogRow]
    """One row per collective of the step."""
    by_module: dict[str, dict[str, int]]
    """"<module> [<phase>]" -> op -> count."""
    dtensor_comm_counts: dict[str, int]
    """CommDebugMode's count per DTensor collective."""
    dtensor_table: str
    """CommDebugMode's table (colours removed), or why it is unavailable."""

    @property
    def total_bytes(self) -> int:
        """Sum over the rows of max(in_bytes, out_bytes)."""
        return int(sum(max(r.event.in_bytes, r.event.out_bytes) for r in self.rows))

    @property
    def total_duration_ns(self) -> int:
        """Sum of the rows' durations (ns; ops that did not complete count 0)."""
        return int(sum(max(r.event.duration_ns, 0) for r in self.rows))

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "rank": self.rank,
            "world_size": self.world_size,
            "count": len(self.rows),
            "total_bytes": self.total_bytes,
            "total_duration_ns": self.total_duration_ns,
            "by_module": self.by_module,
            "dtensor_comm_counts": self.dtensor_comm_counts,
            "events": [r.to_dict() for r in self.rows],
        }


@dataclass(frozen=True, slots=True)
class ModuleFlops:
    """FLOPs of one module (its own and its children's, as FlopCounterMode counts them)."""

    total: int
    """Sum over ``ops``."""
    ops: dict[str, int]
    """FLOPs per aten op."""


@dataclass(frozen=True, slots=True)
class FlopsReport:
    """What ``flops_step{N}.json`` holds."""

    step: int
    """The step logged."""
    rank: int
    """Global rank."""
    total_flops: int
    """FLOPs of the whole step (forward and backward)."""
    step_time_ns: int
    """Wall time of the counted step (ns; inflated by the counter)."""
    achieved_tflops: float
    """total_flops / step time, in TFLOP/s (1e12 FLOP/s)."""
    peak_tflops: float | None
    """The device's peak (MESHPROF_PEAK_TFLOPS or detected); None when unknown."""
    mfu: float | None
    """achieved / peak (0..1); None without a peak."""
    modules: dict[str, ModuleFlops]
    """FLOPs per module (dotted name)."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (``modules`` as ``{name: {"total", "ops"}}``)."""
        return asdict(self)

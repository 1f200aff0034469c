"""The cross-rank analyses' row types: the per-rank table, memory, message sizes, groups,
findings, the timeline excerpt and the heatmap, all typed values.

Units: times in ns, sizes in bytes, shares and scores as fractions, bandwidth in GB/s (1e9 B/s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from meshprof.records.codec import NOT_IN_JSON
from meshprof.records.finding import Finding


@dataclass(frozen=True, slots=True)
class RankRow:
    """One line of the per-rank table (means over the rank's steps)."""

    rank: int
    """Global rank."""
    host: str
    """Hostname the rank ran on."""
    steps: int
    """Steps recorded."""
    step_ns: float
    """Mean step time (ns); NaN without steps."""
    step_p50_ns: float
    """Median step time (ns): per-request latency P50 when each forward is a step; NaN without
    steps."""
    step_p95_ns: float
    """95th percentile of the step times (ns, linear interpolation); NaN without steps."""
    step_p99_ns: float
    """99th percentile of the step times (ns, linear interpolation); NaN without steps."""
    steps_per_s: float
    """Steps (requests) per second: steps / (end of the last − start of the first); NaN with
    no step or no elapsed time."""
    compute_ns: float
    """Mean compute time per step (ns)."""
    comm_share: float
    """Communication time / step time (fraction)."""
    wait_share: float
    """Waiting time in collectives / step time (fraction)."""
    peak_memory_bytes: int
    """Peak memory: device peak where recorded, else host RSS; -1 when not sampled."""
    score: float
    """Straggler score."""
    last_share: float
    """Fraction of its collectives it arrived at last."""
    events: int
    """Completed collectives and send/recv recorded."""


@dataclass(frozen=True, slots=True)
class MemoryImbalance:
    """Peak memory across ranks."""

    max_rank: int
    """Rank with the highest peak (-1 when nothing was sampled)."""
    max_bytes: int
    """Its peak (bytes)."""
    median_bytes: int
    """Median peak across ranks (bytes)."""
    imbalance: float
    """max / median − 1 (fraction)."""


@dataclass(frozen=True, slots=True)
class SizeRow:
    """Collective latency and bandwidth for one op and power-of-two message-size bucket."""

    op: str
    """Op name."""
    size_bucket: int
    """Smallest 2**k ≥ the nccl-tests size S (bytes)."""
    count: int
    """Events (all ranks)."""
    p50_ns: float
    """Median duration (ns)."""
    p95_ns: float
    """95th-percentile duration (ns)."""
    algbw_gbps: float
    """Median algorithm bandwidth (GB/s = 1e9 B/s)."""
    busbw_gbps: float
    """Median bus bandwidth (GB/s)."""
    recorded: int = -1
    """Collectives of this op and size issued over the whole run on the loaded ranks, exact:
    events evicted from a rank's ring buffer, sampled out, failed or still in flight at the last
    write included (from the rank files' statistics); -1 when the rank files carry none. The
    latency columns cover the ``count`` retained, completed ones."""
    wait_p50_ns: float = math.nan
    """Median, over the members of this op and size's matched collectives, of the time a member
    waited in it for the last member to arrive (ns; see :mod:`~meshprof.analyze.run.events.match`),
    to hold against ``p50_ns``: how much of a typical collective is waiting for late ranks
    rather than transfer. NaN when none was matched (point-to-point ops, or no match given)."""


@dataclass(frozen=True, slots=True)
class GroupRow:
    """Matching statistics for one process group."""

    name: str
    """Group name."""
    desc: str
    """Group description."""
    dimension: str
    """Parallelism dimension."""
    size: int
    """Members."""
    collectives: int
    """Matched collectives."""
    incomplete: int
    """Collectives some member did not record."""
    skew_p50_ns: float
    """Median arrival skew (ns)."""
    skew_max_ns: float
    """Largest arrival skew (ns)."""
    wait_ns: int
    """Total wait of all members (ns)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFinding(Finding):
    """A conclusion of the cross-rank report (kind: manifest, straggler, memory_imbalance,
    missing_rank, clock, incomplete; severity: warning or info) with the numbers that support
    it."""

    evidence: dict[str, Any] = field(default_factory=dict)
    """The figures behind it (ns, bytes, fractions), by name."""


@dataclass(frozen=True, slots=True)
class TimelineItem:
    """One bar of the timeline excerpt (aligned clock, ns)."""

    rank: int
    """Global rank."""
    track: str
    """"step", "phase" or "comm"."""
    label: str
    """Step number, phase name or op@group."""
    start_ns: int
    """Aligned start, relative to the excerpt's start."""
    duration_ns: int
    """Duration."""


@dataclass(frozen=True, slots=True)
class StepHeatmap:
    """Step time per rank and step for the last steps of the run (the report's heatmap)."""

    ranks: tuple[int, ...]
    """Rows."""
    steps: tuple[int, ...]
    """Columns: the last step numbers (at most the heatmap's limit)."""
    step_ns: tuple[tuple[float, ...], ...]
    """[rank][step]: step time (ns), NaN where the rank has no such step."""
    median_ns: float
    """Median over every cell present (ns; 0 when none)."""
    max_ns: float
    """Largest cell (ns; 0 when none)."""


@dataclass(frozen=True, slots=True)
class RankProblem:
    """A rank whose file is missing or could not be read, or consecutive missing ranks."""

    rank: int
    """Global rank (the first of the ranks ``rank`` to ``last``)."""
    reason: str
    """Why it was not analyzed."""
    last: int | None = None
    """The last of consecutive missing ranks (None: ``rank`` alone). A manifest may claim
    millions of ranks a directory does not hold: they are one entry."""

    @property
    def count(self) -> int:
        """How many ranks this is."""
        return 1 if self.last is None else self.last - self.rank + 1

    @property
    def label(self) -> str:
        """``rank 3`` or ``ranks 4–99,999``."""
        return f"rank {self.rank}" if self.last is None else f"ranks {self.rank}–{self.last:,}"

    def to_dict(self) -> dict[str, object]:
        """The JSON object (``last`` only for several ranks)."""
        out: dict[str, object] = {"rank": self.rank, "reason": self.reason}
        if self.last is not None:
            out["last"] = self.last
        return out


@dataclass(frozen=True, slots=True)
class RunSummary:
    """What the report is about and its conclusions in one place (``report --json``'s
    ``summary``)."""

    path: str
    """Run directory."""
    world_size: int
    """Ranks expected."""
    loaded_ranks: tuple[int, ...]
    """Ranks whose file loaded."""
    steps: int
    """Steps recorded (on any rank)."""
    common_steps: int
    """Steps every loaded rank recorded."""
    stragglers: tuple[int, ...]
    """The ranks named stragglers, worst first."""
    metadata: dict[str, Any]
    """Manifest fields (command, layout, status, ...)."""
    findings: tuple[RunFinding, ...]
    """Conclusions drawn (stragglers, memory, missing ranks, clocks, incomplete collectives)."""
    mean_step_ns: float = field(default=float("nan"), metadata=NOT_IN_JSON)
    """Mean over ranks of their mean step time (ns); NaN without steps."""


@dataclass(frozen=True, slots=True)
class CommShareByDimension:
    """Communication time per rank and parallel dimension, as a share of step time."""

    dimensions: tuple[str, ...]
    """Columns of :attr:`share`."""
    ranks: tuple[int, ...]
    """Rows of :attr:`share`."""
    share: np.ndarray
    """float [rank, dimension]: communication time in that dimension's groups / step time."""
    total: tuple[float, ...] = field(default=(), metadata=NOT_IN_JSON)
    """Per rank: the sum over dimensions (fraction)."""


@dataclass(frozen=True, slots=True)
class TimelineExcerpt:
    """A short excerpt of the merged timeline (two steps) on the aligned clock."""

    items: tuple[TimelineItem, ...]
    """The bars."""
    window_ns: int
    """Length of the excerpt window (ns)."""


@dataclass(frozen=True, slots=True)
class SkewHistogram:
    """How many collectives (≥ 2 members present) had each arrival skew (last − first arrival)."""

    edges_ns: tuple[int, ...]
    """Bin edges (ns): bin i holds skews in [edges_ns[i], edges_ns[i + 1]); the first bin starts
    at 0, the last one is open-ended."""
    counts: tuple[int, ...]
    """Collectives per bin (one more bin than edges: the last is ≥ the last edge)."""

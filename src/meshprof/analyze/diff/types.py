"""The typed result of comparing two runs (:class:`RunDiff`, built by :mod:`meshprof.analyze.diff.compare`).

Every delta is B − A (run B minus run A): positive means B is slower, larger or busier. Units:
times in ns, sizes in bytes, shares as fractions, bandwidth in GB/s (1e9 B/s), rates per second.
A value a run does not have is NaN (None in JSON). :meth:`RunDiff.to_dict` is the JSON edge of
``meshprof diff --json``; renderers read the typed fields.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from meshprof.analyze.diff.serving_diff import ServingDiff
from meshprof.analyze.run.events.changes import Timeline
from meshprof.records.codec import dataclass_to_json, to_json
from meshprof.records.finding import Finding


@dataclass(frozen=True, slots=True)
class StepDiff:
    """Step time of the two runs: the median over ranks of each rank's median step time."""

    a_ns: float
    """Run A (ns)."""
    b_ns: float
    """Run B (ns)."""
    delta_ns: float
    """B − A (ns)."""
    rel: float
    """delta / A (0.5 = 50 % more than A); NaN when A is not positive or a value is missing."""


@dataclass(frozen=True, slots=True)
class PhaseDiff:
    """One named phase: the median over ranks of each rank's median time in the phase per step
    (its spans in a step summed; the step monitor's analysis, after its warm-up steps)."""

    phase: str
    """Phase name."""
    a_ns: float
    """Run A (ns); NaN when A has no such phase."""
    b_ns: float
    """Run B (ns); NaN when B has no such phase."""
    delta_ns: float
    """B − A (ns); NaN when one run lacks the phase."""
    rel: float
    """delta / A (0.5 = 50 % more than A); NaN when A is not positive or a value is missing."""


@dataclass(frozen=True, slots=True)
class RankDiff:
    """One rank in both runs (same world size and layout): medians over its recorded steps."""

    rank: int
    """Global rank."""
    a_step_ns: float
    """Median step time in A (ns)."""
    b_step_ns: float
    """Median step time in B (ns)."""
    step_delta_ns: float
    """B − A of the median step time (ns)."""
    compute_delta_ns: float
    """B − A of the median compute time per step (step time − communication, ns): what this
    rank itself does more or less of."""
    wait_delta_ns: float
    """B − A of the median time per step spent waiting for other ranks in collectives (ns)."""
    memory_delta_bytes: int | None
    """B − A of the peak memory (bytes); None when a run did not sample it."""


@dataclass(frozen=True, slots=True)
class CollectiveDiff:
    """One op and power-of-two message-size bucket (the report's by-size table) in both runs."""

    op: str
    """Op name."""
    size_bytes: int
    """Size bucket: smallest 2**k ≥ the nccl-tests size (bytes)."""
    a_p50_ns: float
    """Median duration in A (ns); NaN when A has none."""
    b_p50_ns: float
    """Median duration in B (ns); NaN when B has none."""
    delta_ns: float
    """B − A of the median duration (ns); NaN when one run has none."""
    rel: float
    """delta / A (0.5 = 50 % more than A); NaN when A is not positive or a value is missing."""
    a_busbw_gbps: float
    """Median bus bandwidth in A (GB/s)."""
    b_busbw_gbps: float
    """Median bus bandwidth in B (GB/s)."""
    a_count: int
    """Completed events of this op and size in A (all ranks)."""
    b_count: int
    """Completed events of this op and size in B (all ranks)."""
    a_wait_p50_ns: float = math.nan
    """Median wait of a member for the last one to arrive, in A (ns; the report's
    ``by_size[].wait_p50_ns``); NaN when A matched none."""
    b_wait_p50_ns: float = math.nan
    """The same in B."""


@dataclass(frozen=True, slots=True)
class ShareDiff:
    """Communication share of one parallelism dimension: the mean over ranks of the time in that
    dimension's collectives / step time (0 in a run without such groups)."""

    dim: str
    """dp, tp, pp, world, a "+"-joined mix, or other."""
    a: float
    """Run A (fraction)."""
    b: float
    """Run B (fraction)."""
    delta: float
    """B − A (fraction of the step: 0.05 = 5 points more)."""


@dataclass(frozen=True, slots=True)
class MemoryDiff:
    """Peak memory: the highest rank of each run (per rank: :attr:`RankDiff.memory_delta_bytes`)."""

    a_max_bytes: int
    """Highest peak of A (bytes); -1 when A sampled no memory."""
    b_max_bytes: int
    """Highest peak of B (bytes); -1 when B sampled no memory."""
    delta_bytes: int | None
    """B − A of the highest peak (bytes); None when a run sampled no memory."""
    rel: float
    """delta / A (0.5 = 50 % more than A); NaN when A is not positive or a value is missing."""
    a_max_rank: int
    """The rank with A's highest peak (-1 when none)."""
    b_max_rank: int
    """The rank with B's highest peak (-1 when none)."""


@dataclass(frozen=True, slots=True)
class RateDiff:
    """A rate of both runs: the median over ranks (NaN where unknown)."""

    a: float
    """Run A (per second)."""
    b: float
    """Run B (per second)."""
    delta: float
    """B − A (per second)."""
    rel: float
    """delta / A (0.5 = 50 % more than A); NaN when A is not positive or a value is missing."""


@dataclass(frozen=True, slots=True)
class Throughput:
    """Steps per second and tokens per second (as the ranks record tokens)."""

    steps_per_s: RateDiff
    """Steps per second: steps / (end of the last − start of the first), median over ranks."""
    tokens_per_s: RateDiff | None
    """Tokens per second of the analysed steps, median over ranks; None when neither run
    recorded tokens."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FindingChange(Finding):
    """A bottleneck or finding present in one run only (``kind``: the bottleneck's category or
    the finding's kind; ``severity``: in the run that has it)."""

    source: str
    """"bottleneck" (a rule of :mod:`meshprof.analyze.steps.rules`) or "finding" (of the
    cross-rank report)."""
    rank: int | None
    """The rank a finding names (None for bottlenecks and run-wide findings)."""


@dataclass(frozen=True, slots=True)
class BottleneckChanges:
    """Bottlenecks and findings that appeared (only in B) or vanished (only in A)."""

    appeared: tuple[FindingChange, ...] = ()
    vanished: tuple[FindingChange, ...] = ()


@dataclass(frozen=True, slots=True)
class Headline:
    """One of the most significant changes."""

    what: str
    """What changed, e.g. "step time", "all_reduce 1 MiB p50", "rank 3 compute"."""
    unit: str
    """"ns", "bytes", "fraction" or "1/s"."""
    a: float
    """Value in A."""
    b: float
    """Value in B."""
    delta: float
    """B − A."""
    rel: float
    """delta / A (0.5 = 50 % more than A)."""
    wait_delta_ns: float = math.nan
    """For a collective's p50: B − A of its median wait for late members (ns), the part of
    ``delta`` that is waiting rather than transfer; NaN for other figures, or when a run matched
    none."""
    mostly_waiting: bool = False
    """A collective's p50 that grew by waiting for late ranks: ``wait_delta_ns`` is at least
    half of ``delta`` (look at who arrives late, not at the network)."""


@dataclass(frozen=True, slots=True)
class RunDiff:
    """What changed from run A to run B. Lists are sorted by |delta|, largest first (rows that
    only one run has follow, by their count); ``notes`` say what could not be compared."""

    a_path: str
    """Run directory A."""
    b_path: str
    """Run directory B."""
    a_world_size: int
    """Ranks of A."""
    b_world_size: int
    """Ranks of B."""
    step: StepDiff | None
    """Step time; None when a run recorded no steps."""
    phases: tuple[PhaseDiff, ...]
    """Per phase."""
    ranks: tuple[RankDiff, ...]
    """Per rank (empty when the world sizes or layouts differ), by |compute delta|."""
    collectives: tuple[CollectiveDiff, ...]
    """By op × message size."""
    comm_share: tuple[ShareDiff, ...]
    """Communication share by dimension."""
    memory: MemoryDiff
    """Peak memory."""
    throughput: Throughput
    """Steps/s and tokens/s."""
    bottlenecks: BottleneckChanges
    """Bottlenecks and findings that appeared or vanished."""
    headline: tuple[Headline, ...]
    """The most significant changes, largest relative change first."""
    notes: tuple[str, ...]
    """What was not compared, and why."""
    a_changes: Timeline | None = None
    """When things changed in A, and which of its steps were compared (the latest regime
    when something changed mid-run)."""
    b_changes: Timeline | None = None
    """The same for B."""
    serving: ServingDiff | None = None
    """Serving compared (None: neither run served requests)."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (NaN becomes None; ``serving`` only when a run served requests)."""
        out = to_json(
            {
                "a": {
                    "path": self.a_path,
                    "world_size": self.a_world_size,
                    "changes": _timeline(self.a_changes),
                },
                "b": {
                    "path": self.b_path,
                    "world_size": self.b_world_size,
                    "changes": _timeline(self.b_changes),
                },
                "headline": [dataclasses.asdict(h) for h in self.headline],
                "notes": list(self.notes),
                "step": dataclasses.asdict(self.step) if self.step is not None else None,
                "phases": [dataclasses.asdict(p) for p in self.phases],
                "ranks": [dataclasses.asdict(r) for r in self.ranks],
                "collectives": [dataclasses.asdict(c) for c in self.collectives],
                "comm_share": [dataclasses.asdict(s) for s in self.comm_share],
                "memory": dataclasses.asdict(self.memory),
                "throughput": self.throughput,
                "bottlenecks": self.bottlenecks,
            }
        )
        if self.serving is not None:
            out["serving"] = to_json(self.serving)
        return dict(out)


def _timeline(t: Timeline | None) -> dict[str, Any] | None:
    return dataclass_to_json(t) if t is not None else None

"""The cross-rank run report's types: :class:`RunReport` and its rows, all typed values.

Units: times in ns, sizes in bytes, shares and scores as fractions, bandwidth in GB/s (1e9 B/s).
:meth:`RunReport.to_dict` is the one place the report becomes plain JSON-ready data (the JSON
edge of ``meshprof report --json``); renderers read the typed fields.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from meshprof.analyze.clock import ClockAlignment
from meshprof.analyze.failures import RankFailure
from meshprof.analyze.match import MatchSummary
from meshprof.analyze.run_bottlenecks import RunBottleneck
from meshprof.analyze.stragglers import StragglerReport
from meshprof.analyze.table import GroupRef

if TYPE_CHECKING:
    from meshprof.analyze.kineto import KinetoReport
    from meshprof.analyze.pipeline import PipelineBubble
    from meshprof.analyze.sampling import SamplingInfo
    from meshprof.analyze.steps.types import StepAnalysis
    from meshprof.analyze.what_if import WhatIf


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


@dataclass(frozen=True, slots=True)
class RunFinding:
    """A conclusion of the cross-rank report with the numbers that support it."""

    kind: str
    """"manifest", "straggler", "memory_imbalance", "missing_rank", "clock", "incomplete"."""
    severity: str
    """"warning" or "info"."""
    title: str
    """One line for people."""
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
class RunReport:
    """Everything ``meshprof report`` shows."""

    path: str
    """Run directory."""
    world_size: int
    """Ranks expected."""
    loaded_ranks: tuple[int, ...]
    """Ranks whose file loaded."""
    problems: tuple[tuple[int, str], ...]
    """(rank, why) for missing or damaged rank files."""
    metadata: dict[str, Any]
    """Manifest fields (command, layout, ...)."""
    groups: tuple[GroupRef, ...]
    """Process groups of the run."""
    clock: ClockAlignment
    """Clock offsets and their uncertainty."""
    match: MatchSummary
    """Collective matching statistics."""
    group_rows: tuple[GroupRow, ...]
    """Matching statistics per group."""
    stragglers: StragglerReport
    """Per-step times, scores, stragglers."""
    ranks: tuple[RankRow, ...]
    """Per-rank table."""
    mean_step_ns: float
    """Mean over ranks of their mean step time (ns); NaN without steps."""
    heatmap: StepHeatmap
    """Step time per rank for the last steps."""
    memory: MemoryImbalance
    """Peak memory imbalance."""
    dimensions: tuple[str, ...]
    """Columns of :attr:`comm_share_by_dim`."""
    comm_share_by_dim: np.ndarray
    """float [rank, dimension]: communication time in that dimension's groups / step time."""
    comm_share_total: tuple[float, ...]
    """Per rank (rows of :attr:`comm_share_by_dim`): the sum over dimensions (fraction)."""
    by_size: tuple[SizeRow, ...]
    """Latency and bandwidth by op and message size."""
    timeline: tuple[TimelineItem, ...]
    """A short excerpt of the merged timeline (two steps)."""
    timeline_ns: int
    """Length of the excerpt window (ns)."""
    findings: tuple[RunFinding, ...]
    """Conclusions drawn here (stragglers, memory, missing ranks, clock)."""
    bottlenecks: tuple[RunBottleneck, ...] = ()
    """Bottlenecks: the step monitor's rules on each rank and the cross-rank rules."""
    rank_analyses: tuple[StepAnalysis, ...] = ()
    """The step monitor's analysis of each loaded rank, rank order."""
    pipeline: PipelineBubble | None = None
    """The pipeline bubble measured from all stages' timelines on the aligned clock; None
    without pipelining."""
    kineto: KinetoReport | None = None
    """The torch.profiler traces found in the run directory: per rank HTA's GPU breakdown (or
    the host split on CPU-only traces), the files not read, the kernel-level straggler; None
    when there are none."""
    failures: tuple[RankFailure, ...] = ()
    """The ranks that did not finish normally, the first failure first
    (:func:`meshprof.analyze.failures.find_failures`); empty when all ended normally."""
    what_if: WhatIf | None = None
    """What each slow rank, group and dimension costs every step, from a replay of the matched
    collectives (:mod:`meshprof.analyze.what_if`); None when not computed."""
    sampling: SamplingInfo | None = None
    """How the run was sampled and the resulting error of the main figures; None when every
    collective was loaded."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (numpy arrays become nested lists, NaN becomes None)."""
        return {k: json_ready(part()) for k, part in self._sections()}

    def write_json(self, out: TextIO) -> None:
        """Write ``json.dumps(self.to_dict(), default=str)``, byte for byte, one section (and
        one rank analysis) at a time: the whole dict of a report at thousands of ranks holds
        millions of objects (~100 MiB at 4,096 ranks), more than the rest of the report."""
        out.write("{")
        for i, (k, part) in enumerate(self._sections()):
            out.write((", " if i else "") + json.dumps(k) + ": ")
            if k == "rank_analyses":
                out.write("[")
                for j, a in enumerate(self.rank_analyses):
                    out.write(
                        (", " if j else "") + json.dumps(json_ready(a.to_dict()), default=str)
                    )
                out.write("]")
            else:
                out.write(json.dumps(json_ready(part()), default=str))
        out.write("}")

    def _sections(self) -> list[tuple[str, Callable[[], Any]]]:
        """The top-level keys of :meth:`to_dict` in order, each with a function that builds its
        value (not yet JSON-ready)."""
        s = self.stragglers
        kineto: Callable[[], dict[str, Any]] = lambda: (  # noqa: E731
            self.kineto.to_dict()
            if self.kineto is not None
            else {"ranks": [], "problems": [], "notes": [], "stragglers": None}
        )
        extra: list[tuple[str, Callable[[], Any]]] = (
            [("sampling", lambda: dataclasses.asdict(self.sampling))]  # type: ignore[arg-type]
            if self.sampling is not None
            else []
        )
        what_if = _what_if_dict(self.what_if)
        return [
            *extra,
            (
                "summary",
                lambda: {
                    "path": self.path,
                    "world_size": self.world_size,
                    "loaded_ranks": list(self.loaded_ranks),
                    "steps": len(s.steps),
                    "common_steps": len(s.common_steps),
                    "stragglers": [x.rank for x in s.stragglers],
                    "metadata": self.metadata,
                    "findings": [dataclasses.asdict(f) for f in self.findings],
                },
            ),
            ("failures", lambda: [dataclasses.asdict(f) for f in self.failures]),
            ("problems", lambda: [{"rank": r, "reason": why} for r, why in self.problems]),
            ("ranks", lambda: [dataclasses.asdict(r) for r in self.ranks]),
            (
                "stragglers",
                lambda: {
                    "threshold": s.threshold,
                    "last_share_min": s.last_share_min,
                    "resolution_ns": s.resolution_ns,
                    "note": s.note,
                    "named": [dataclasses.asdict(x) for x in s.stragglers],
                    "scores": [
                        dataclasses.asdict(x) | {"last_share": x.last_share} for x in s.scores
                    ],
                    "phases": list(s.phases),
                    "phase_ns": s.phase_ns.tolist(),
                    "steps": list(s.steps),
                    "step_ns": s.step_ns.tolist(),
                },
            ),
            (
                "collectives",
                lambda: (
                    dataclasses.asdict(self.match)
                    | {"groups": [dataclasses.asdict(g) for g in self.group_rows]}
                ),
            ),
            (
                "clock",
                lambda: {
                    "reference_rank": self.clock.reference_rank,
                    "max_uncertainty_ns": self.clock.max_uncertainty_ns,
                    "ranks": [dataclasses.asdict(c) for c in self.clock.ranks],
                },
            ),
            ("memory", lambda: dataclasses.asdict(self.memory)),
            (
                "comm_share_by_dimension",
                lambda: {
                    "dimensions": list(self.dimensions),
                    "ranks": list(s.ranks),
                    "share": self.comm_share_by_dim.tolist(),
                },
            ),
            ("by_size", lambda: [dataclasses.asdict(x) for x in self.by_size]),
            ("bottlenecks", lambda: [b.to_dict() for b in self.bottlenecks]),
            ("rank_analyses", lambda: [a.to_dict() for a in self.rank_analyses]),
            (
                "pipeline",
                lambda: dataclasses.asdict(self.pipeline) if self.pipeline is not None else None,
            ),
            ("kineto", kineto),
            *((k, (lambda v=v: v)) for k, v in what_if.items()),
        ]


def _what_if_dict(w: WhatIf | None) -> dict[str, Any]:
    """The what-if keys of the JSON report: ``what_if`` (ranks), ``what_if_groups``,
    ``what_if_dims`` (largest saving first) and ``what_if_info`` (what was replayed)."""
    if w is None:
        return {"what_if": [], "what_if_groups": [], "what_if_dims": [], "what_if_info": None}
    return {
        "what_if": [dataclasses.asdict(x) for x in w.ranks],
        "what_if_groups": [dataclasses.asdict(x) for x in w.groups],
        "what_if_dims": [dataclasses.asdict(x) for x in w.dims],
        "what_if_info": {
            "steps": list(w.steps),
            "step_ns": w.step_ns,
            "ranks_total": w.ranks_total,
            "ranks_replayed": len(w.ranks),
            "levels": w.levels,
            "replay_error_ns": w.replay_error_ns,
            "min_share": w.min_share,
            "note": w.note,
        },
    }


def json_ready(o: Any) -> Any:
    """``o`` with dict keys as strings, tuples as lists, numpy scalars as Python numbers and
    non-finite floats as None."""
    # exact built-in types first: a report at thousands of ranks holds millions of leaves
    t = type(o)
    if t is str or t is int or t is bool or o is None:
        return o
    if t is float:
        return o if math.isfinite(o) else None
    if t is list or t is tuple:
        return [json_ready(v) for v in o]
    if t is dict:
        return {k if type(k) is str else str(k): json_ready(v) for k, v in o.items()}
    if isinstance(o, dict):
        return {str(k): json_ready(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [json_ready(v) for v in o]
    if isinstance(o, float | np.floating):
        return None if not np.isfinite(o) else float(o)
    if isinstance(o, np.integer):
        return int(o)
    return o

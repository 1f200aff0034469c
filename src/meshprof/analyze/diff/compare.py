"""Comparing two runs (``meshprof diff A B``): what changed from run A to run B.

Two pure steps:

1. :func:`run_side`: the figures of one run that a comparison needs, taken from the sections of
   its cross-rank report (:func:`meshprof.report.diff_input.side_of` hands them over), so that a
   run's full report and events can be let go before the other run is analysed;
2. :func:`diff_runs`: the two sides compared, every delta B − A (:class:`RunDiff`).

Definitions (each figure is the report's own, compared):

- step time: per rank the median of its step times; per run the median over ranks;
- phase time: per rank the median over its analysed steps of the phase's time in a step (its
  spans summed); per run the median over the ranks that have the phase;
- per rank (only when both runs have the same world size and layout, so that rank i plays the
  same role in both): the medians over its steps of step, compute (step − communication) and
  wait (time waiting for other ranks in collectives), and its peak memory;
- collectives: per op and power-of-two size bucket, the median duration and bus bandwidth over
  all events of all ranks (comparable across world sizes: nccl-tests' bus bandwidth accounts for
  the group size);
- communication share per dimension: the mean over ranks of the time in that dimension's
  collectives / step time;
- memory: the highest peak of any rank; throughput: median over ranks of steps/s and tokens/s;
- bottlenecks and findings: matched by category (bottlenecks) or by kind and rank (findings).

A collective's p50 in the headline says how much of its change is the members' median wait for
the last one to arrive (the report's ``wait_p50_ns``): a p50 that grew *mostly by waiting* (at
least :data:`WAITING_SHARE` of its growth) is a rank arriving late, not a slower transfer.

Lists are sorted by |delta|, largest first. The headline lists the changes of at least
:data:`HEADLINE_MIN_REL` relative size, a time change also at least :data:`HEADLINE_MIN_STEP_SHARE`
of A's step time (when A has steps), largest relative change first, at most
:data:`HEADLINE_MAX`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from meshprof.analyze.diff.relative import relative
from meshprof.analyze.diff.serving_diff import headline_rows, serving_diff
from meshprof.analyze.diff.types import (
    BottleneckChanges,
    CollectiveDiff,
    FindingChange,
    Headline,
    MemoryDiff,
    PhaseDiff,
    RankDiff,
    RateDiff,
    RunDiff,
    ShareDiff,
    StepDiff,
    Throughput,
)
from meshprof.analyze.run.conclusions.run_bottlenecks import RunBottleneck
from meshprof.analyze.run.events.changes import Timeline
from meshprof.analyze.run.stragglers.stragglers import StragglerReport
from meshprof.analyze.run.types import (
    CommShareByDimension,
    MemoryImbalance,
    RankProblem,
    RankRow,
    RunFinding,
    SizeRow,
)
from meshprof.analyze.serve.types import ServingReport
from meshprof.analyze.steps.types import StepAnalysis
from meshprof.errors import MeshprofError
from meshprof.layout import Layout

HEADLINE_MIN_REL = 0.05
"""A change enters the headline when |B − A| / A is at least this (5 %)."""
HEADLINE_MIN_STEP_SHARE = 0.01
"""... and, for a time, when |B − A| is at least this share of A's median step time (1 %)."""
HEADLINE_MAX = 8
"""Most changes in the headline."""
WAITING_SHARE = 0.5
"""A collective's p50 grew *mostly by waiting* when its median wait for late members grew by at
least this share of the p50's growth."""
_NAN = math.nan


@dataclass(frozen=True, slots=True)
class RankFigures:
    """One rank of a run, as the comparison sees it (medians over its recorded steps, ns)."""

    rank: int
    step_ns: float
    compute_ns: float
    wait_ns: float
    peak_memory_bytes: int
    """-1 when not sampled."""


@dataclass(frozen=True, slots=True)
class RunSide:
    """The figures of one run that a comparison needs (see the module docstring)."""

    path: str
    world_size: int
    layout: Layout | None
    """The run's dp × tp × pp layout, None when unknown."""
    missing_ranks: tuple[int, ...]
    """Ranks whose file is missing or damaged."""
    steps: int
    """Step numbers recorded by any rank."""
    step_ns: float
    """Median over ranks of their median step time (ns); NaN without steps."""
    phases: dict[str, float]
    """Phase name -> median over ranks of the phase's median time per step (ns)."""
    ranks: tuple[RankFigures, ...]
    """Per loaded rank, rank order."""
    by_size: tuple[SizeRow, ...]
    """The report's latency and bandwidth by op and size."""
    comm_share: dict[str, float]
    """Dimension -> mean over ranks of its communication share of the step."""
    max_memory_bytes: int
    """Highest peak memory (-1 when nothing was sampled)."""
    max_memory_rank: int
    """Its rank (-1 when none)."""
    steps_per_s: float
    """Median over ranks (NaN without steps)."""
    tokens_per_s: float
    """Median over the ranks that recorded tokens (NaN when none did)."""
    findings: tuple[FindingChange, ...]
    """Its bottlenecks and findings, as they would be listed if they appeared or vanished."""
    timeline: Timeline | None = None
    """When things changed in it, and which steps its report analysed."""
    serving: ServingReport | None = None
    """Its serving section (None: it served no requests)."""

    @property
    def has_collectives(self) -> bool:
        return bool(self.by_size)


def _nanmedian(v: Iterable[float]) -> float:
    a = np.asarray([x for x in v if not math.isnan(x)], dtype=np.float64)
    return float(np.median(a)) if len(a) else _NAN


def _row_medians(m: np.ndarray) -> list[float]:
    """Median of each row, NaN entries left out (NaN for a row without values)."""
    if m.size == 0:
        return [_NAN] * m.shape[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return [float(v) for v in np.nanmedian(m, axis=1)]


def _findings_of(
    bottlenecks: tuple[RunBottleneck, ...], findings: tuple[RunFinding, ...]
) -> tuple[FindingChange, ...]:
    out = [
        FindingChange(
            source="bottleneck",
            kind=b.bottleneck.kind,
            rank=None,
            severity=b.bottleneck.severity,
            title=f"{b.bottleneck.kind}: {b.evidence_text}",
        )
        for b in bottlenecks
    ]
    for f in findings:
        rank = f.evidence.get("rank", f.evidence.get("max_rank"))
        out.append(
            FindingChange(
                source="finding",
                kind=f.kind,
                rank=rank if isinstance(rank, int) else None,
                ranks=f.ranks,
                severity=f.severity,
                title=f.title,
            )
        )
    return tuple(out)


@dataclass(frozen=True, slots=True)
class RunFigures:
    """What :func:`run_side` reads: sections of one run's cross-rank report."""

    path: str
    world_size: int
    problems: tuple[RankProblem, ...]
    stragglers: StragglerReport
    ranks: tuple[RankRow, ...]
    rank_analyses: tuple[StepAnalysis, ...]
    comm_share: CommShareByDimension
    by_size: tuple[SizeRow, ...]
    memory: MemoryImbalance
    bottlenecks: tuple[RunBottleneck, ...]
    findings: tuple[RunFinding, ...]
    timeline: Timeline | None = None
    """When things changed in the run, and which steps its report analysed."""
    serving: ServingReport | None = None
    """Its serving section (None: it served no requests)."""


def run_side(rep: RunFigures, layout: Layout | None) -> RunSide:
    """The figures of one run that :func:`diff_runs` compares (``layout``: the run's layout,
    :meth:`meshprof.rundir.LoadedRun.layout`)."""
    s = rep.stragglers
    has_steps = bool(s.steps)
    compute = _row_medians(s.compute_ns) if has_steps else [_NAN] * len(s.ranks)
    wait = _row_medians(s.wait_ns) if has_steps else [_NAN] * len(s.ranks)
    ranks = tuple(
        RankFigures(row.rank, row.step_p50_ns, compute[i], wait[i], row.peak_memory_bytes)
        for i, row in enumerate(rep.ranks)
    )
    phase_vals: dict[str, list[float]] = {}
    for a in rep.rank_analyses:
        for p in a.phases:
            phase_vals.setdefault(p.name, []).append(p.time.p50_ns)
    share: dict[str, float] = {}
    if len(s.ranks):
        for j, d in enumerate(rep.comm_share.dimensions):
            share[d] = float(np.mean(rep.comm_share.share[:, j]))
    tokens = [a.tokens_per_s for a in rep.rank_analyses if a.tokens_per_s > 0]
    return RunSide(
        path=rep.path,
        world_size=rep.world_size,
        layout=layout,
        missing_ranks=tuple(p.rank for p in rep.problems),
        steps=len(s.steps),
        step_ns=_nanmedian(r.step_ns for r in ranks) if has_steps else _NAN,
        phases={n: _nanmedian(v) for n, v in phase_vals.items()} if has_steps else {},
        ranks=ranks,
        by_size=rep.by_size,
        comm_share=share,
        max_memory_bytes=rep.memory.max_bytes,
        max_memory_rank=rep.memory.max_rank,
        steps_per_s=_nanmedian(r.steps_per_s for r in rep.ranks) if has_steps else _NAN,
        tokens_per_s=_nanmedian(tokens) if tokens else _NAN,
        findings=_findings_of(rep.bottlenecks, rep.findings),
        timeline=rep.timeline,
        serving=rep.serving,
    )


def check_side(side: RunSide) -> None:
    """Raise :class:`MeshprofError` when a run has nothing to compare (no steps and no
    collectives)."""
    if not side.steps and not side.has_collectives:
        raise MeshprofError(
            f"{side.path}: no steps and no completed collectives recorded: nothing to compare"
        )


def _check_pair(a: RunSide, b: RunSide) -> None:
    check_side(a)
    check_side(b)
    if not (a.steps and b.steps) and not (a.has_collectives and b.has_collectives):
        what = {True: "steps only", False: "collectives only"}
        raise MeshprofError(
            f"runs do not match: {a.path} has {what[bool(a.steps)]}, {b.path} has "
            f"{what[bool(b.steps)]}: nothing recorded by both to compare"
        )


def _sort_key(delta: float, count: int = 0) -> tuple[int, float, int]:
    """Largest |delta| first; rows without a delta (one run only) after them, larger first."""
    return (0, -abs(delta), 0) if not math.isnan(delta) else (1, 0.0, -count)


def _phases(a: RunSide, b: RunSide) -> tuple[PhaseDiff, ...]:
    names = list(a.phases) + [n for n in b.phases if n not in a.phases]
    rows = [
        PhaseDiff(
            n,
            a.phases.get(n, _NAN),
            b.phases.get(n, _NAN),
            b.phases.get(n, _NAN) - a.phases.get(n, _NAN),
            relative(b.phases.get(n, _NAN) - a.phases.get(n, _NAN), a.phases.get(n, _NAN)),
        )
        for n in names
    ]
    return tuple(sorted(rows, key=lambda p: _sort_key(p.delta_ns)))


def _collectives(a: RunSide, b: RunSide) -> tuple[CollectiveDiff, ...]:
    ra = {(x.op, x.size_bucket): x for x in a.by_size}
    rb = {(x.op, x.size_bucket): x for x in b.by_size}
    rows = []
    for key in sorted(set(ra) | set(rb)):
        xa, xb = ra.get(key), rb.get(key)
        a50 = xa.p50_ns if xa else _NAN
        b50 = xb.p50_ns if xb else _NAN
        rows.append(
            CollectiveDiff(
                op=key[0],
                size_bytes=key[1],
                a_p50_ns=a50,
                b_p50_ns=b50,
                delta_ns=b50 - a50,
                rel=relative(b50 - a50, a50),
                a_busbw_gbps=xa.busbw_gbps if xa else _NAN,
                b_busbw_gbps=xb.busbw_gbps if xb else _NAN,
                a_count=xa.count if xa else 0,
                b_count=xb.count if xb else 0,
                a_wait_p50_ns=xa.wait_p50_ns if xa else _NAN,
                b_wait_p50_ns=xb.wait_p50_ns if xb else _NAN,
            )
        )
    return tuple(sorted(rows, key=lambda c: _sort_key(c.delta_ns, max(c.a_count, c.b_count))))


def _comm_share(a: RunSide, b: RunSide) -> tuple[ShareDiff, ...]:
    dims = list(a.comm_share) + [d for d in b.comm_share if d not in a.comm_share]
    rows = []
    for d in dims:
        va, vb = a.comm_share.get(d, 0.0), b.comm_share.get(d, 0.0)
        rows.append(ShareDiff(d, va, vb, vb - va))
    return tuple(sorted(rows, key=lambda s: _sort_key(s.delta)))


def _layout_text(lay: Layout | None) -> str:
    return f"dp={lay.dp},tp={lay.tp},pp={lay.pp}" if lay is not None else "unknown"


def _ranks(a: RunSide, b: RunSide, notes: list[str]) -> tuple[RankDiff, ...]:
    """Per-rank deltas when the ranks correspond (else a note says why not)."""
    if a.world_size != b.world_size:
        notes.append(f"per-rank comparison skipped: world sizes {a.world_size} vs {b.world_size}")
        return ()
    if a.layout != b.layout:
        notes.append(
            "per-rank comparison skipped: layouts "
            f"{_layout_text(a.layout)} vs {_layout_text(b.layout)}"
        )
        return ()
    fa = {x.rank: x for x in a.ranks}
    fb = {x.rank: x for x in b.ranks}
    common = sorted(set(fa) & set(fb))
    if len(common) < max(len(fa), len(fb)):
        notes.append(
            f"per-rank comparison over the {len(common)} ranks loaded in both runs "
            f"(missing in A: {list(a.missing_ranks) or 'none'}, in B: {list(b.missing_ranks) or 'none'})"
        )
    rows = []
    for r in common:
        xa, xb = fa[r], fb[r]
        mem = (
            xb.peak_memory_bytes - xa.peak_memory_bytes
            if xa.peak_memory_bytes >= 0 and xb.peak_memory_bytes >= 0
            else None
        )
        rows.append(
            RankDiff(
                rank=r,
                a_step_ns=xa.step_ns,
                b_step_ns=xb.step_ns,
                step_delta_ns=xb.step_ns - xa.step_ns,
                compute_delta_ns=xb.compute_ns - xa.compute_ns,
                wait_delta_ns=xb.wait_ns - xa.wait_ns,
                memory_delta_bytes=mem,
            )
        )

    def key(x: RankDiff) -> tuple[int, float, float, int]:
        c = x.compute_delta_ns
        s = x.step_delta_ns
        m = float(abs(x.memory_delta_bytes or 0))
        if math.isnan(c):  # no steps: by memory
            return (1, -m, 0.0, x.rank)
        return (0, -abs(c), -(abs(s) if not math.isnan(s) else 0.0), x.rank)

    return tuple(sorted(rows, key=key))


def _memory(a: RunSide, b: RunSide) -> MemoryDiff:
    both = a.max_memory_bytes >= 0 and b.max_memory_bytes >= 0
    delta = b.max_memory_bytes - a.max_memory_bytes if both else None
    return MemoryDiff(
        a_max_bytes=a.max_memory_bytes,
        b_max_bytes=b.max_memory_bytes,
        delta_bytes=delta,
        rel=relative(float(delta), float(a.max_memory_bytes)) if delta is not None else _NAN,
        a_max_rank=a.max_memory_rank,
        b_max_rank=b.max_memory_rank,
    )


def _rate(a: float, b: float) -> RateDiff:
    return RateDiff(a, b, b - a, relative(b - a, a))


def _throughput(a: RunSide, b: RunSide) -> Throughput:
    tokens = None
    if not (math.isnan(a.tokens_per_s) and math.isnan(b.tokens_per_s)):
        tokens = _rate(a.tokens_per_s, b.tokens_per_s)
    return Throughput(_rate(a.steps_per_s, b.steps_per_s), tokens)


def _bottlenecks(a: RunSide, b: RunSide) -> BottleneckChanges:
    def key(f: FindingChange) -> tuple[str, str, int | None]:
        return (f.source, f.kind, f.rank)

    ka = {key(f) for f in a.findings}
    kb = {key(f) for f in b.findings}
    return BottleneckChanges(
        appeared=tuple(f for f in b.findings if key(f) not in ka),
        vanished=tuple(f for f in a.findings if key(f) not in kb),
    )


def _fmt_size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def _headline(
    d_step: StepDiff | None,
    phases: tuple[PhaseDiff, ...],
    ranks: tuple[RankDiff, ...],
    colls: tuple[CollectiveDiff, ...],
    shares: tuple[ShareDiff, ...],
    mem: MemoryDiff,
    tp: Throughput,
    a_ranks: dict[int, RankFigures],
) -> tuple[Headline, ...]:
    """The changes that pass the headline's thresholds (see the module docstring)."""
    cand: list[tuple[str, str, float, float]] = []  # (what, unit, A, B)
    if d_step is not None:
        cand.append(("step time", "ns", d_step.a_ns, d_step.b_ns))
    cand += [(f"phase {p.phase}", "ns", p.a_ns, p.b_ns) for p in phases]
    waits: dict[str, float] = {}  # collective p50 -> B − A of its median wait
    for c in colls:
        what = f"{c.op} {_fmt_size(c.size_bytes)} p50"
        cand.append((what, "ns", c.a_p50_ns, c.b_p50_ns))
        waits[what] = c.b_wait_p50_ns - c.a_wait_p50_ns
    if ranks and not math.isnan(ranks[0].compute_delta_ns):
        r = ranks[0]  # the largest compute change stands for the ranks
        a_c = a_ranks[r.rank].compute_ns
        cand.append((f"rank {r.rank} compute", "ns", a_c, a_c + r.compute_delta_ns))
    mem_ranks = [x for x in ranks if x.memory_delta_bytes]
    if mem_ranks:
        r = max(mem_ranks, key=lambda x: abs(x.memory_delta_bytes or 0))
        a_m = float(a_ranks[r.rank].peak_memory_bytes)
        cand.append((f"rank {r.rank} peak memory", "bytes", a_m, a_m + (r.memory_delta_bytes or 0)))
    if mem.delta_bytes is not None:
        cand.append(
            ("peak memory (highest rank)", "bytes", float(mem.a_max_bytes), float(mem.b_max_bytes))
        )
    cand += [(f"comm share {s.dim}", "fraction", s.a, s.b) for s in shares]
    cand.append(("steps/s", "1/s", tp.steps_per_s.a, tp.steps_per_s.b))
    if tp.tokens_per_s is not None:
        cand.append(("tokens/s", "1/s", tp.tokens_per_s.a, tp.tokens_per_s.b))
    step_a = d_step.a_ns if d_step is not None else _NAN
    out = []
    for what, unit, a, b in cand:
        delta = b - a
        rel = relative(delta, a)
        if math.isnan(rel) or abs(rel) < HEADLINE_MIN_REL:
            continue
        if unit == "ns" and step_a > 0 and abs(delta) < HEADLINE_MIN_STEP_SHARE * step_a:
            continue
        wait = waits.get(what, _NAN)
        waiting = delta > 0 and wait >= WAITING_SHARE * delta  # (False when wait is NaN)
        out.append(Headline(what, unit, a, b, delta, rel, wait, waiting))
    out.sort(key=lambda h: -abs(h.rel))
    return tuple(out[:HEADLINE_MAX])


def diff_runs(a: RunSide, b: RunSide) -> RunDiff:
    """What changed from run A to run B (every delta B − A; see the module docstring). Raises
    :class:`MeshprofError` when a run has neither steps nor collectives, or when the runs share
    neither (one has only steps, the other only collectives)."""
    _check_pair(a, b)
    notes: list[str] = []
    d_step = None
    if a.steps and b.steps:
        delta = b.step_ns - a.step_ns
        d_step = StepDiff(a.step_ns, b.step_ns, delta, relative(delta, a.step_ns))
    else:
        which = " and ".join(f"{n} ({s.path})" for n, s in (("A", a), ("B", b)) if not s.steps)
        notes.append(f"step and phase comparison skipped: {which} recorded no steps")
    phases = _phases(a, b) if d_step is not None else ()
    ranks = _ranks(a, b, notes)
    if not (a.has_collectives and b.has_collectives):
        which = " and ".join(
            f"{n} ({s.path})" for n, s in (("A", a), ("B", b)) if not s.has_collectives
        )
        notes.append(f"collective comparison: {which} recorded no completed collectives")
    colls = _collectives(a, b)
    only_a = [c for c in colls if c.b_count == 0]
    only_b = [c for c in colls if c.a_count == 0]
    if a.has_collectives and b.has_collectives and (only_a or only_b):
        notes.append(
            f"op × size rows in one run only: {len(only_a)} in A only, {len(only_b)} in B only"
        )
    shares: tuple[ShareDiff, ...] = ()
    if bool(a.steps) == bool(b.steps):
        shares = _comm_share(a, b)
    else:  # a share of the step against a share of the recorded time: not the same figure
        notes.append("communication share comparison skipped: one run has steps, the other none")
    mem = _memory(a, b)
    tp = _throughput(a, b)
    head = _headline(d_step, phases, ranks, colls, shares, mem, tp, {x.rank: x for x in a.ranks})
    serving = serving_diff(a.serving, b.serving)
    if serving is not None and serving.note:
        notes.append(serving.note)
    served = [Headline(f.figure, f.unit, f.a, f.b, f.delta, f.rel) for f in headline_rows(serving)]
    head = tuple(sorted((*head, *served), key=lambda h: -abs(h.rel))[:HEADLINE_MAX])
    return RunDiff(
        a_path=a.path,
        b_path=b.path,
        a_world_size=a.world_size,
        b_world_size=b.world_size,
        step=d_step,
        phases=phases,
        ranks=ranks,
        collectives=colls,
        comm_share=shares,
        memory=mem,
        throughput=tp,
        bottlenecks=_bottlenecks(a, b),
        headline=head,
        notes=tuple(notes),
        a_changes=a.timeline,
        b_changes=b.timeline,
        serving=serving,
    )

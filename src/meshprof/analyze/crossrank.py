"""The cross-rank report: one pure function from a loaded run to a :class:`RunReport`.

Steps, in order: flatten events (:mod:`.table`), align clocks (:mod:`.clock`), match collectives
(:mod:`.match`), score stragglers (:mod:`.stragglers`), then the per-rank table, memory imbalance,
communication share by parallelism dimension, latency/bandwidth by message size, a timeline
excerpt, and findings. ``bottlenecks`` (from :mod:`meshprof.monitor`) are carried through as given.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from meshprof.analyze.clock import ClockAlignment, align_clocks
from meshprof.analyze.match import CollectiveMatch, MatchSummary, match_collectives, summarize_match
from meshprof.analyze.plain import plain_dict
from meshprof.analyze.sorting import RowsByKey
from meshprof.analyze.stragglers import (
    DEFAULT_THRESHOLD,
    StragglerReport,
    _union,
    covered_ns,
    find_stragglers,
)
from meshprof.analyze.table import EventTable, GroupRef, build_event_table
from meshprof.events import bandwidth_arrays, size_bucket_array
from meshprof.rundir import LoadedRun

MEMORY_IMBALANCE_THRESHOLD = 0.20
"""Peak memory above the median rank by more than this fraction is reported as a finding (the
same default as :class:`meshprof.monitor.BottleneckThresholds.memory_imbalance`)."""


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
class Finding:
    """A conclusion with the numbers that support it."""

    kind: str
    """"straggler", "memory_imbalance", "missing_rank", "clock", "incomplete"."""
    severity: str
    """"warning" or "info"."""
    title: str
    """One line for people."""
    evidence: dict[str, Any] = field(default_factory=dict)
    """The figures behind it (ns, bytes, fractions)."""


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
    memory: MemoryImbalance
    """Peak memory imbalance."""
    dimensions: tuple[str, ...]
    """Columns of :attr:`comm_share_by_dim`."""
    comm_share_by_dim: np.ndarray
    """float [rank, dimension]: communication time in that dimension's groups / step time."""
    by_size: tuple[SizeRow, ...]
    """Latency and bandwidth by op and message size."""
    timeline: tuple[TimelineItem, ...]
    """A short excerpt of the merged timeline (two steps)."""
    timeline_ns: int
    """Length of the excerpt window (ns)."""
    findings: tuple[Finding, ...]
    """Conclusions drawn here (stragglers, memory, missing ranks, clock)."""
    bottlenecks: tuple[dict[str, Any], ...] = ()
    """Bottlenecks: the step monitor's rules on each rank and the cross-rank rules."""
    rank_analyses: tuple[dict[str, Any], ...] = ()
    """The step monitor's analysis of each rank (:class:`meshprof.monitor.StepAnalysis` as dicts)."""
    pipeline: dict[str, Any] | None = None
    """The pipeline bubble measured from all stages' timelines on the aligned clock
    (:class:`meshprof.monitor.pipeline.PipelineBubble` as a dict); None without pipelining."""
    kineto: tuple[dict[str, Any], ...] = ()
    """Per rank, torch.profiler traces found in the run directory split into computation,
    communication and other time (:class:`meshprof.analyze.kineto.KinetoBreakdown` as dicts)."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (numpy arrays become nested lists, NaN becomes None)."""
        s = self.stragglers
        return _clean(
            {
                "summary": {
                    "path": self.path,
                    "world_size": self.world_size,
                    "loaded_ranks": list(self.loaded_ranks),
                    "steps": len(s.steps),
                    "common_steps": len(s.common_steps),
                    "stragglers": [x.rank for x in s.stragglers],
                    "metadata": self.metadata,
                    "findings": [dataclasses.asdict(f) for f in self.findings],
                },
                "problems": [{"rank": r, "reason": why} for r, why in self.problems],
                "ranks": [dataclasses.asdict(r) for r in self.ranks],
                "stragglers": {
                    "threshold": s.threshold,
                    "last_share_min": s.last_share_min,
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
                "collectives": dataclasses.asdict(self.match)
                | {"groups": [dataclasses.asdict(g) for g in self.group_rows]},
                "clock": {
                    "reference_rank": self.clock.reference_rank,
                    "max_uncertainty_ns": self.clock.max_uncertainty_ns,
                    "ranks": [dataclasses.asdict(c) for c in self.clock.ranks],
                },
                "memory": dataclasses.asdict(self.memory),
                "comm_share_by_dimension": {
                    "dimensions": list(self.dimensions),
                    "ranks": list(s.ranks),
                    "share": self.comm_share_by_dim.tolist(),
                },
                "by_size": [dataclasses.asdict(x) for x in self.by_size],
                "bottlenecks": [dict(b) for b in self.bottlenecks],
                "rank_analyses": list(self.rank_analyses),
                "pipeline": self.pipeline,
                "kineto": list(self.kineto),
            }
        )


def _clean(o: Any) -> Any:
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_clean(v) for v in o]
    if isinstance(o, float | np.floating):
        return None if not np.isfinite(o) else float(o)
    if isinstance(o, np.integer):
        return int(o)
    return o


def _peak(mem: np.ndarray) -> int:
    if not len(mem):
        return -1
    dev = mem["peak"][mem["peak"] >= 0]
    if len(dev) and (mem["allocated"] >= 0).any():
        return int(dev.max())
    for col in ("rss", "peak", "allocated"):
        v = mem[col][mem[col] >= 0]
        if len(v):
            return int(v.max())
    return -1


_BW_CHUNK = 1 << 16  # rows per bandwidth chunk (its temporaries stay a few MB)


def _recorded_by_size(run: LoadedRun) -> dict[tuple[str, int], int] | None:
    """(op, size bucket) -> exact collectives issued, summed over the loaded ranks' statistics
    (None when some rank file carries none)."""
    out: dict[tuple[str, int], int] = {}
    for rd in run.ranks.values():
        stats = rd.meta.get("stats")
        if not isinstance(stats, dict) or "rows" not in stats:
            return None
        for r in stats["rows"]:
            try:
                key = (str(r["op"]), int(r["bucket"]))
                out[key] = out.get(key, 0) + int(r["count"])
            except (KeyError, TypeError, ValueError):
                return None
    return out


def _with_recorded(
    rows: tuple[SizeRow, ...], recorded: dict[tuple[str, int], int] | None
) -> tuple[SizeRow, ...]:
    if recorded is None:
        return rows
    return tuple(
        dataclasses.replace(x, recorded=recorded.get((x.op, x.size_bucket), x.count)) for x in rows
    )


def _by_size(table: EventTable) -> tuple[SizeRow, ...]:
    if not len(table):
        return ()
    from meshprof.events import OP_CODES

    code_of = np.asarray([OP_CODES.get(o, OP_CODES["custom"]) for o in table.ops], dtype=np.int64)
    # one small key per row, op · 128 + (exponent of the size bucket + 1, 0 for empty
    # messages), computed in chunks (4 B per row in all, no full-length sort); then the rows of
    # each (op, bucket), in row order, by one comparison per distinct key
    n = len(table)
    key = np.empty(n, dtype=np.int32)
    for c0 in range(0, n, _BW_CHUNK):
        c1 = min(c0 + _BW_CHUNK, n)
        bucket = size_bucket_array(table.size_bytes[c0:c1])
        exp = np.zeros(c1 - c0, dtype=np.int64)
        pos = bucket > 0
        exp[pos] = np.log2(bucket[pos]).astype(np.int64) + 1
        exp += table.op[c0:c1].astype(np.int64) * 128
        key[c0:c1] = exp
    rows = []
    for k in np.flatnonzero(np.bincount(key)).tolist():
        idx = np.flatnonzero(key == k)
        o, e = divmod(k, 128)
        b = 0 if e == 0 else 1 << (e - 1)
        d = table.duration_ns[idx]
        alg = np.empty(len(idx))
        bus = np.empty(len(idx))
        for c0 in range(0, len(idx), _BW_CHUNK):
            ci = idx[c0 : c0 + _BW_CHUNK]
            sz = table.size_bytes[ci]
            alg[c0 : c0 + len(ci)], bus[c0 : c0 + len(ci)] = bandwidth_arrays(
                np.full(len(ci), code_of[o]), sz, sz, d[c0 : c0 + len(ci)], table.group_size[ci]
            )
        del idx
        # sorted in place: the percentiles below copy nothing (numpy's median and percentile
        # would each copy the column)
        d.sort()
        alg.sort()
        bus.sort()
        rows.append(
            SizeRow(
                table.ops[o],
                b,
                len(d),
                _sorted_pct(d, 50),
                _sorted_pct(d, 95),
                _sorted_pct(alg, 50),
                _sorted_pct(bus, 50),
            )
        )
        del d, alg, bus
    return tuple(sorted(rows, key=lambda r: (r.op, r.size_bucket)))


def _sorted_pct(v: np.ndarray, q: float) -> float:
    """``np.percentile(v, q)`` (linear interpolation) of an already sorted array."""
    pos = (len(v) - 1) * (q / 100)
    i = int(np.floor(pos))
    j = min(i + 1, len(v) - 1)
    lo, hi = float(v[i]), float(v[j])
    t = pos - i
    # numpy's lerp, for identical results
    return hi - (hi - lo) * (1 - t) if t >= 0.5 else lo + (hi - lo) * t


def _group_rows(table: EventTable, m: CollectiveMatch) -> tuple[GroupRow, ...]:
    rows = []
    skew = m.skew_ns
    wait_by_coll = (
        np.bincount(m.member_coll, weights=m.member_wait_ns, minlength=len(m))
        if len(m)
        else np.zeros(0)
    )
    by_group = RowsByKey(m.gid)  # one sort, not one pass over every collective per group
    complete = m.complete
    multi = m.present >= 2
    for g, ref in enumerate(table.groups):
        sel = by_group.rows(g)
        if not len(sel):
            continue
        ok = sel[multi[sel]]
        rows.append(
            GroupRow(
                ref.name,
                ref.desc,
                ref.dimension,
                len(ref.ranks),
                len(sel),
                int((~complete[sel]).sum()),
                float(np.median(skew[ok])) if len(ok) else 0.0,
                float(skew[ok].max()) if len(ok) else 0.0,
                int(wait_by_coll[sel].sum()),
            )
        )
    return tuple(rows)


def _comm_by_dim(
    run: LoadedRun, table: EventTable, s: StragglerReport
) -> tuple[tuple[str, ...], np.ndarray]:
    dims = tuple(
        sorted(
            {g.dimension for g in table.groups},
            key=lambda d: ("dp", "tp", "pp").index(d) if d in ("dp", "tp", "pp") else 9,
        )
    )
    out = np.zeros((len(s.ranks), len(dims)))
    gdim = np.asarray([dims.index(g.dimension) for g in table.groups] or [0], dtype=np.int64)
    gdim_row = gdim[table.gid]
    start_all, end_all = table.start_ns, table.end_ns
    by_rank = RowsByKey(table.rank)
    for i, r in enumerate(s.ranks):
        mine = by_rank.rows(r)
        st = run.ranks[r].spans
        st = st[st["kind"] == 0]
        if len(st):
            a = st["start_ns"].astype(np.int64)
            b = a + st["duration_ns"].astype(np.int64)
        elif len(mine):
            a = np.asarray([start_all[mine].min()])
            b = np.asarray([end_all[mine].max()])
        else:
            continue
        total = float((b - a).sum())
        gd = gdim_row[mine]
        for j in range(len(dims)):
            sel = mine[gd == j]
            us, ue = _union(start_all[sel], end_all[sel])
            out[i, j] = float(covered_ns(us, ue, a, b).sum()) / total if total > 0 else 0.0
    return dims, out


_TIMELINE_COMM_ITEMS = 20_000


def _timeline(
    run: LoadedRun, table: EventTable, clock: ClockAlignment, s: StragglerReport
) -> tuple[tuple[TimelineItem, ...], int]:
    """Two steps from the middle of the run (or the first 50 ms of events without steps)."""
    starts: list[int] = []
    ends: list[int] = []
    pick = s.common_steps or s.steps
    chosen = set(pick[len(pick) // 2 : len(pick) // 2 + 2]) if pick else set()
    for r in s.ranks:
        sp = run.ranks[r].spans
        st = sp[(sp["kind"] == 0) & np.isin(sp["step"], list(chosen))]
        if len(st):
            a = st["start_ns"].astype(np.int64) + clock.offset(r)
            starts.append(int(a.min()))
            ends.append(int((a + st["duration_ns"]).max()))
    if starts:
        w0, w1 = min(starts), max(ends)
    elif len(table):
        offs = clock.offsets()
        by_rank = np.asarray(
            [offs.get(r, 0) for r in range(int(table.rank.max()) + 1)], dtype=np.int64
        )
        aligned = table.start_ns + by_rank[table.rank]
        w0 = int(aligned.min())
        w1 = w0 + 50_000_000
    else:
        return (), 0
    items: list[TimelineItem] = []
    rows_of = RowsByKey(table.rank)
    # at most 400 collectives per rank, and about _TIMELINE_COMM_ITEMS in all (a short excerpt:
    # 4,096 ranks × 400 bars would be 1.6M items)
    per_rank = max(8, min(400, _TIMELINE_COMM_ITEMS // max(len(s.ranks), 1)))
    for r in s.ranks:
        rd = run.ranks[r]
        off = clock.offset(r)
        names = rd.span_names
        sp = rd.spans
        sa = sp["start_ns"].astype(np.int64) + off
        near = np.flatnonzero((sa + sp["duration_ns"] >= w0) & (sa <= w1))
        for row in sp[near]:
            a = int(row["start_ns"]) + off
            if a + int(row["duration_ns"]) < w0 or a > w1:
                continue
            kind = "step" if row["kind"] == 0 else "phase"
            label = (
                f"step {int(row['step'])}"
                if kind == "step"
                else (names[row["name"]] if row["name"] < len(names) else "?")
            )
            items.append(TimelineItem(r, kind, label, a - w0, int(row["duration_ns"])))
        mine = rows_of.rows(r)
        a = table.start_ns[mine] + off
        keep = mine[(a <= w1) & (a + table.duration_ns[mine] >= w0)][:per_rank]
        for k in keep:
            g = table.groups[table.gid[k]]
            items.append(
                TimelineItem(
                    r,
                    "comm",
                    f"{table.ops[table.op[k]]} {g.desc or g.name}",
                    int(table.start_ns[k]) + off - w0,
                    int(table.duration_ns[k]),
                )
            )
    return tuple(items), w1 - w0


def _findings(report_parts: dict[str, Any]) -> tuple[Finding, ...]:
    out: list[Finding] = []
    s: StragglerReport = report_parts["stragglers"]
    for x in s.stragglers:
        phase = f" in phase '{x.phase}'" if x.phase else ""
        out.append(
            Finding(
                "straggler",
                "warning",
                f"rank {x.rank} is a straggler{phase}: {x.score:+.0%} compute vs the median rank, arrived last in {x.last_share:.0%} of its collectives",
                dataclasses.asdict(x),
            )
        )
    mem: MemoryImbalance = report_parts["memory"]
    if mem.max_rank >= 0 and mem.imbalance > MEMORY_IMBALANCE_THRESHOLD:
        out.append(
            Finding(
                "memory_imbalance",
                "warning",
                f"rank {mem.max_rank} peaks at {mem.imbalance:+.0%} memory vs the median rank",
                dataclasses.asdict(mem),
            )
        )
    for r, why in report_parts["problems"]:
        out.append(
            Finding(
                "missing_rank",
                "warning",
                f"rank {r} not analyzed: {why}",
                {"rank": r, "reason": why},
            )
        )
    clock: ClockAlignment = report_parts["clock"]
    for c in clock.ranks:
        if c.method == "none":
            out.append(
                Finding(
                    "clock",
                    "warning",
                    f"rank {c.rank}: clock not aligned (no timestamp exchange, no shared collective)",
                    {"rank": c.rank},
                )
            )
    ms: MatchSummary = report_parts["match"]
    if ms.incomplete:
        out.append(
            Finding(
                "incomplete",
                "info",
                f"{ms.incomplete} of {ms.collectives} collectives were not recorded by every member",
                {"incomplete": ms.incomplete, "collectives": ms.collectives},
            )
        )
    return tuple(out)


def rank_analyses(
    run: LoadedRun, after_rank: Callable[[int], None] | None = None
) -> dict[int, Any]:
    """The step monitor's analysis of every loaded rank (:func:`meshprof.monitor.analyze_steps`);
    ``after_rank(r)`` is called once rank r is done."""
    from meshprof.monitor import Layout, analyze_steps
    from meshprof.monitor.bottlenecks import BottleneckThresholds

    out: dict[int, Any] = {}
    for r, rd in sorted(run.ranks.items()):
        meta = rd.meta
        mon = meta.get("monitor") or {}
        layout = Layout.from_any(
            mon.get("layout") or meta.get("layout") or run.manifest.get("layout")
        )
        th = mon.get("thresholds")
        thresholds = BottleneckThresholds(**th) if isinstance(th, dict) else None
        out[r] = analyze_steps(
            rd.spans,
            rd.span_names or list(mon.get("span_names", [])),
            rd.events,
            rd.groups,
            rd.memory,
            rank=r,
            layout=layout,
            schedule=str(mon.get("schedule", "") or ""),
            microbatches=int(mon.get("microbatches", 0) or 0),
            virtual_stages=int(mon.get("virtual_stages", 1) or 1),
            flops_per_step=mon.get("flops_per_step"),
            peak_tflops=mon.get("peak_tflops"),
            thresholds=thresholds,
            warmup_steps=int(mon.get("warmup_steps", 0) or 0),
        )
        if after_rank is not None:
            after_rank(r)
    return out


def run_bottlenecks(
    run: LoadedRun,
    s: StragglerReport,
    memory: MemoryImbalance,
    analyses: dict[int, Any],
    pipeline: Any = None,
) -> list[dict[str, Any]]:
    """Per-rank bottlenecks (merged across ranks: one entry per category, the worst rank's,
    with the list of ranks where it fired) and the cross-rank rules (load and memory imbalance)."""
    from meshprof.monitor import evaluate_cross_rank

    order = {"critical": 0, "high": 1, "medium": 2, "low": 3}
    merged: dict[str, dict[str, Any]] = {}
    for r, a in analyses.items():
        for b in a.bottlenecks:
            d = b.to_dict()
            d["metrics"] = dict(d.get("metrics") or {})
            cur = merged.get(b.category)
            if cur is None:
                d["metrics"]["ranks"] = [r]
                d["evidence"] = f"rank {r}: {d['evidence']}"
                merged[b.category] = d
            else:
                cur["metrics"]["ranks"].append(r)
                if order.get(b.severity, 9) < order.get(cur["severity"], 9):
                    ranks = cur["metrics"]["ranks"]
                    d["metrics"]["ranks"] = ranks
                    d["evidence"] = f"rank {r}: {d['evidence']}"
                    merged[b.category] = d
    if pipeline is not None:
        # the stages' joint timeline replaces each stage's local (lower-bound) view
        from meshprof.monitor.bottlenecks import BottleneckThresholds, rule_pipeline

        merged.pop("pipeline", None)
        b = rule_pipeline(
            pipeline.utilization,
            pipeline.bubble,
            pipeline.bubble_theory,
            pipeline.stages,
            pipeline.microbatches,
            BottleneckThresholds(),
        )
        if b is not None:
            d = b.to_dict()
            d["metrics"] = dict(d.get("metrics") or {}) | {"ranks": sorted(pipeline.per_stage)}
            merged["pipeline"] = d
    for d in merged.values():
        n = len(d["metrics"]["ranks"])
        if n > 1 and "fired on" not in d["evidence"] and d["category"] != "pipeline":
            d["evidence"] += (
                f" (fired on {n} ranks: {', '.join(map(str, sorted(d['metrics']['ranks'])))})"
            )
    scores = [sc.score for sc in s.scores if sc.score == sc.score]
    load = max(scores) if scores else None
    straggler = s.stragglers[0] if s.stragglers else None
    worst = (
        max(s.scores, key=lambda sc: sc.score if sc.score == sc.score else -1e9)
        if s.scores
        else None
    )
    cross = evaluate_cross_rank(
        load,
        straggler.rank if straggler else (worst.rank if worst else None),
        straggler.phase if straggler else None,
        memory.imbalance if memory.max_rank >= 0 else None,
        memory.max_rank if memory.max_rank >= 0 else None,
    )
    out = list(merged.values()) + [b.to_dict() for b in cross]
    out.sort(key=lambda d: order.get(d["severity"], 9))
    return out


@dataclass(frozen=True, slots=True)
class RunAnalysis:
    """The report with the intermediate results it was built from (for renderers that need
    every event, such as the merged trace, without computing them again)."""

    report: RunReport
    """What ``meshprof report`` shows."""
    table: EventTable
    """Every completed event of every loaded rank."""
    clock: ClockAlignment
    """The clock offsets used."""
    match: CollectiveMatch
    """The matched collectives."""


def analyze_run(
    run: LoadedRun,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    bottlenecks: tuple[dict[str, Any], ...] | list[dict[str, Any]] = (),
) -> RunReport:
    """Build the cross-rank report of a loaded run (pure: reads ``run``, returns data).

    Bottlenecks come from the step monitor's rules on every rank and the cross-rank rules
    (:mod:`meshprof.monitor.bottlenecks`); ``bottlenecks`` adds more, rendered as given."""
    return analyze_run_parts(run, threshold=threshold, bottlenecks=bottlenecks).report


def analyze_run_parts(
    run: LoadedRun,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    bottlenecks: tuple[dict[str, Any], ...] | list[dict[str, Any]] = (),
    release_events: bool = False,
) -> RunAnalysis:
    """:func:`analyze_run`, keeping the event table, clock alignment and match it computed.

    ``release_events``: let each rank's raw event rows go once they are in the table (the
    ranks' ``events`` become empty): lower peak memory for a caller that needs only the
    results, such as ``meshprof report``."""
    # The per-rank step analyses do not depend on the cross-rank steps: run them on a second
    # thread (numpy releases the GIL in its kernels, so this uses a second core when there is one).
    # When the raw rows are let go, a rank's go once both the table and its analysis have
    # read them, and matching waits for the analyses (the rows then never coexist with it).
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="meshprof-rank-analyses")
    done_with = _releaser(run) if release_events else None
    analyses_future = pool.submit(rank_analyses, run, done_with)
    table = build_event_table(run, after_rank=done_with)
    clock = align_clocks(run, table)
    if release_events:
        analyses_future.result()
    m = match_collectives(table, clock)
    s = find_stragglers(run, table, clock, m, threshold=threshold)
    with np.errstate(all="ignore"):
        step_mean = (
            np.nanmean(np.where(np.isnan(s.step_ns), np.nan, s.step_ns), axis=1)
            if s.steps
            else np.full(len(s.ranks), np.nan)
        )
        comm_tot = np.nansum(s.comm_ns, axis=1)
        wait_tot = np.nansum(s.wait_ns, axis=1)
        step_tot = np.nansum(s.step_ns, axis=1)
    rows = []
    peaks = {}
    by_rank = RowsByKey(table.rank)
    for i, r in enumerate(s.ranks):
        rd = run.ranks[r]
        nsteps = int(np.sum(~np.isnan(s.step_ns[i]))) if s.steps else 0
        peaks[r] = _peak(rd.memory)
        sc = s.scores[i]
        rows.append(
            RankRow(
                rank=r,
                host=str(rd.meta.get("hostname", "")),
                steps=nsteps,
                step_ns=float(step_mean[i]) if nsteps else float("nan"),
                compute_ns=float((step_tot[i] - comm_tot[i]) / nsteps) if nsteps else float("nan"),
                comm_share=float(comm_tot[i] / step_tot[i])
                if nsteps and step_tot[i] > 0
                else float("nan"),
                wait_share=float(wait_tot[i] / step_tot[i])
                if nsteps and step_tot[i] > 0
                else float("nan"),
                peak_memory_bytes=peaks[r],
                score=sc.score,
                last_share=sc.last_share,
                events=by_rank.count(r),
            )
        )
    valid = {r: p for r, p in peaks.items() if p >= 0}
    if valid:
        mr = max(valid, key=lambda r: valid[r])
        med = int(np.median(list(valid.values())))
        memory = MemoryImbalance(mr, valid[mr], med, valid[mr] / med - 1 if med > 0 else 0.0)
    else:
        memory = MemoryImbalance(-1, -1, -1, 0.0)
    dims, share = _comm_by_dim(run, table, s)
    timeline, tl_ns = _timeline(run, table, clock, s)
    problems = tuple(sorted(run.problems.items()))
    ms = summarize_match(m)
    findings = _findings(
        {"stragglers": s, "memory": memory, "problems": problems, "clock": clock, "match": ms}
    )
    analyses = analyses_future.result()
    pool.shutdown()
    pipeline = run_pipeline_bubble(run, clock)
    found = run_bottlenecks(run, s, memory, analyses, pipeline) + [_as_dict(b) for b in bottlenecks]
    kineto = run_kineto(run)
    meta = {
        k: v
        for k, v in run.manifest.items()
        if isinstance(v, str | int | float | bool | list | dict)
    }
    report = RunReport(
        path=str(run.path),
        world_size=run.world_size,
        loaded_ranks=tuple(sorted(run.ranks)),
        problems=problems,
        metadata=meta,
        groups=table.groups,
        clock=clock,
        match=ms,
        group_rows=_group_rows(table, m),
        stragglers=s,
        ranks=tuple(rows),
        memory=memory,
        dimensions=dims,
        comm_share_by_dim=share,
        by_size=_with_recorded(_by_size(table), _recorded_by_size(run)),
        timeline=timeline,
        timeline_ns=tl_ns,
        findings=findings,
        bottlenecks=tuple(found),
        rank_analyses=tuple(plain_dict(a) for _, a in sorted(analyses.items())),
        pipeline=dataclasses.asdict(pipeline) if pipeline is not None else None,
        kineto=kineto,
    )
    return RunAnalysis(report, table, clock, m)


def _releaser(run: LoadedRun) -> Callable[[int], None]:
    """A callback that empties rank r's raw event rows on its second call (table + analysis)."""
    left = dict.fromkeys(run.ranks, 2)
    lock = threading.Lock()

    def done_with(r: int) -> None:
        with lock:
            left[r] -= 1
            if left[r] == 0:
                rd = run.ranks[r]
                rd.events = rd.events[:0].copy()

    return done_with


def run_pipeline_bubble(run: LoadedRun, clock: ClockAlignment) -> Any:
    """The bubble of every pipeline group, from its stages' spans on the aligned clock."""
    from meshprof.monitor import Layout
    from meshprof.monitor.pipeline import StageTimeline, measure_pipeline_bubble

    mon: dict[str, Any] = {}
    layout = None
    for rd in run.ranks.values():
        mon = rd.meta.get("monitor") or {}
        layout = Layout.from_any(
            mon.get("layout") or rd.meta.get("layout") or run.manifest.get("layout")
        )
        if layout is not None:
            break
    if layout is None or layout.pp <= 1:
        return None
    stages = [
        StageTimeline(
            r,
            rd.spans,
            rd.span_names or list((rd.meta.get("monitor") or {}).get("span_names", [])),
            clock.offset(r),
        )
        for r, rd in sorted(run.ranks.items())
    ]
    return measure_pipeline_bubble(
        stages,
        layout,
        str(mon.get("schedule", "") or ""),
        int(mon.get("microbatches", 0) or 0),
        int(mon.get("virtual_stages", 1) or 1),
        warmup_steps=int(mon.get("warmup_steps", 0) or 0),
    )


def run_kineto(run: LoadedRun) -> tuple[dict[str, Any], ...]:
    """Computation / communication / other per rank from the torch.profiler traces in the run
    directory (written by ``@performance_monitor``); empty when there are none."""
    from meshprof.analyze.kineto import find_traces, kineto_breakdown

    try:
        paths = find_traces(run.path)
        return tuple(dataclasses.asdict(b) for b in kineto_breakdown(paths)) if paths else ()
    except Exception as e:  # a damaged trace must not cost the rest of the report
        return ({"error": f"{type(e).__name__}: {e}"},)


def _as_dict(b: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(b) and not isinstance(b, type):
        return dataclasses.asdict(b)
    if hasattr(b, "to_dict"):
        return dict(b.to_dict())
    return dict(b)

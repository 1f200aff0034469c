"""The merged timeline on the aligned clock: the report's short excerpt and the records of the
Perfetto/Chrome trace (slices, tracks and flow arrows), as plain typed values.

Every time here is aligned (``local + clock offset``, ns); :mod:`meshprof.render.perfetto` only
turns :class:`MergedTimeline` into JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from meshprof.analyze.compute.sorting import RowsByKey
from meshprof.analyze.run.events.clock import ClockAlignment
from meshprof.analyze.run.events.match import CollectiveMatch
from meshprof.analyze.run.events.table import EventTable, GroupRef
from meshprof.analyze.run.stragglers.stragglers import StragglerReport
from meshprof.analyze.run.types import TimelineItem
from meshprof.rundir import LoadedRun


def aligned_offsets(table: EventTable, clock: ClockAlignment) -> np.ndarray:
    """int64 per table row: the clock offset of the row's rank (ns)."""
    offs = clock.offsets()
    if not len(table):
        return np.zeros(0, dtype=np.int64)
    by_rank = np.asarray([offs.get(r, 0) for r in range(int(table.rank.max()) + 1)], dtype=np.int64)
    return by_rank[table.rank]


TIMELINE_COMM_ITEMS = 20_000
"""Collective bars the excerpt shows in all (about: at most 400 per rank, at least 8)."""


EXCERPT_RANKS = 16
"""Ranks the timeline excerpt shows at most."""


def excerpt_ranks(s: StragglerReport, limit: int = EXCERPT_RANKS) -> tuple[int, ...]:
    """The ranks worth a look, at most ``limit``: every rank of a small run; else the stragglers,
    then the ranks furthest from the median compute (|score|), then the lowest ranks."""
    if len(s.ranks) <= limit:
        return tuple(s.ranks)
    chosen: list[int] = [x.rank for x in s.stragglers]
    by_score = sorted(
        (x for x in s.scores if x.score == x.score), key=lambda x: (-abs(x.score), x.rank)
    )
    for x in [*by_score, *s.scores]:
        if len(chosen) >= limit:
            break
        if x.rank not in chosen:
            chosen.append(x.rank)
    return tuple(sorted(chosen[:limit]))


def timeline_excerpt(
    run: LoadedRun,
    table: EventTable,
    clock: ClockAlignment,
    s: StragglerReport,
    ranks: Sequence[int] | None = None,
) -> tuple[tuple[TimelineItem, ...], int]:
    """Two steps from the middle of the run (or the first 50 ms of events without steps), of
    ``ranks`` (default: all; the window is every rank's)."""
    shown = set(s.ranks if ranks is None else ranks)
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
        w0 = int((table.start_ns + aligned_offsets(table, clock)).min())
        w1 = w0 + 50_000_000
    else:
        return (), 0
    items: list[TimelineItem] = []
    rows_of = RowsByKey(table.rank)
    # at most 400 collectives per rank, and about TIMELINE_COMM_ITEMS in all (a short excerpt:
    # 4,096 ranks × 400 bars would be 1.6M items)
    per_rank = max(8, min(400, TIMELINE_COMM_ITEMS // max(len(shown), 1)))
    for r in s.ranks:
        if r not in shown:
            continue
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


DEFAULT_MAX_EVENTS = 250_000
"""Collective slices a merged trace keeps by default (about 2 × as many JSON events with the flow
arrows, ~80 MB of JSON: what ui.perfetto.dev and chrome://tracing open in seconds; a trace of
every event of 8 ranks × 1M collectives would be ~3 GB). A longer run keeps its last whole steps
that fit; ``None`` or 0 keeps everything."""


@dataclass(frozen=True, slots=True)
class RankSlices:
    """One rank's bars on the aligned clock, as columns (plain Python lists, one entry per bar)."""

    rank: int
    """Global rank."""
    host: str
    """Hostname ("" when unknown)."""
    span_kind: list[int]
    """0 for a step span, 1 for a phase span."""
    span_depth: list[int]
    """Nesting depth of the span."""
    span_name: list[str]
    """Phase name ("#<id>" when the name table lacks it); unused for steps."""
    span_step: list[int]
    """Step number."""
    span_start_ns: list[int]
    """Aligned start (ns)."""
    span_duration_ns: list[int]
    """Duration (ns)."""
    comm_gid: list[int]
    """Index of the collective's group in :attr:`MergedTimeline.groups`."""
    comm_op: list[str]
    """Op name."""
    comm_start_ns: list[int]
    """Aligned issue time (ns)."""
    comm_duration_ns: list[int]
    """Duration (ns)."""
    comm_seq: list[int]
    """Sequence number in its group."""
    comm_bytes: list[int]
    """Message size (nccl-tests S, bytes)."""
    comm_peer: list[int]
    """Peer rank of a send/recv (-1 for collectives)."""


@dataclass(frozen=True, slots=True)
class FlowArrows:
    """Arrows between two collective slices, as columns: from each early member of a collective
    to its last member (in collective order), then from each send to its recv."""

    name: list[str]
    """At the tail: "op group#seq" for a collective, "p2p <send's seq>" for a send/recv pair."""
    dst_name: list[str]
    """At the head: the same for a collective, "p2p <recv's seq>" for a send/recv pair."""
    src_rank: list[int]
    """Rank of the arrow's tail."""
    src_gid: list[int]
    """Group index of the tail's slice."""
    src_ns: list[int]
    """Aligned time of the tail (arrival, ns)."""
    dst_rank: list[int]
    """Rank of the arrow's head."""
    dst_gid: list[int]
    """Group index of the head's slice."""
    dst_ns: list[int]
    """Aligned time of the head (ns)."""


@dataclass(frozen=True, slots=True)
class Truncation:
    """What a capped timeline left out."""

    kept_from_ns: int
    """Aligned time from which slices and arrows are kept (ns)."""
    collectives_total: int
    """Collective slices of the run (all ranks)."""
    collectives_kept: int
    """Those kept."""
    max_events: int
    """The cap asked for."""


@dataclass(frozen=True, slots=True)
class MergedTimeline:
    """Every rank's steps, phases and collectives on the aligned clock, with the arrows between
    matched collectives: what the Perfetto/Chrome trace shows."""

    t0_ns: int
    """Aligned time of the run's first span or event (the trace's zero; 0 for an empty run)."""
    ranks: tuple[RankSlices, ...]
    """One per loaded rank, rank order."""
    groups: tuple[GroupRef, ...]
    """Process groups (indexed by the ``gid`` columns)."""
    flows: FlowArrows
    """Arrows between matched slices."""
    clock_max_uncertainty_ns: int
    """The clock alignment's largest uncertainty (ns; -1 for an unaligned rank)."""
    truncation: Truncation | None
    """Set when the cap left something out."""


def trace_cutoff(
    run: LoadedRun, table: EventTable, aligned: np.ndarray, clock: ClockAlignment, cap: int
) -> int | None:
    """Aligned time from which a capped trace keeps events (None: keep all): the start of the
    first step (earliest over ranks) at or after the start of the ``cap``-th last collective;
    when no step starts there, that collective's start itself."""
    if not cap or len(table) <= cap:
        return None
    t = int(np.partition(aligned, len(aligned) - cap)[len(aligned) - cap])
    # earliest aligned start of each step over ranks, in one pass over all ranks' step spans
    steps, starts = [], []
    for r, rd in run.ranks.items():
        st = rd.spans[rd.spans["kind"] == 0]
        steps.append(st["step"].astype(np.int64))
        starts.append(st["start_ns"].astype(np.int64) + clock.offset(r))
    if not steps:
        return t
    step, a = np.concatenate(steps), np.concatenate(starts)
    if not len(step):
        return t
    u, inv = np.unique(step, return_inverse=True)
    firsts = np.full(len(u), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(firsts, inv.reshape(-1), a)
    later = firsts[firsts >= t]
    return int(later.min()) if len(later) else t


def _rank_slices(
    run: LoadedRun,
    table: EventTable,
    clock: ClockAlignment,
    r: int,
    cut: int | None,
    keep_row: np.ndarray | None,
    rows_of: RowsByKey,
) -> RankSlices:
    rd = run.ranks[r]
    off = clock.offset(r)
    names = rd.span_names
    sp = rd.spans
    if cut is not None:
        sp = sp[sp["start_ns"].astype(np.int64) + off >= cut]
    mine = rows_of.rows(r)
    if keep_row is not None:
        mine = mine[keep_row[mine]]
    return RankSlices(
        rank=r,
        host=str(rd.meta.hostname or ""),
        span_kind=sp["kind"].tolist(),
        span_depth=sp["depth"].tolist(),
        span_name=[names[n] if n < len(names) else f"#{n}" for n in sp["name"].tolist()],
        span_step=sp["step"].tolist(),
        span_start_ns=(sp["start_ns"].astype(np.int64) + off).tolist(),
        span_duration_ns=sp["duration_ns"].tolist(),
        comm_gid=table.gid[mine].tolist(),
        comm_op=[table.ops[o] for o in table.op[mine].tolist()],
        comm_start_ns=(table.start_ns[mine] + off).tolist(),
        comm_duration_ns=table.duration_ns[mine].tolist(),
        comm_seq=table.seq[mine].tolist(),
        comm_bytes=table.size_bytes[mine].tolist(),
        comm_peer=table.peer[mine].tolist(),
    )


def flow_arrows(
    table: EventTable,
    m: CollectiveMatch,
    clock: ClockAlignment,
    keep_row: np.ndarray | None = None,
) -> FlowArrows:
    """Arrows from each early member of a collective to its last member (the last one in the
    collective's arrival-ordered block), then from each send to its recv; with ``keep_row``,
    only arrows whose both ends are kept."""
    f = FlowArrows([], [], [], [], [], [], [], [])
    n = len(m.member_coll)
    group_names = [g.name for g in table.groups]
    if n:
        # members of a collective are contiguous, in arrival order: its last member ends the block
        block_end = np.r_[np.flatnonzero(m.member_coll[1:] != m.member_coll[:-1]), n - 1]
        last_of = np.full(len(m), -1, dtype=np.int64)
        last_of[m.member_coll[block_end]] = block_end
        last_i = last_of[m.member_coll]
        early = np.flatnonzero((m.present[m.member_coll] >= 2) & (last_i != np.arange(n)))
        if keep_row is not None:
            ok = keep_row[m.member_row[early]] & keep_row[m.member_row[last_i[early]]]
            early = early[ok]
        j = last_i[early]
        c = m.member_coll[early]
        rows_i, rows_j = m.member_row[early], m.member_row[j]
        f.name.extend(
            f"{table.ops[op]} {group_names[gid]}#{seq}"
            for op, gid, seq in zip(
                m.op[c].tolist(), m.gid[c].tolist(), m.seq[c].tolist(), strict=True
            )
        )
        f.dst_name.extend(f.name)
        f.src_rank.extend(table.rank[rows_i].tolist())
        f.src_gid.extend(table.gid[rows_i].tolist())
        f.src_ns.extend(m.member_arrival_ns[early].tolist())
        f.dst_rank.extend(table.rank[rows_j].tolist())
        f.dst_gid.extend(table.gid[rows_j].tolist())
        f.dst_ns.extend(m.member_arrival_ns[j].tolist())
    for s_row, r_row in zip(m.p2p_send_row.tolist(), m.p2p_recv_row.tolist(), strict=True):
        if keep_row is not None and not (keep_row[s_row] and keep_row[r_row]):
            continue
        s_rank, r_rank = int(table.rank[s_row]), int(table.rank[r_row])
        f.name.append(f"p2p {int(table.seq[s_row])}")
        f.dst_name.append(f"p2p {int(table.seq[r_row])}")
        f.src_rank.append(s_rank)
        f.src_gid.append(int(table.gid[s_row]))
        f.src_ns.append(int(table.start_ns[s_row]) + clock.offset(s_rank))
        f.dst_rank.append(r_rank)
        f.dst_gid.append(int(table.gid[r_row]))
        f.dst_ns.append(int(table.start_ns[r_row]) + clock.offset(r_rank))
    return f


def merged_timeline(
    run: LoadedRun,
    table: EventTable,
    clock: ClockAlignment,
    match: CollectiveMatch,
    *,
    max_events: int | None = DEFAULT_MAX_EVENTS,
) -> MergedTimeline:
    """Every rank's bars and the arrows between them on the aligned clock. With more than
    ``max_events`` collectives (all ranks) only the last whole steps are kept: every slice and
    arrow from the first kept step's start on (see :data:`DEFAULT_MAX_EVENTS`)."""
    aligned = table.start_ns + aligned_offsets(table, clock)
    cap = int(max_events or 0)
    cut = trace_cutoff(run, table, aligned, clock, cap)
    starts = [int(aligned.min())] if len(table) else []
    for r, rd in run.ranks.items():
        if len(rd.spans):
            starts.append(int(rd.spans["start_ns"].min()) + clock.offset(r))
    keep_row = aligned >= cut if cut is not None else None
    truncation = (
        Truncation(cut, len(table), int(keep_row.sum()), cap)
        if cut is not None and keep_row is not None
        else None
    )
    rows_of = RowsByKey(table.rank)
    return MergedTimeline(
        t0_ns=min(starts) if starts else 0,
        ranks=tuple(
            _rank_slices(run, table, clock, r, cut, keep_row, rows_of) for r in sorted(run.ranks)
        ),
        groups=table.groups,
        flows=flow_arrows(table, match, clock, keep_row),
        clock_max_uncertainty_ns=clock.max_uncertainty_ns,
        truncation=truncation,
    )

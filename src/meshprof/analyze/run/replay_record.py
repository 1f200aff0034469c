"""What the what-if replay replays (:mod:`meshprof.analyze.run.replay`): the recorded events
as per-rank chains within steps, each member of a collective with its compute gap, overlap flag
and recorded times (aligned clock, ns). The model is described in :mod:`.replay`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from meshprof.analyze.compute.sorting import RowsByKey, stable_argsort
from meshprof.analyze.run.match import CollectiveMatch
from meshprof.analyze.run.table import EventTable
from meshprof.rundir import LoadedRun

I64_MIN = int(np.iinfo(np.int64).min)


@dataclass(frozen=True, slots=True)
class Chains:
    """The replayed events (*members*: inside a replayed step span, sorted by chain, then issue)
    and the chains (one per rank and replayed step, sorted by rank, then start)."""

    row: np.ndarray
    """int32 (int64 beyond 2³¹ rows) [member]: EventTable row."""
    chain: np.ndarray
    """int64 [member]: its chain."""
    c_rank: np.ndarray
    """int64 [chain]: rank."""
    c_step: np.ndarray
    """int64 [chain]: index into the replayed steps."""
    c_start: np.ndarray
    """int64 [chain]: step start, aligned ns."""
    c_end: np.ndarray
    """int64 [chain]: step end, aligned ns."""


def build_chains(
    run: LoadedRun, table: EventTable, off: np.ndarray, steps: Sequence[int]
) -> Chains:
    """Every (rank, replayed step) chain and the events whose issue falls in its step span
    (``off[r]``: rank r's clock offset), by one search per rank over its chains' starts."""
    step_set = np.asarray(sorted(steps), dtype=np.int64)
    parts: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []
    for r in sorted(run.ranks):
        sp = run.ranks[r].spans
        st = sp[sp["kind"] == 0]
        st = st[np.isin(st["step"].astype(np.int64), step_set)]
        if not len(st):
            continue
        _, first = np.unique(st["step"], return_index=True)  # one span per step number
        st = st[first]
        st = st[np.argsort(st["start_ns"], kind="stable")]
        a = st["start_ns"].astype(np.int64)
        parts.append((r, st["step"].astype(np.int64), a, a + st["duration_ns"].astype(np.int64)))
    empty = np.zeros(0, dtype=np.int64)
    if not parts:
        return Chains(empty, empty, empty, empty, empty, empty)
    c_rank = np.concatenate([np.full(len(p[1]), p[0], dtype=np.int64) for p in parts])
    c_step = np.searchsorted(step_set, np.concatenate([p[1] for p in parts]))
    a = np.concatenate([p[2] for p in parts])
    b = np.concatenate([p[3] for p in parts])
    # one rank at a time (the table's rows are grouped by rank): a row is in the last chain of
    # its rank starting at or before its issue, if it issued before that chain's end; members
    # by chain, then issue, then row. Temporaries are one rank's rows, not the whole table's.
    rk = table.rank
    by_rank = None if _ascending(rk) else RowsByKey(rk)
    row_t = index_dtype(len(table))
    rows_out: list[np.ndarray] = []
    chains_out: list[np.ndarray] = []
    chain_ranks = np.unique(c_rank)
    c_at = np.searchsorted(c_rank, chain_ranks)
    # each rank's rows, searched once for all ranks (one search per rank would cast the whole
    # narrow rank column each time: 5 s at 4,096 ranks)
    r_lo = np.searchsorted(rk, chain_ranks).tolist() if by_rank is None else []
    r_hi = np.searchsorted(rk, chain_ranks + 1).tolist() if by_rank is None else []
    for ci, (c0, c1) in enumerate(
        zip(c_at.tolist(), [*c_at[1:].tolist(), len(c_rank)], strict=True)
    ):
        r = int(c_rank[c0])
        if by_rank is None:
            lo, hi = r_lo[ci], r_hi[ci]
            mine: np.ndarray | None = None
            t = table.start_ns[lo:hi]
        else:
            lo, mine = 0, by_rank.rows(r)
            t = table.start_ns[mine]
        i = np.searchsorted(a[c0:c1], t, side="right") - 1
        sel = np.flatnonzero((i >= 0) & (t < b[c0:c1][np.maximum(i, 0)]))
        if not len(sel):
            continue
        ts = t[sel]
        if not _ascending(ts):
            sel = sel[stable_argsort(ts)]
        del ts
        rows_out.append((lo + sel if mine is None else mine[sel]).astype(row_t))
        chains_out.append(c0 + i[sel])
    o_c = off[c_rank]
    if not rows_out:
        return Chains(empty, empty, c_rank, c_step, a + o_c, b + o_c)
    return Chains(
        np.concatenate(rows_out), np.concatenate(chains_out), c_rank, c_step, a + o_c, b + o_c
    )


def index_dtype(n: int) -> type[np.signedinteger]:
    """int32 for indices and codes below ``n`` when they fit (half the memory), else int64."""
    return np.int32 if n < 1 << 31 else np.int64


def _ascending(v: np.ndarray) -> bool:
    """Whether ``v`` is nondecreasing."""
    return len(v) < 2 or bool((v[1:] >= v[:-1]).all())


@dataclass(frozen=True, slots=True)
class Recorded:
    """The recorded timeline of the members and chains, as the replay's inputs."""

    a0: np.ndarray
    """int64 [member]: aligned arrival (issue)."""
    coll: np.ndarray
    """int32 (int64 beyond 2³¹) [member]: collective code (matched collectives, then send/recv pairs, then alone)."""
    const: np.ndarray
    """int64 [collective]: latest arrival of its members outside the replayed steps (int64 min
    when none)."""
    waits: np.ndarray
    """bool [member]: completed at or after the recorded release."""
    after_ns: np.ndarray
    """int64 [member]: completion − release when it waits, else its duration."""
    pos: np.ndarray
    """int32 (int64 beyond 2³¹) [member]: position in its chain."""
    overlapped: np.ndarray
    """bool [member]: issued while an earlier event of its chain was in flight."""
    gap: np.ndarray
    """int64 [member]: compute gap (see the module docstring)."""
    c_first: np.ndarray
    """int64 [chain]: first member (-1 when none)."""
    c_len: np.ndarray
    """int64 [chain]: members."""
    after_all: np.ndarray
    """bool [chain]: the step ended after all its events completed."""
    tail: np.ndarray
    """int64 [chain]: time from the latest completion (else the last issue) to the step end."""


def record(table: EventTable, match: CollectiveMatch, off: np.ndarray, ch: Chains) -> Recorded:
    """The recorded gaps, releases, transfer times and tails of the chains' members."""
    rows = ch.row
    n, nch = len(rows), len(ch.c_rank)
    a0 = table.start_ns[rows] + off[table.rank[rows]]
    dur = table.duration_ns[rows]
    e0 = a0 + dur
    coll, const, release0 = _collectives(table, match, off, rows, a0)
    after_ns = release0[coll]  # (in place: a member array fewer at the peak)
    del release0
    waits = e0 >= after_ns
    np.subtract(e0, after_ns, out=after_ns)
    np.copyto(after_ns, dur, where=~waits)
    del dur
    first_idx = np.flatnonzero(np.r_[True, ch.chain[1:] != ch.chain[:-1]]) if n else ch.chain
    c_first = np.full(nch, -1, dtype=np.int64)
    c_len = np.zeros(nch, dtype=np.int64)
    c_first[ch.chain[first_idx]] = first_idx
    c_len[ch.chain[first_idx]] = np.diff(np.r_[first_idx, n])
    pos = (np.arange(n) - c_first[ch.chain]).astype(index_dtype(n))
    start_m = ch.c_start[ch.chain]
    e0 -= start_m
    emax_rel = _segmented_cummax(e0, ch.chain)
    del e0
    before = np.empty(n, dtype=np.int64)  # latest completion before each member, else start
    if n:
        before[0] = 0
        before[1:] = emax_rel[:-1]
    first = pos == 0
    before[first] = 0
    before += start_m
    del start_m
    overlapped = before > a0
    overlapped[first] = False
    del first
    if n:  # the previous issue where overlapped
        before[1:][overlapped[1:]] = a0[:-1][overlapped[1:]]
    gap = np.subtract(a0, before, out=before)
    has = c_len > 0
    last = np.maximum(c_first + c_len - 1, 0)
    c_emax = np.where(has, emax_rel[last] + ch.c_start, ch.c_start) if n else ch.c_start
    c_alast = np.where(has, a0[last], ch.c_start) if n else ch.c_start
    after_all = ch.c_end >= c_emax
    tail = ch.c_end - np.where(after_all, c_emax, c_alast)
    return Recorded(
        a0, coll, const, waits, after_ns, pos, overlapped, gap, c_first, c_len, after_all, tail
    )


def _collectives(
    table: EventTable, match: CollectiveMatch, off: np.ndarray, rows: np.ndarray, a0: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each member's collective code, and per collective the latest arrival of its members that
    are not replayed (int64 min when none) and its recorded release (the latest arrival of all
    its members)."""
    nc, npairs = len(match), len(match.p2p_send_row)
    coll_of_row = np.full(len(table), -1, dtype=index_dtype(nc + npairs + len(rows)))
    coll_of_row[match.member_row] = match.member_coll
    coll_of_row[match.p2p_send_row] = nc + np.arange(npairs)
    coll_of_row[match.p2p_recv_row] = nc + np.arange(npairs)
    coll = coll_of_row[rows]
    alone = np.flatnonzero(coll < 0)
    coll[alone] = nc + npairs + np.arange(len(alone))
    total = nc + npairs + len(alone)

    def aligned(rr: np.ndarray) -> np.ndarray:
        return table.start_ns[rr] + off[table.rank[rr]]

    release0 = np.empty(total, dtype=np.int64)
    release0[:nc] = match.last_arrival_ns
    release0[nc : nc + npairs] = np.maximum(
        aligned(match.p2p_send_row), aligned(match.p2p_recv_row)
    )
    release0[nc + npairs :] = a0[alone]
    # members outside the replayed steps keep their recorded arrival (rare: collectives that
    # straddle a step boundary, or a step some rank did not record)
    const = np.full(total, I64_MIN, dtype=np.int64)
    size = np.r_[match.present, np.full(npairs, 2)].astype(np.int64)
    seen = np.bincount(coll, minlength=total)[: nc + npairs]
    short = np.flatnonzero((seen > 0) & (seen < size))
    if len(short):
        kept = np.zeros(len(table), dtype=bool)
        kept[rows] = True
        mc, pc = short[short < nc], short[short >= nc] - nc
        mstart = np.r_[0, np.cumsum(match.present)]
        lens = match.present[mc].astype(np.int64)
        within = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
        cand = np.r_[
            match.member_row[np.repeat(mstart[mc], lens) + within].astype(np.int64),
            match.p2p_send_row[pc],
            match.p2p_recv_row[pc],
        ]
        cand = cand[~kept[cand]]
        np.maximum.at(const, coll_of_row[cand], aligned(cand))
    return coll, const, release0


def _segmented_cummax(v: np.ndarray, seg: np.ndarray) -> np.ndarray:
    """Running maximum of ``v`` (≥ 0) restarting at each new value of ``seg`` (nondecreasing)."""
    if not len(v):
        return v.copy()
    m = int(v.max()) + 1
    if (int(seg.max()) + 1) * m < 1 << 62:
        key = seg * m + v
        np.maximum.accumulate(key, out=key)
        key -= seg * m
        return key
    out = v.copy()
    starts = np.flatnonzero(np.r_[True, seg[1:] != seg[:-1]])
    for lo, hi in zip(starts.tolist(), [*starts[1:].tolist(), len(v)], strict=True):
        out[lo:hi] = np.maximum.accumulate(v[lo:hi])
    return out

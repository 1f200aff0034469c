"""A small discrete-event replay of the matched collectives: the step ends the run would have had
with some compute gaps changed (the engine of :mod:`meshprof.analyze.what_if`).

The model (aligned clock, ns). The events of one rank inside one step span form a *chain*, in
issue order. Each event belongs to a *collective*: a matched (group, seq) collective, a matched
send/recv pair, or itself alone (an unmatched event).

- An event's *compute gap* is its arrival (issue) minus what it waited for on its own rank: the
  step's start for the chain's first event; the latest completion of the chain's earlier events
  when they had all completed at its issue (a synchronous program); otherwise the previous
  event's issue (it was issued while an earlier one was in flight: it is *overlapped*).
- A collective is *released* when its last member arrives (it cannot complete before); members
  outside the replayed steps keep their recorded arrival.
- A member that completed at or after the recorded release completes at the release + its
  recorded completion − the recorded release (the transfer after the last arrival); one that
  completed before it (a buffered send, a broadcast root) at its arrival + its own duration.
- The rank's step ends at its latest completion (its last issue, if the step ended before that
  completed) + the recorded time after it: the chain's *tail*, compute after the last collective.

Replaying the recorded gaps reproduces the recorded times exactly (integer arithmetic).

Cost: each collective gets a *level* (1 + the largest level of its members' previous events'
collectives, 0 for a chain's first): the members' largest position when that solves it, else
level by level in Kahn's order (one Python iteration per level; sweeps over chain positions
needed one per hop between positions and took 26 s to find a cycle at 1M events); the replay
then visits the levels in order, all steps and all scenarios at once (numpy arrays [scenario, member]), keeping per
chain only its last issue and latest completion: work linear in events × scenarios, one Python
iteration per level.

Async ops issued in crossed order on two ranks (1F1B stage pairs: send A then receive B on one,
send B then receive A on the other, neither waiting) make that collective graph cyclic, though
the program is not: an overlapped event waits for its predecessor's *issue*, not its collective.
:mod:`meshprof.analyze.replay_overlap` then levels arrivals and releases separately, and its
two-phase numpy loop takes each level's arrivals in issue order before its releases.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from meshprof.analyze import replay_c
from meshprof.analyze.match import CollectiveMatch
from meshprof.analyze.sorting import RowsByKey, stable_argsort
from meshprof.analyze.table import EventTable
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


def levels(rec: Recorded) -> tuple[np.ndarray, np.ndarray] | None:
    """The members in replay order (by level, then collective) and the level boundaries in
    it; None on a dependency cycle (collectives matched in inconsistent orders).

    A collective's level is the longest path to it in the graph whose edges go from each
    member's previous event's collective to its own: its members' largest chain position when
    that solves the level equations (one vectorized check), else taken level by level from the
    collectives all of whose predecessors are done (Kahn's order: one Python iteration per
    level, each on that level's edges only, whatever the chains' positions)."""
    coll, pos = rec.coll, rec.pos
    ncoll = len(rec.const)
    m = np.flatnonzero(pos > 0)
    src, dst = coll[m - 1], coll[m]
    del m
    # a collective's level is at least its members' largest position; when that already
    # solves the level equations (every collective's members at the same position, as in most
    # runs) it is the solution (unique on an acyclic graph; none exists on a cycle)
    lvl = np.zeros(ncoll, dtype=np.int64)
    np.maximum.at(lvl, coll, pos)
    want = np.zeros(ncoll, dtype=np.int64)
    np.maximum.at(want, dst, lvl[src] + 1)
    if not np.array_equal(want, lvl):
        del want
        got = _kahn_levels(src, dst, ncoll)
        if got is None:
            return None
        lvl = got
    else:
        del want
    del src, dst
    key = lvl[coll]  # by level, then collective
    key *= ncoll
    key += coll
    order = stable_argsort(key)
    del key
    order = order.astype(index_dtype(len(coll)), copy=False)
    ml = lvl[coll[order]]
    return order, np.searchsorted(ml, np.arange(int(ml.max(initial=0)) + 2))


def _kahn_levels(src: np.ndarray, dst: np.ndarray, ncoll: int) -> np.ndarray | None:
    """Longest-path level of each of ``ncoll`` nodes over the edges src → dst, level by level
    from the nodes with no unplaced predecessor (Kahn's order); None on a cycle."""
    o = stable_argsort(src)
    out_dst = dst[o]  # edges by source (CSR)
    out_at = np.searchsorted(src[o], np.arange(ncoll + 1))
    del o
    indeg = np.bincount(dst, minlength=ncoll)
    lvl = np.zeros(ncoll, dtype=np.int64)
    frontier = np.flatnonzero(indeg == 0)
    placed, level = 0, 0
    while len(frontier):
        lvl[frontier] = level
        placed += len(frontier)
        lo = out_at[frontier]
        cnt = out_at[frontier + 1] - lo
        total = int(cnt.sum())
        if not total:
            break
        # the frontier's out-edges: ranges [lo, lo + cnt) concatenated
        idx = np.repeat(lo - (np.cumsum(cnt) - cnt), cnt) + np.arange(total)
        hit, times = np.unique(out_dst[idx], return_counts=True)
        indeg[hit] -= times
        frontier = hit[indeg[hit] == 0]
        level += 1
    return lvl if placed == ncoll else None


def in_order(members: dict[str, np.ndarray], order: np.ndarray) -> dict[str, np.ndarray]:
    """Each member array permuted by ``order`` (the replay order of :func:`levels`); the
    arrays are taken out of ``members`` one at a time, so each original can go as soon as its
    copy exists (when the caller holds no other reference to it)."""
    out: dict[str, np.ndarray] = {}
    for name in list(members):
        out[name] = members.pop(name)[order]
    return out


def replay(
    m: dict[str, np.ndarray],
    bounds: np.ndarray,
    k: int,
    gap_rows: Sequence[np.ndarray],
    c_start: np.ndarray,
    const: np.ndarray,
    tail: np.ndarray,
    after_all: np.ndarray,
    tail_row: np.ndarray,
    new_tail: np.ndarray,
    compiled: bool = True,
    arrival: np.ndarray | None = None,
) -> np.ndarray:
    """Each chain's step end in each of ``k`` scenarios (int64 [scenario, chain]); scenario 0
    replays the recorded gaps.

    ``m``: the members in replay order (:func:`in_order` of :func:`levels`' order, whose level
    boundaries are ``bounds``) as the :class:`Recorded` arrays ``gap``, ``coll``,
    ``overlapped``, ``waits``, ``after_ns``, the :class:`Chains` array ``chain`` and
    ``new_gap``; ``gap_rows``: arrays over the same members, each giving the scenario (1..k-1;
    0: none; the arrays are reused: their 0s become k) in which the member's gap becomes
    ``new_gap``; ``tail_row`` over chains likewise
    for ``new_tail``. ``c_start``, ``const``, ``tail``, ``after_all``: the chains' starts and
    the :class:`Recorded` fields of those names. ``compiled``: run the level loop in C
    (:mod:`meshprof.analyze.replay_c`) when it can be built here, else in numpy (same results).
    ``arrival``: each member's arrival level, in replay order, when the levels came from
    :func:`~meshprof.analyze.replay_overlap.overlap_levels` (then its two-phase numpy loop
    runs: the C loop takes each arrival with its collective)."""
    # per member, in replay order: its scenario in each of gap_rows, with k for none (a spare
    # row of the gap matrix absorbs those writes: one fancy assignment per array and level)
    rows = []
    for r in gap_rows:
        r[r == 0] = k
        rows.append(r)
    chain = m["chain"].astype(index_dtype(len(c_start)), copy=False)
    # scenario k is a spare row absorbing the members in no scenario of a row array
    a_last = np.repeat(c_start[None, :].astype(np.int64, copy=False), k + 1, axis=0)
    e_max = a_last.copy()
    fn = replay_c.load() if compiled and arrival is None else None
    if arrival is not None:
        from meshprof.analyze.replay_overlap import levels_numpy_overlap

        levels_numpy_overlap(m, bounds, chain, const, rows, e_max, a_last, arrival)
    elif fn is not None:
        replay_c.run_levels(
            fn, bounds, chain, m["coll"], m["gap"], m["new_gap"], m["overlapped"], m["waits"],
            m["after_ns"], const, rows, e_max, a_last,
        )  # fmt: skip
    else:
        _levels_numpy(m, bounds, chain, const, rows, e_max, a_last)
    e_max, a_last = e_max[:k], a_last[:k]
    tails = np.repeat(tail[None, :], k, axis=0)
    hit = np.flatnonzero(tail_row)
    tails[tail_row[hit], hit] = new_tail[hit]
    return np.where(after_all[None, :], e_max, a_last) + tails


def _levels_numpy(
    m: dict[str, np.ndarray],
    bounds: np.ndarray,
    chain: np.ndarray,
    const: np.ndarray,
    rows: list[np.ndarray],
    e_max: np.ndarray,
    a_last: np.ndarray,
) -> None:
    """:func:`replay`'s level loop in numpy (one Python iteration per level): advances
    ``e_max`` / ``a_last`` [k + 1, chain] in place."""
    nb = len(bounds) - 1
    c = m["coll"]
    g, g_new = m["gap"], m["new_gap"]
    ovl, waits, after = m["overlapped"], m["waits"], m["after_ns"]
    # the collectives' segments (each level's members are sorted by collective), found once
    seg = np.ones(len(c), dtype=bool)
    np.not_equal(c[1:], c[:-1], out=seg[1:])
    seg[bounds[:-1][bounds[:-1] < len(c)]] = True
    starts = np.flatnonzero(seg)
    seg_const = const[c[starts]]
    seg_of = np.cumsum(seg, dtype=index_dtype(len(seg)))
    seg_of -= 1
    del seg
    sb = np.searchsorted(starts, bounds)
    # offsets within each level, precomputed (fewer calls per level: the loop is the cost)
    lvl_of_start = np.searchsorted(bounds, starts, side="right") - 1
    starts -= bounds[lvl_of_start]
    seg_of -= np.repeat(sb[:-1].astype(seg_of.dtype), np.diff(bounds))
    del lvl_of_start
    sb_l = sb.tolist()
    cut = bounds.tolist()
    idx = cut[:-1]
    any_ovl = np.logical_or.reduceat(ovl, idx).tolist() if len(ovl) else []
    all_wait = np.logical_and.reduceat(waits, idx).tolist() if len(waits) else []
    delta = g_new - g  # (a scenario's gap: the recorded one + this)
    del g_new
    cols = np.arange(max(np.diff(bounds).max(initial=0), 0))
    for lvl in range(nb):
        lo, hi = cut[lvl], cut[lvl + 1]
        if hi == lo:
            continue
        chn = chain[lo:hi]
        arr = e_max[:, chn]
        if any_ovl[lvl]:
            arr = np.where(ovl[lo:hi], a_last[:, chn], arr)
        arr += g[lo:hi]
        d, cc = delta[lo:hi], cols[: hi - lo]
        for r in rows:
            arr[r[lo:hi], cc] += d
        s0, s1 = sb_l[lvl], sb_l[lvl + 1]
        rel = np.maximum.reduceat(arr, starts[s0:s1], axis=1)
        np.maximum(rel, seg_const[s0:s1], out=rel)
        done = rel[:, seg_of[lo:hi]]
        af = after[lo:hi]
        done += af
        if not all_wait[lvl]:  # (after_ns is the duration of a member that does not wait)
            done = np.where(waits[lo:hi], done, arr + af)
        a_last[:, chn] = arr
        np.maximum(done, e_max[:, chn], out=done)
        e_max[:, chn] = done

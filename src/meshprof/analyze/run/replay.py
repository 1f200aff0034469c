"""A small discrete-event replay of the matched collectives: the step ends the run would have had
with some compute gaps changed (the engine of :mod:`meshprof.analyze.run.what_if`).

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
:mod:`meshprof.analyze.run.replay_overlap` then levels arrivals and releases separately, and its
two-phase numpy loop takes each level's arrivals in issue order before its releases.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from meshprof.analyze.compute.sorting import stable_argsort
from meshprof.analyze.run import replay_native
from meshprof.analyze.run.replay_record import (
    Recorded,
    index_dtype,
)


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
    (:mod:`meshprof.analyze.run.replay_native`) when it can be built here, else in numpy (same results).
    ``arrival``: each member's arrival level, in replay order, when the levels came from
    :func:`~meshprof.analyze.run.replay_overlap.overlap_levels` (then its two-phase numpy loop
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
    fn = replay_native.load() if compiled and arrival is None else None
    if arrival is not None:
        from meshprof.analyze.run.replay_overlap import levels_numpy_overlap

        levels_numpy_overlap(m, bounds, chain, const, rows, e_max, a_last, arrival)
    elif fn is not None:
        replay_native.run_levels(
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

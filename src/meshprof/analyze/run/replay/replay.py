"""A small discrete-event replay of the matched collectives: the step ends the run would have had
with some compute gaps changed (the engine of :mod:`meshprof.analyze.run.what_if.what_if`).

The model (aligned clock, ns). The events of one rank inside one step span form a *chain*, in
issue order. Each event belongs to a *collective*: a matched (group, seq) collective, a matched
send/recv pair, or itself alone (an unmatched event).

- An earlier event's completion is *waited for* from the first later event of its chain issued
  at or after it (its *join*: the next event, for a blocking op; an async op still in flight
  when later events were issued joins where it had completed; one that completed after the
  chain's last issue joins none). Where every chain of the program that tells waited for an op
  before the next issue, every chain does: a completion recorded after that issue was seen
  late by the recorder (its next gap is then negative).
- An event's *compute gap* is its arrival (issue) minus what it waited for on its own rank: the
  latest of the previous event's issue and the completions joined so far (the step's start for
  the chain's first event). An event issued while the previous one was in flight is
  *overlapped*.
- A collective is *released* when its last member arrives (it cannot complete before); members
  outside the replayed steps keep their recorded arrival. A send of an *eager* direction (a
  (sender, receiver) pair of which some send completed before its receive was issued) takes
  part with its completion, not its arrival: the receiver cannot have the data before.
- A member that completed at or after the recorded release completes at the release + its
  recorded completion − the recorded release (the transfer after the last arrival); one that
  completed before it (an eager send, a broadcast root) at its arrival + its own duration.
- The rank's step ends at its latest completion (its last issue, if the step ended before that
  completed) + the recorded time after it: the chain's *tail*, compute after the last collective.

Replaying the recorded gaps reproduces the recorded times exactly (integer arithmetic).

Cost: each collective gets a *level* (1 + the largest level of its members' previous events'
collectives, 0 for a chain's first): the members' largest position when that solves it, else
level by level in Kahn's order (one Python iteration per level; sweeps over chain positions
needed one per hop between positions and took 26 s to find a cycle at 1M events); the replay
then visits the levels in order, all steps and all scenarios at once (numpy arrays [scenario, member]), keeping per
chain its last issue, its latest completion and its latest joined completion (and, for the
async ops that join later than their next event, their completion until then): work linear in
events × scenarios, one Python iteration per level.

Ops issued in crossed order on two ranks (1F1B stage pairs: send A then receive B on one,
send B then receive A on the other, neither waiting for its send) make that collective graph
cyclic, though the program is not: an event waits for its predecessor's *issue*, and for the
completions it joins, not for its predecessor's collective.
:mod:`meshprof.analyze.run.replay.replay_overlap` then levels arrivals and releases separately, and its
two-phase numpy loop takes each level's arrivals in issue order before its releases.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from meshprof.analyze.compute.kahn import kahn_waves
from meshprof.analyze.compute.sorting import stable_argsort
from meshprof.analyze.run.replay import replay_native
from meshprof.analyze.run.replay.replay_chains import index_dtype
from meshprof.analyze.run.replay.replay_record import Recorded, fold_joins


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
    placed = 0
    for level, (frontier, _, _, _) in enumerate(kahn_waves(out_dst, out_at, indeg)):
        lvl[frontier] = level
        placed += len(frontier)
    return lvl if placed == ncoll else None


def in_order(members: dict[str, np.ndarray], order: np.ndarray) -> dict[str, np.ndarray]:
    """Each member array permuted by ``order`` (the replay order of :func:`levels`); the
    arrays are taken out of ``members`` one at a time, so each original can go as soon as its
    copy exists (when the caller holds no other reference to it)."""
    out: dict[str, np.ndarray] = {}
    for name in list(members):
        out[name] = members.pop(name)[order]
    return out


def join_plan(join: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The joins (:attr:`~meshprof.analyze.run.replay.replay_record.Recorded.join`, members in chain
    order) for the replay, whose members are in ``order``: per member in replay order, -1 when
    its completion joins at the next member, -2 when it joins none, else its *held slot*; and
    the held members' joins as (replay position of the joining member, slot), by position."""
    n = len(join)
    it = index_dtype(max(n, 1))
    jo = join[order].astype(np.int64)
    nxt = jo == order.astype(np.int64) + 1
    kind = np.where(jo < 0, -2, -1).astype(it)
    held = np.flatnonzero((jo >= 0) & ~nxt)
    kind[held] = np.arange(len(held), dtype=it)
    inv = np.empty(n, dtype=np.int64)
    inv[order] = np.arange(n)
    j_pos = inv[jo[held]]
    o = stable_argsort(j_pos)
    return kind, j_pos[o], np.arange(len(held), dtype=np.int64)[o]


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
    joins: tuple[np.ndarray, np.ndarray],
    compiled: bool = True,
    arrival: np.ndarray | None = None,
) -> np.ndarray:
    """Each chain's step end in each of ``k`` scenarios (int64 [scenario, chain]); scenario 0
    replays the recorded gaps.

    ``m``: the members in replay order (:func:`in_order` of :func:`levels`' order, whose level
    boundaries are ``bounds``) as the :class:`Recorded` arrays ``gap``, ``coll``, ``waits``,
    ``after_ns``, the :class:`Chains` array ``chain``, ``new_gap`` and ``join`` (the first
    array of :func:`join_plan`; ``joins``: its other two); ``gap_rows``: arrays over the same
    members, each giving the scenario (1..k-1;
    0: none; the arrays are reused: their 0s become k) in which the member's gap becomes
    ``new_gap``; ``tail_row`` over chains likewise
    for ``new_tail``. ``c_start``, ``const``, ``tail``, ``after_all``: the chains' starts (or
    int64 [scenario, chain]: the first scenarios' own starts, the others as scenario 0's) and
    the :class:`Recorded` fields of those names. ``compiled``: run the level loop in C
    (:mod:`meshprof.analyze.run.replay.replay_native`) when it can be built here, else in numpy (same results).
    ``arrival``: each member's arrival level, in replay order, when the levels came from
    :func:`~meshprof.analyze.run.replay.replay_overlap.overlap_levels` (then its two-phase numpy loop
    runs: the C loop takes each arrival with its collective)."""
    # per member, in replay order: its scenario in each of gap_rows, with k for none (a spare
    # row of the gap matrix absorbs those writes: one fancy assignment per array and level)
    rows = []
    for r in gap_rows:
        r[r == 0] = k
        rows.append(r)
    chain = m["chain"].astype(index_dtype(len(c_start)), copy=False)
    # scenario k is a spare row absorbing the members in no scenario of a row array
    if c_start.ndim == 1:
        a_last = np.repeat(c_start[None, :].astype(np.int64, copy=False), k + 1, axis=0)
    else:  # per scenario: the first rows given, the others (and the spare row) as row 0
        a_last = np.repeat(c_start[:1].astype(np.int64, copy=False), k + 1, axis=0)
        a_last[: len(c_start)] = c_start
    e_max = a_last.copy()
    e_join = a_last.copy()
    j_pos, j_slot = joins
    held = np.zeros((k + 1, len(j_pos)), dtype=np.int64)
    state = (e_max, a_last, e_join, held, j_pos, j_slot)
    fn = replay_native.load() if compiled and arrival is None else None
    if arrival is not None:
        from meshprof.analyze.run.replay.replay_overlap import levels_numpy_overlap

        levels_numpy_overlap(m, bounds, chain, const, rows, state, arrival)
    elif fn is not None:
        replay_native.run_levels(
            fn, bounds, chain, m["coll"], m["gap"], m["new_gap"], m["join"], m["waits"],
            m["after_ns"], const, rows, state,
        )  # fmt: skip
    else:
        _levels_numpy(m, bounds, chain, const, rows, state)
    e_max, a_last = e_max[:k], a_last[:k]
    tails = np.repeat(tail[None, :], k, axis=0)
    hit = np.flatnonzero(tail_row)
    tails[tail_row[hit], hit] = new_tail[hit]
    return np.where(after_all[None, :], e_max, a_last) + tails


State = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""The replay's state, advanced in place by the level loops: ``e_max`` (each chain's latest
completion), ``a_last`` (its last issue), ``e_join`` (its latest joined completion), all int64
[k + 1, chain]; ``held`` (int64 [k + 1, slot]: the completion of each member joining later than
its next one) and the joins ``j_pos``, ``j_slot`` of :func:`join_plan`."""


def _levels_numpy(
    m: dict[str, np.ndarray],
    bounds: np.ndarray,
    chain: np.ndarray,
    const: np.ndarray,
    rows: list[np.ndarray],
    state: State,
) -> None:
    """:func:`replay`'s level loop in numpy (one Python iteration per level): advances the
    state in place."""
    e_max, a_last, e_join, held, j_pos, j_slot = state
    nb = len(bounds) - 1
    c = m["coll"]
    g, g_new = m["gap"], m["new_gap"]
    waits, after, join = m["waits"], m["after_ns"], m["join"]
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
    all_wait = np.logical_and.reduceat(waits, idx).tolist() if len(waits) else []
    all_next = np.logical_and.reduceat(join == -1, idx).tolist() if len(join) else []
    jcut = np.searchsorted(j_pos, bounds).tolist()
    delta = g_new - g  # (a scenario's gap: the recorded one + this)
    del g_new
    cols = np.arange(max(np.diff(bounds).max(initial=0), 0))
    for lvl in range(nb):
        lo, hi = cut[lvl], cut[lvl + 1]
        if hi == lo:
            continue
        chn = chain[lo:hi]
        if jcut[lvl] < jcut[lvl + 1]:
            jl = slice(jcut[lvl], jcut[lvl + 1])
            fold_joins(e_join, held, chain[j_pos[jl]], j_slot[jl])
        arr = np.maximum(a_last[:, chn], e_join[:, chn])
        arr += g[lo:hi]
        d, cc = delta[lo:hi], cols[: hi - lo]
        for r in rows:
            arr[r[lo:hi], cc] += d
        af = after[lo:hi]
        s0, s1 = sb_l[lvl], sb_l[lvl + 1]
        if all_wait[lvl]:
            rel = np.maximum.reduceat(arr, starts[s0:s1], axis=1)
        else:  # (a member that does not wait takes part with its completion)
            w = waits[lo:hi]
            rel = np.maximum.reduceat(np.where(w, arr, arr + af), starts[s0:s1], axis=1)
        np.maximum(rel, seg_const[s0:s1], out=rel)
        done = rel[:, seg_of[lo:hi]]
        done += af
        if not all_wait[lvl]:  # (after_ns is the duration of a member that does not wait)
            done = np.where(w, done, arr + af)
        a_last[:, chn] = arr
        if all_next[lvl]:
            e_join[:, chn] = np.maximum(done, e_join[:, chn])
        else:
            jn = join[lo:hi]
            nx = np.flatnonzero(jn == -1)
            e_join[:, chn[nx]] = np.maximum(done[:, nx], e_join[:, chn[nx]])
            hd = np.flatnonzero(jn >= 0)
            held[:, jn[hd]] = done[:, hd]
        np.maximum(done, e_max[:, chn], out=done)
        e_max[:, chn] = done

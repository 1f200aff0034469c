"""What the what-if replay replays (:mod:`meshprof.analyze.run.replay.replay`): the chains'
(:mod:`.replay_chains`) members, each with its compute gap, overlap flag and recorded times
(aligned clock, ns), completions the record contradicts repaired first
(:mod:`.replay_repair`). The model is described in :mod:`.replay`."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from meshprof.analyze.compute.grouped import group_spread, robust_group_spread
from meshprof.analyze.compute.sorting import RowsByKey, unique_inverse
from meshprof.analyze.run.events.clock import SYNC_OPS
from meshprof.analyze.run.events.match import CollectiveMatch
from meshprof.analyze.run.events.table import EventTable
from meshprof.analyze.run.replay.replay_chains import Chains, index_dtype
from meshprof.analyze.run.replay.replay_repair import (
    ChainMembers,
    RecordCheck,
    blocking_members,
    cap_blocking,
    next_issue,
    often_after_next,
    retime,
    retime_leads,
    tied_to_next,
    transfer_key,
    waited_seen_late,
)

I64_MIN = int(np.iinfo(np.int64).min)
SEEN_LATE_OFFSETS = 8
"""Issues after an op tested as the place it was waited for though seen complete later."""
MUST_WAIT = SYNC_OPS | {"recv", "recv_object_list", "send", "send_object_list"}
"""Ops none of whose members can complete before the last one arrives (a receive: before its
send; a send of a rendezvous direction: before its receive — an eager one never waits, see
:func:`record`)."""


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
    """bool [member]: completed at or after the recorded release, or a member of an op in
    :data:`MUST_WAIT` (never a send of an eager pair direction: see :func:`record`)."""
    after_ns: np.ndarray
    """int64 [member]: completion − release when it waits (slightly negative where the clocks'
    alignment errs), else its duration."""
    pos: np.ndarray
    """int32 (int64 beyond 2³¹) [member]: position in its chain."""
    join: np.ndarray
    """int32 (int64 beyond 2³¹) [member]: the member of its chain from which on its completion is
    waited for: the first later one issued at or after it completed (the next member for a
    blocking op); -1 when none was."""
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
    check: RecordCheck = field(default_factory=RecordCheck)
    """What the record contradicted and how it was repaired (:mod:`.replay_repair`)."""

    @property
    def overlapped(self) -> np.ndarray:
        """bool [member]: issued while its chain's previous member was in flight."""
        n = len(self.join)
        out = np.zeros(n, dtype=bool)
        if n:
            out[1:] = (self.pos[1:] > 0) & (self.join[:-1] != np.arange(1, n))
        return out


def record(
    table: EventTable,
    match: CollectiveMatch,
    off: np.ndarray,
    ch: Chains,
    sig: np.ndarray | None = None,
    reading: str = "waited",
) -> Recorded:
    """The recorded gaps, releases, transfer times and tails of the chains' members.

    ``reading`` (a record without flags): "waited" takes the collectives often seen to
    complete after their rank's next issue as blocking ops the recorder saw late (waited for
    at that issue, the completion capped there), "recorded" as in flight across it (see
    :class:`~meshprof.analyze.run.replay.replay_repair.RecordCheck`; the what-if compares the two:
    :mod:`~meshprof.analyze.run.what_if.what_if_checks`).

    A member's *release* contribution is its arrival, except for the sends of an *eager*
    direction (a (sender, receiver) pair of which some send completed before its receive was
    issued: the send does not wait for its receiver), which never wait and contribute their
    completion (the receiver cannot have the data before)."""
    rows = ch.row
    n, nch = len(rows), len(ch.c_rank)
    a0 = table.start_ns[rows] + off[table.rank[rows]]
    e0 = a0 + table.duration_ns[rows].astype(np.int64)
    first_idx = np.flatnonzero(np.r_[True, ch.chain[1:] != ch.chain[:-1]]) if n else ch.chain
    c_first = np.full(nch, -1, dtype=np.int64)
    c_len = np.zeros(nch, dtype=np.int64)
    c_first[ch.chain[first_idx]] = first_idx
    c_len[ch.chain[first_idx]] = np.diff(np.r_[first_idx, n])
    pos = (np.arange(n) - c_first[ch.chain]).astype(index_dtype(n))
    # completions the record contradicts, repaired first (see replay_repair): a blocking
    # collective seen to complete after its rank's next issue is capped there, ...
    nxt = next_issue(a0, ch.chain, ch.c_end)
    blocking = blocking_members(table.is_async, table.peer, rows)
    capped = cap_blocking(e0, nxt, blocking)
    coll, const, first_pair, n_pairs = _collectives(table, match, off, rows)
    lead = _eager_sends(table, match, off, rows, coll, first_pair, n_pairs)
    # (a send and its receive: one key per direction, whose semantics may differ)
    peer = table.peer[rows].astype(np.int64)
    me = table.rank[rows].astype(np.int64)
    is_send = np.isin(table.op[rows], [i for i, o in enumerate(table.ops) if o.startswith("send")])
    width = np.int64(max(int(me.max(initial=0)), int(peer.max(initial=0))) + 1)
    direction = np.where(is_send, me * width + peer, peer * width + me)
    op_key = np.where(peer >= 0, len(table.ops) + direction, table.op[rows].astype(np.int64))
    del peer, me, is_send, direction
    key = transfer_key(table.gid[rows], op_key, table.size_bytes[rows])
    del op_key
    lead_late = retime_leads(e0, a0, lead, key, nxt)
    release0 = const.copy()
    np.maximum.at(release0, coll, np.where(lead, e0, a0))
    after_ns = release0[coll]  # (in place: a member array fewer at the peak)
    del release0
    # a member of a synchronizing collective, a receive or a rendezvous send cannot complete
    # before the release: it waits whatever the clocks say (a completion seen a little before
    # the release is the clock alignment's error, or the receive's issue recorded late — a
    # batch of p2p ops is issued as one —, which would otherwise freeze its whole wait into
    # its duration)
    matched = coll < first_pair + n_pairs  # (not alone)
    must = np.isin(table.op[rows], [i for i, o in enumerate(table.ops) if o in MUST_WAIT])
    must &= matched
    waits = ((e0 >= after_ns) | must) & ~lead
    del lead, must
    known, undecided = blocking is not None, 0
    if not known and sig is not None:  # (no flags: the record may still tell)
        coll_m = table.peer[rows] < 0
        at = ChainMembers(waits & matched, coll_m, ch.chain, pos, sig)
        blocking = tied_to_next(e0, after_ns, at)
        open_ = often_after_next(e0, nxt, at)
        open_ &= ~blocking
        undecided = int(open_.sum())
        if reading == "waited":
            blocking |= open_
        del coll_m, open_
        capped = cap_blocking(e0, nxt, blocking)
    # ... and a member seen far after its collective's transfer is retimed
    expected = np.empty_like(e0)
    check = retime(e0, after_ns, np.where(matched, coll, -1), waits, key, nxt, capped, blocking,
                   known, undecided, reading, expected, lead_late)  # fmt: skip
    del key, nxt, capped, matched
    np.subtract(e0, after_ns, out=after_ns)
    np.copyto(after_ns, e0 - a0, where=~waits)
    flags = None if table.is_async is None else table.is_async[rows]
    join, joined = _joins(
        a0, e0, ch, c_first, c_len, sig, flags, table.peer[rows] < 0, blocking, expected
    )
    del blocking, expected
    start_m = ch.c_start[ch.chain]
    # what each member waited for: its previous member's issue and the completions of the
    # earlier members that had completed when it was issued (the step's start for the first)
    before = np.empty(n, dtype=np.int64)
    if n:
        before[0] = 0
        before[1:] = a0[:-1]
    np.maximum(before, joined, out=before)
    del joined
    first = pos == 0
    before[first] = start_m[first]
    del first, start_m
    gap = np.subtract(a0, before, out=before)
    has = c_len > 0
    last = np.maximum(c_first + c_len - 1, 0)
    e_rel = e0 - ch.c_start[ch.chain]
    emax_rel = _segmented_cummax(e_rel, ch.chain)
    del e_rel
    c_emax = np.where(has, emax_rel[last] + ch.c_start, ch.c_start) if n else ch.c_start
    del emax_rel
    c_alast = np.where(has, a0[last], ch.c_start) if n else ch.c_start
    after_all = ch.c_end >= c_emax
    tail = ch.c_end - np.where(after_all, c_emax, c_alast)
    return Recorded(
        a0, coll, const, waits, after_ns, pos, join, gap, c_first, c_len, after_all, tail, check
    )


def _joins(
    a0: np.ndarray,
    e0: np.ndarray,
    ch: Chains,
    c_first: np.ndarray,
    c_len: np.ndarray,
    sig: np.ndarray | None,
    is_async: np.ndarray | None = None,
    collective: np.ndarray | None = None,
    blocking: np.ndarray | None = None,
    expected: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Each member's join (see :attr:`Recorded.join`) and, per member, the latest completion of
    the earlier members joined at or before it (int64 min when none), by one search over the
    chains laid end to end on one increasing time axis. ``sig``: per chain, a code equal for
    chains of the same program (same ops in the same order): a position's join is then the
    latest one seen there. ``blocking`` (per member, when the flags are known): a collective
    its caller waited for, joined at the next member whatever its completion says;
    ``expected``: the completions the model expects (release + usual transfer), against which
    a wait is recognized where the recorded completion came late (``_waited_seen_late``)."""
    n = len(a0)
    if not n:
        return np.zeros(0, dtype=index_dtype(0)), np.zeros(0, dtype=np.int64)
    start_m = ch.c_start[ch.chain]
    a_rel, e_rel = a0 - start_m, e0 - start_m
    span = np.zeros(len(c_first), dtype=np.int64)
    np.maximum.at(span, ch.chain, e_rel + 1)
    base = np.cumsum(span) - span  # each chain's origin on the axis: chains do not overlap
    b_m = base[ch.chain]
    del span, start_m
    key_a = a_rel + b_m
    key_e = e_rel + b_m
    j = np.searchsorted(key_a, key_e, side="left")
    idx = np.arange(n)
    np.maximum(j, idx + 1, out=j)
    end = (c_first + c_len)[ch.chain]
    if sig is not None:
        j = _harmonized(
            j, idx, end, a0, e0, ch, c_first, c_len, sig, is_async, collective, expected
        )
    if blocking is not None:
        j = np.where(blocking, idx + 1, j)
    ok = j < end
    join = np.where(ok, j, -1).astype(index_dtype(n))
    # the joined completions' running maximum, chain by chain (values of chain c lie in
    # [base_c - 1, next base), so one running maximum over the axis never crosses chains)
    acc = b_m - 1
    np.maximum.at(acc, j[ok], key_e[ok])
    np.maximum.accumulate(acc, out=acc)
    joined = np.where(acc >= b_m, acc - b_m + (a0 - a_rel), np.int64(I64_MIN))
    return join, joined


def _harmonized(
    j: np.ndarray,
    idx: np.ndarray,
    end: np.ndarray,
    a0: np.ndarray,
    e0: np.ndarray,
    ch: Chains,
    c_first: np.ndarray,
    c_len: np.ndarray,
    sig: np.ndarray,
    is_async: np.ndarray | None = None,
    collective: np.ndarray | None = None,
    expected: np.ndarray | None = None,
) -> np.ndarray:
    """The joins made the same at each position of the chains of one signature (one program
    waits for an op at one place): the latest first issue after its completion seen there (on
    each chain at least its own),
    moved on to later issues while waiting for the op there makes the compute before that
    issue vary more over the chains (its standard deviation more than 100 ns higher) than
    waiting for the previous issue (and the previous member's completion, if that is a
    blocking op): an async op that completed during the compute was not waited for (with it
    the compute would be measured from its completion). An op always completed before the next
    issue is blocking and stays joined there (with it, the compute is what it is; without, it
    would add the op's varying duration), unless measuring the compute before the next issue
    from its completion makes that vary more from step to step on each rank (by half, and by
    0.2 % of the longest such interval or 100 ns) than from its issue — or, for a collective issued async (``is_async``, ``collective``: per
    member, when known; a blocking op is not tested, a receive not over the chains: the next
    compute needs its data), over the chains (100 ns) —: then it is an async op whose flight
    covered the compute. A position held by one chain keeps its own join."""
    n = len(j)
    # (the tests below measure from the completion the model expects where it is known: a
    # recorder's lag on the recorded one would pass for an async op's flight)
    e_ref = e0 if expected is None else expected
    pos = idx - c_first[ch.chain]
    width = int(c_len.max(initial=1))
    _, key = unique_inverse(sig[ch.chain].astype(np.int64) * width + pos)
    ng = int(key.max(initial=-1)) + 1
    none = n + 1
    off = np.where(j < end, j - idx, none)
    # per group: the offset of the join, the latest seen (a chain where the op completed
    # after its last issue says nothing of where the program waits for it)
    d = np.zeros(ng, dtype=np.int64)
    np.maximum.at(d, key[off < none], off[off < none])
    d[np.bincount(key[off < none], minlength=ng) == 0] = none
    if not n:
        return j
    lo = np.full(ng, none, dtype=np.int64)
    np.minimum.at(lo, key, off)
    blocking = (lo == 1) & (d == 1)  # always completed before the next issue
    size = np.bincount(key, minlength=ng)
    prev_issue = np.r_[np.int64(0), a0[:-1]]
    # an op always completed before the next issue was waited for there, unless (an async op
    # whose flight covered the compute) measuring that compute from its completion makes it
    # vary more from step to step on each rank than measuring it from the op's issue
    flagged = np.zeros(ng, dtype=bool)  # a member was issued async (when that is known)
    if is_async is not None:
        flagged[key[is_async]] = True
    m = np.flatnonzero(blocking[key] & (size[key] >= 2) & (idx + 1 < end))
    if is_async is not None:
        m = m[flagged[key[m]]]  # (a blocking op is waited for where it completes)
    if len(m):
        g = key[m]
        with_it = (a0[m + 1] - e_ref[m]).astype(np.float64)
        without = (a0[m + 1] - a0[m]).astype(np.float64)
        sub = unique_inverse(g * (int(ch.c_rank.max(initial=0)) + 1) + ch.c_rank[ch.chain[m]])[1]
        # (a real wait taken for compute freezes it into every scenario: strong evidence only,
        # by the standard deviations and by robust spreads too: a completion the recorder saw
        # late now and then — a polled work on a loaded machine — must not make an op the
        # program waits for look async)
        scale = np.zeros(ng)
        np.maximum.at(scale, g, np.abs(without))
        floor = np.maximum(100, 0.002 * scale)
        w_sp, wo_sp = group_spread(with_it, g, ng, sub), group_spread(without, g, ng, sub)
        async_like = (w_sp > 1.5 * wo_sp + floor) & blocking
        if async_like.any():  # (the robust spreads only where the deviations say async)
            t = async_like[g]
            tg, ts = g[t], unique_inverse(sub[t])[1]
            w_rs = robust_group_spread(with_it[t], tg, ng, ts)
            wo_rs = robust_group_spread(without[t], tg, ng, ts)
            async_like &= w_rs > 1.5 * wo_rs + floor
        if is_async is not None and collective is not None:
            # an async collective (not a receive, whose data the next compute needs): also
            # when it varies more over the chains
            cross = np.zeros(ng, dtype=bool)
            cross[key[collective & is_async]] = True
            moved = group_spread(with_it, g, ng) > group_spread(without, g, ng) + 100
            async_like |= moved & blocking & cross
        blocking &= ~async_like
        d[async_like] = 2
    # waited for at an issue before the earliest one it was seen joined at (the next first),
    # though seen complete after it: the recorder saw it late
    # (only against the model's completion, release + usual transfer: a completion recorded
    # exactly after an issue is an op in flight there, however tightly the two go together)
    seen_late = np.zeros(ng, dtype=bool)
    top = SEEN_LATE_OFFSETS + 1 if expected is not None else 1
    for o in range(1, min(int(lo[lo < none].max(initial=1)), top)):
        open_ = (lo > o) & ~blocking & ~seen_late
        if not open_.any():
            break
        got = waited_seen_late(open_, key, ng, size, idx, end, a0, e_ref, o)
        d[got] = o
        seen_late |= got
    if expected is None and collective is not None:
        # without the model, a send or receive only, at its next issue, within the lag: the
        # next issue came right after the recorded completion would have had it
        p2p = np.zeros(ng, dtype=bool)
        p2p[key[~collective]] = True
        open_ = (lo > 1) & ~blocking & p2p
        if open_.any():
            got = waited_seen_late(open_, key, ng, size, idx, end, a0, e0, 1, strict=True)
            d[got] = 1
            seen_late |= got
    blocking |= seen_late & (d == 1)
    # what each issue waited for besides the op tested: the previous issue, and the previous
    # member's completion when that is a blocking op's
    prev_done = np.r_[np.int64(I64_MIN), np.where(blocking[key[:-1]], e0[:-1], I64_MIN)]
    active = (size >= 2) & (d < none) & ~blocking & ~seen_late
    while active.any():
        m = np.flatnonzero(active[key])
        g = key[m]
        at = m + d[g]
        past = at >= end[m]
        if past.any():
            d[np.unique(g[past])] = none
            active[g[past]] = False
            keep = ~active[g] | past
            m, g, at = m[~keep], g[~keep], at[~keep]
            if not len(m):
                break
        base = np.maximum(prev_issue[at], np.where(at - 1 == m, I64_MIN, prev_done[at]))
        without = (a0[at] - base).astype(np.float64)
        with_it = (a0[at] - np.maximum(base, e_ref[m])).astype(np.float64)
        moved = group_spread(with_it, g, ng) > group_spread(without, g, ng) + 100
        d[moved] += 1
        active &= moved
    step = d[key]
    at = np.where(step < none, idx + step, end)
    # never before the chain's own first issue after the completion, except at a blocking
    # op's: every chain of the program that tells waited for it before its next issue, so a
    # chain whose completion was recorded after that issue waited there too — the recorder
    # saw the completion late (a work waited for in C++, DDP's buckets, is polled: on a
    # loaded machine the poll lags by milliseconds), and joining it later would count the
    # whole wait as compute. Its next gap is then negative: minus the lag.
    return np.where(blocking[key] | seen_late[key], at, np.maximum(at, j))


def _eager_sends(
    table: EventTable,
    match: CollectiveMatch,
    off: np.ndarray,
    rows: np.ndarray,
    coll: np.ndarray,
    first_pair: int,
    n_pairs: int,
) -> np.ndarray:
    """bool [member]: the sends of the *eager* (sender, receiver) directions (a send completes
    without waiting for its receiver), judged over every matched message of the direction
    (aligned clock). A send that completed before its receive was issued, in less than half
    that lead, votes eager; one issued
    a time Δ before its receive, Δ more than half the direction's transfer time (the median
    duration of its sends issued after their receive: the send then takes the transfer
    whatever the semantics), votes eager when its duration is nearer that time than Δ + that
    time, else rendezvous. A direction
    is eager when most of its votes are, one without votes when most of the run's are; a run
    without votes is taken as rendezvous (an eager send taken as rendezvous is off by at most
    its transfer time; the other way round, a send that waited for a slow receiver would keep
    that wait in every scenario)."""
    lead = np.zeros(len(rows), dtype=bool)
    if not n_pairs:
        return lead
    sr, rr = match.p2p_send_row, match.p2p_recv_row
    a_s = table.start_ns[sr] + off[table.rank[sr]]
    a_r = table.start_ns[rr] + off[table.rank[rr]]
    d_s = table.duration_ns[sr].astype(np.int64)
    width = int(table.rank.max(initial=0)) + 1
    direction = table.rank[sr].astype(np.int64) * width + table.peer[sr].astype(np.int64)
    dirs, inv = unique_inverse(direction)
    delta = a_r - a_s
    later = delta <= 0
    xfer = np.full(len(dirs), np.nan)
    by = RowsByKey(inv)
    for d in range(len(dirs)):
        mine = by.rows(d)
        f = mine[later[mine]]
        if len(f):
            xfer[d] = float(np.median(d_s[f]))
    x = xfer[inv]
    # a send that completed before its receive was issued is strong evidence, unless it took
    # most of that lead: a rendezvous send whose receive's issue was recorded late (a batch of
    # p2p ops is recorded as one) looks like that
    strong = (a_s + d_s < a_r) & (2 * d_s < delta)
    known = np.isfinite(x)
    known[known] = delta[known] > x[known] / 2  # (a shorter lead says little against noise)
    with np.errstate(invalid="ignore"):
        nearer = np.abs(d_s - x) < np.abs(d_s - (delta + x))
    eager_vote = strong | (known & nearer)
    rdv_vote = known & ~strong & ~nearer
    ev = np.bincount(inv, weights=eager_vote.astype(np.float64), minlength=len(dirs))
    rv = np.bincount(inv, weights=rdv_vote.astype(np.float64), minlength=len(dirs))
    run_eager = ev.sum() > rv.sum()
    eager_dir = np.where(ev + rv > 0, ev > rv, run_eager)
    pair = coll.astype(np.int64) - first_pair
    in_pair = np.flatnonzero((pair >= 0) & (pair < n_pairs))
    if not len(in_pair):
        return lead
    p = pair[in_pair]
    is_send = rows[in_pair].astype(np.int64) == sr[p]
    lead[in_pair[is_send]] = eager_dir[inv[p[is_send]]]
    return lead


def _collectives(
    table: EventTable, match: CollectiveMatch, off: np.ndarray, rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Each member's collective code and, per collective, the latest arrival of its members
    that are not replayed (int64 min when none); the code of the first send/recv pair and the
    number of pairs."""
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
    return coll, const, nc, npairs


def own_compute(table: EventTable, ch: Chains, sig: np.ndarray) -> np.ndarray:
    """Each chain's compute (int64 ns, its rank's own clock: ``ch`` built with zero offsets):
    the sum of its members' compute gaps (see :func:`record`, with the joins of :func:`_joins`
    made the same across the chains of a signature) and the step's end minus the later of its
    last issue and its latest completion (at most the end: the step waited for what was in
    flight) — the step's time minus the time its rank waited for communication, where an
    async op counts only where the program waited for it."""
    rows = ch.row
    n, nch = len(rows), len(ch.c_rank)
    out = (ch.c_end - ch.c_start).astype(np.int64)
    if not n:
        return out
    a0 = table.start_ns[rows].astype(np.int64)
    e0 = a0 + table.duration_ns[rows].astype(np.int64)
    # a blocking collective completed by its rank's next issue (a later completion is the
    # recorder's: see replay_repair)
    blocking = blocking_members(table.is_async, table.peer, rows)
    cap_blocking(e0, next_issue(a0, ch.chain, ch.c_end), blocking)
    first_idx = np.flatnonzero(np.r_[True, ch.chain[1:] != ch.chain[:-1]])
    c_first = np.full(nch, -1, dtype=np.int64)
    c_len = np.zeros(nch, dtype=np.int64)
    c_first[ch.chain[first_idx]] = first_idx
    c_len[ch.chain[first_idx]] = np.diff(np.r_[first_idx, n])
    flags = None if table.is_async is None else table.is_async[rows]
    _, joined = _joins(a0, e0, ch, c_first, c_len, sig, flags, table.peer[rows] < 0, blocking)
    before = np.r_[np.int64(0), a0[:-1]]
    np.maximum(before, joined, out=before)
    before[first_idx] = ch.c_start[ch.chain[first_idx]]
    gap = a0 - before
    has = c_len > 0
    last = np.maximum(c_first + c_len - 1, 0)
    e_rel = _segmented_cummax(e0 - ch.c_start[ch.chain], ch.chain)
    c_emax = np.where(has, e_rel[last] + ch.c_start, ch.c_start)
    c_alast = np.where(has, a0[last], ch.c_start)
    # the step's end waited for its ops still in flight (DDP's last buckets: a completion
    # noticed after the step ended is the recorder's delay, not compute)
    tail = ch.c_end - np.maximum(c_alast, np.minimum(c_emax, ch.c_end))
    gaps = np.bincount(ch.chain, weights=gap, minlength=nch).astype(np.int64)
    return np.where(has, gaps + tail, out)


def fold_joins(
    e_join: np.ndarray, held: np.ndarray, chain_of: np.ndarray, slots: np.ndarray
) -> None:
    """The replay's held completions join their chains: ``e_join[:, chain_of[i]]`` =
    max(itself, ``held[:, slots[i]]``) for every i (a chain may take several)."""
    if len(slots):
        np.maximum.at(e_join, (slice(None), chain_of), held[:, slots])  # type: ignore[arg-type]


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

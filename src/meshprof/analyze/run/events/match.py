"""Match every collective across ranks and measure who waited for whom.

Collectives (peer == -1) match by (group name, seq); send/recv match by
(group name, src, dst, seq), where seq counts the messages of one (pair, direction) on each side.

Definitions (all times on the aligned clock, ns):

- arrival_i = the time rank i issued the collective;
- completion_i = arrival_i + duration_i (about the same instant on every member of a
  synchronizing collective);
- skew = last arrival − first arrival;
- the last rank is the one with the latest arrival (the one everybody waited for);
- wait_i = last arrival − arrival_i, capped at rank i's own duration (a rank cannot have waited
  longer than it spent in the collective; the cap also absorbs clock-alignment error).

A collective is *complete* when every member of its group recorded it; incomplete ones (a missing
rank file, sampling, ring-buffer eviction) are still matched among the members present, and counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshprof.analyze.compute.sorting import group_seq_key, stable_argsort, unique_inverse
from meshprof.analyze.run.events.clock import ClockAlignment
from meshprof.analyze.run.events.table import EventTable
from meshprof.analyze.run.types import GroupRow


@dataclass(frozen=True, slots=True)
class CollectiveMatch:
    """Matched collectives (one row per (group, seq)) and their members (one row per rank)."""

    gid: np.ndarray
    """int32, per collective: run-wide group code (EventTable.groups)."""
    seq: np.ndarray
    """int64, per collective: sequence number in the group."""
    op: np.ndarray
    """int32, per collective: op code (EventTable.ops) of the first member."""
    present: np.ndarray
    """int32, per collective: members that recorded it."""
    expected: np.ndarray
    """int32, per collective: members of the group."""
    first_arrival_ns: np.ndarray
    """int64, per collective: earliest aligned arrival."""
    last_arrival_ns: np.ndarray
    """int64, per collective: latest aligned arrival."""
    last_rank: np.ndarray
    """int32, per collective: the rank that arrived last."""
    size_bytes: np.ndarray
    """int64, per collective: nccl-tests buffer size S (largest member's)."""
    member_coll: np.ndarray
    """int32, per member: row in the per-collective arrays."""
    member_rank: np.ndarray
    """per member: rank (the EventTable's rank dtype: int16 up to 32,767 ranks)."""
    member_row: np.ndarray
    """int32, per member: row in the EventTable (int64 beyond 2**31 rows)."""
    member_arrival_ns: np.ndarray
    """int64, per member: aligned arrival."""
    member_wait_ns: np.ndarray
    """per member: time waited for the last rank (see module docstring); at most its
    duration, so in the EventTable's duration dtype (int32 where durations fit)."""
    p2p_send_row: np.ndarray
    """int64, per matched send/recv pair: EventTable row of the send."""
    p2p_recv_row: np.ndarray
    """int64, per matched pair: EventTable row of the recv."""
    unmatched_p2p: int
    """send/recv rows without a partner."""

    @property
    def skew_ns(self) -> np.ndarray:
        return self.last_arrival_ns - self.first_arrival_ns

    @property
    def complete(self) -> np.ndarray:
        return self.present >= self.expected

    def __len__(self) -> int:
        return len(self.gid)


@dataclass(frozen=True, slots=True)
class MatchSummary:
    """Matching statistics for the report."""

    collectives: int
    """(group, seq) keys seen on at least one rank."""
    complete: int
    """Collectives recorded by every member of their group."""
    incomplete: int
    """Collectives some member did not record."""
    p2p_pairs: int
    """Matched send/recv pairs."""
    unmatched_p2p: int
    """send or recv rows without a partner."""
    skew_p50_ns: int
    """Median arrival skew over collectives with ≥ 2 members present (ns)."""
    skew_p95_ns: int
    """95th percentile of that skew (ns)."""
    skew_max_ns: int
    """Largest skew (ns)."""
    total_wait_ns: int
    """Sum of every member's wait (ns)."""
    groups: tuple[GroupRow, ...] = ()
    """Matching statistics per process group."""


def match_collectives(table: EventTable, clock: ClockAlignment) -> CollectiveMatch:
    """Match the table's collectives and point-to-point messages across ranks."""
    offsets = clock.offsets()
    off = np.asarray(
        [offsets.get(int(r), 0) for r in range(int(table.rank.max()) + 1)] if len(table) else [0],
        dtype=np.int64,
    )
    idx_t = np.int32 if len(table) < 2**31 else np.int64  # 4 B per member, not 8
    p2p = table.peer >= 0
    coll: np.ndarray | None = np.flatnonzero(~p2p).astype(idx_t) if p2p.any() else None
    del p2p
    if coll is None:  # only collectives (the usual case): no row list, no gathered copies
        arrival = off[table.rank]
        arrival += table.start_ns
        key = group_seq_key(table.gid, table.seq)
    else:
        arrival = off[table.rank[coll]]
        arrival += table.start_ns[coll]
        key = group_seq_key(table.gid[coll], table.seq[coll])
    # sort by key then arrival (np.lexsort((arrival, key)), each temporary let go as soon as
    # it is used): each collective's members are contiguous, the last one arrived last
    o1 = stable_argsort(arrival)
    kk = key[o1]
    del key
    o2 = stable_argsort(kk)
    k = kk[o2]
    del kk
    order = o1[o2].astype(idx_t, copy=False)
    del o1, o2
    rows = order if coll is None else coll[order]
    arr = arrival[order]
    del coll, arrival, order
    starts = np.nonzero(np.r_[True, k[1:] != k[:-1]])[0] if len(k) else np.zeros(0, dtype=np.int64)
    del k
    ends = np.r_[starts[1:], len(rows)].astype(np.int64)
    member_coll = (
        np.repeat(np.arange(len(starts), dtype=idx_t), ends - starts)
        if len(starts)
        else np.zeros(0, dtype=idx_t)
    )
    first = arr[starts] if len(starts) else arr[:0]
    last = arr[ends - 1] if len(starts) else arr[:0]
    if len(rows):
        wait = last[member_coll]
        wait -= arr
        np.minimum(wait, table.duration_ns[rows], out=wait)
        np.maximum(wait, 0, out=wait)
    else:
        wait = arr[:0]
    size = (
        np.maximum.reduceat(table.size_bytes[rows], starts)
        if len(starts)
        else np.zeros(0, dtype=np.int64)
    )
    gid = (table.gid[rows[starts]] if len(starts) else table.gid[:0]).astype(np.int32)
    sizes = np.asarray([len(g.ranks) for g in table.groups] or [0], dtype=np.int32)
    expected = sizes[gid] if len(gid) else np.zeros(0, dtype=np.int32)
    send_row, recv_row, unmatched = _match_p2p(table)
    return CollectiveMatch(
        gid=gid,
        seq=(table.seq[rows[starts]] if len(starts) else table.seq[:0]).astype(np.int64),
        op=(table.op[rows[starts]] if len(starts) else table.op[:0]).astype(np.int32),
        present=(ends - starts).astype(np.int32, copy=False),
        expected=expected,
        first_arrival_ns=first.astype(np.int64, copy=False),
        last_arrival_ns=last.astype(np.int64, copy=False),
        last_rank=table.rank[rows[ends - 1]].astype(np.int32, copy=False)
        if len(starts)
        else np.zeros(0, dtype=np.int32),
        size_bytes=size.astype(np.int64, copy=False),
        member_coll=member_coll.astype(idx_t, copy=False),
        member_rank=table.rank[rows],
        member_row=rows.astype(idx_t, copy=False),
        member_arrival_ns=arr.astype(np.int64, copy=False),
        member_wait_ns=wait.astype(table.duration_ns.dtype, copy=False),
        p2p_send_row=send_row,
        p2p_recv_row=recv_row,
        unmatched_p2p=unmatched,
    )


def _match_p2p(table: EventTable) -> tuple[np.ndarray, np.ndarray, int]:
    """Pair each send with its recv by (group, src, dst, seq).

    Where several sends share a key the last one is kept; each key is matched once, by the first
    recv that has it. Pairs come out in the recvs' table order."""
    p2p = np.nonzero(table.peer >= 0)[0]
    empty = np.zeros(0, dtype=np.int64)
    if not len(p2p):
        return empty, empty.copy(), 0
    names = table.ops
    send_op = np.asarray([o.startswith("send") for o in names], dtype=bool)
    recv_op = np.asarray([o.startswith("recv") for o in names], dtype=bool)
    ops = table.op[p2p]
    sends, recvs = p2p[send_op[ops]], p2p[recv_op[ops]]
    if not len(sends) or not len(recvs):
        return empty, empty.copy(), len(p2p)
    # (group, src, dst, seq): a send's src is its own rank, a recv's src is its peer
    keys = np.empty((len(sends) + len(recvs), 4), dtype=np.int64)
    keys[:, 0] = table.gid[np.r_[sends, recvs]]
    keys[:, 3] = table.seq[np.r_[sends, recvs]]
    keys[: len(sends), 1] = table.rank[sends]
    keys[: len(sends), 2] = table.peer[sends]
    keys[len(sends) :, 1] = table.peer[recvs]
    keys[len(sends) :, 2] = table.rank[recvs]
    kid = _row_ids(keys)
    ks, kr = kid[: len(sends)], kid[len(sends) :]
    send_of = np.full(int(kid.max()) + 1, -1, dtype=np.int64)
    # the last send of each key: first occurrence in the reversed order
    u, first_rev = np.unique(ks[::-1], return_index=True)
    send_of[u] = sends[::-1][first_rev]
    u, first = np.unique(kr, return_index=True)
    first = first[send_of[u] >= 0]
    first.sort()
    r_rows = recvs[first].astype(np.int64)
    s_rows = send_of[kr[first]].astype(np.int64)
    unmatched = len(p2p) - 2 * len(s_rows)
    return s_rows, r_rows, unmatched


def _row_ids(keys: np.ndarray) -> np.ndarray:
    """``np.unique(keys, axis=0, return_inverse=True)[1]`` for an int64 (n, k) array: the
    columns packed into one int64 (mixed radix, each column's value minus its minimum) when
    their ranges fit in 63 bits, so one integer sort replaces numpy's row-wise sort of a void
    view (0.8 s for 150k send/recv rows)."""
    lo = keys.min(axis=0)
    span = keys.max(axis=0) - lo + 1
    total = 1
    for x in span.tolist():
        total *= int(x)
    if total >= 1 << 62:
        _, kid = np.unique(keys, axis=0, return_inverse=True)
        return kid.reshape(-1)
    packed = np.zeros(len(keys), dtype=np.int64)
    for j in range(keys.shape[1]):
        packed *= int(span[j])
        packed += keys[:, j] - lo[j]
    return unique_inverse(packed)[1]


def summarize_match(m: CollectiveMatch) -> MatchSummary:
    """Counts and skew percentiles of a :class:`CollectiveMatch`."""
    multi = m.present >= 2
    skew = m.skew_ns[multi]
    pct = (lambda q: int(np.percentile(skew, q))) if len(skew) else (lambda q: 0)
    return MatchSummary(
        collectives=len(m),
        complete=int(m.complete.sum()),
        incomplete=int((~m.complete).sum()),
        p2p_pairs=len(m.p2p_send_row),
        unmatched_p2p=m.unmatched_p2p,
        skew_p50_ns=pct(50),
        skew_p95_ns=pct(95),
        skew_max_ns=int(skew.max()) if len(skew) else 0,
        total_wait_ns=int(m.member_wait_ns.sum()),
    )


def arrived_last_share(m: CollectiveMatch, min_skew_ns: int = 0) -> dict[int, tuple[int, int]]:
    """rank → (times it arrived last, collectives it took part in), over collectives with at
    least 2 members present (an incomplete collective compares the members that recorded it, so a
    missing rank file does not hide a straggler among the others) whose arrival skew exceeds
    ``min_skew_ns``: below that the order of arrival is noise (clock alignment, timers), as in
    back-to-back collectives that every member reaches within µs of the others, and such ties
    would dilute the share of a rank that everybody waits for elsewhere."""
    multi = m.present >= 2
    if min_skew_ns > 0:
        multi &= m.skew_ns >= min_skew_ns
    if not len(m.member_rank):
        return {}
    # counted in chunks of members (ranks are small integers: bincounts, no sort of the members)
    top = int(m.member_rank.max()) + 1
    counts = np.zeros(top, dtype=np.int64)
    step = 1 << 20
    for c0 in range(0, len(m.member_rank), step):
        part = multi[m.member_coll[c0 : c0 + step]]
        counts += np.bincount(m.member_rank[c0 : c0 + step][part], minlength=top)
    lc = np.bincount(m.last_rank[multi], minlength=top)
    return {int(r): (int(lc[r]), int(counts[r])) for r in np.flatnonzero(counts).tolist()}

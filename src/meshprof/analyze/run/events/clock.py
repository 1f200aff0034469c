"""Clock alignment: put every rank's timestamps on one clock (the reference rank's, rank 0).

Two estimates of each rank's offset (``aligned = local + offset``), combined:

1. **Timestamp exchange at start** (``meta["clock_sync"]``, see :mod:`meshprof.comm.clocksync`):
   from the sample with the smallest round trip, ``offset = t_ref − (t_send + t_recv) / 2``; the
   true offset lies within ``± RTT / 2`` of it whatever the delays on the way (causality).
2. **Completion of synchronizing collectives** (all_reduce, all_gather, reduce_scatter,
   all_to_all, barrier, ...): no member completes before the last one arrives and all complete at
   about the same instant, so for a collective seen by rank r and an already aligned rank a,
   ``(end_a + offset_a) − end_r`` estimates offset_r. The median over collectives is the estimate;
   a blocking collective (any, without flags) completed after its rank's next issue is left
   out, and so is one completed at or after the end of the step it was issued in: the
   recorder saw it late (a poller, the rank's next call, the step's end), its completion
   aligns nothing;
   its uncertainty is the standard error 1.4826·MAD/√n plus the anchor's own uncertainty. Ranks are
   aligned outward from the reference (a rank that shares no collective with the reference is
   aligned through ranks that do).

Combining: when both exist and agree (differ by at most ``_AGREE_FACTOR`` times the sum of
their uncertainties, the collectives' taken as the larger of their standard error and the
spread of their samples, 1.4826·MAD) the collective estimate is kept inside the exchange interval
``[o_x − RTT/2, o_x + RTT/2]`` when it is the tighter one, else the exchange estimate is kept;
the uncertainty is the collective one when its median lay inside the interval, else RTT/2.
The factor matters on a loaded host: with a handful of collectives whose completions are seen
hundreds of µs apart, the MAD-based standard error understates the spread, and a strict test
would throw away a ±35 µs exchange for a ±300 µs median. When they disagree by more (a clock stepped or drifted after start) the collective
estimate wins, since it covers the whole run, and the disagreement is reported.
Clock drift during the run is not modelled: one constant offset per rank.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from meshprof.analyze.compute.sorting import group_seq_key, lexsort2, stable_argsort
from meshprof.analyze.run.events.table import EventTable
from meshprof.records.rank_meta import ClockSync
from meshprof.rundir import LoadedRun

#: Ops after which every member has seen every other member's arrival and completes together.
SYNC_OPS = frozenset(
    {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier", "all_gather_object"}
)
_MAX_SYNC = 20000  # collectives used for refinement (evenly spaced over the run beyond this)
_PACK_LIMIT = 1 << 62  # (group, seq, column) cells packed into one int64 below this
_AGREE_FACTOR = 3  # exchange and collective estimates agree within this × their summed uncertainty


@dataclass(frozen=True, slots=True)
class RankClock:
    """How one rank's clock was put on the reference clock."""

    rank: int
    """Global rank."""
    offset_ns: int
    """Add to this rank's timestamps to get the reference clock (ns)."""
    uncertainty_ns: int
    """Bound (exchange) or standard error (collectives) of the offset, ns; -1 when unknown."""
    method: str
    """"reference", "exchange", "collectives", "exchange+collectives" or "none"."""
    exchange_offset_ns: int | None
    """Offset from the min-RTT timestamp-exchange sample (ns), None without samples."""
    exchange_rtt_ns: int | None
    """Round trip of that sample (ns); the exchange uncertainty is half of it."""
    collective_offset_ns: int | None
    """Offset from collective completion times (ns), None without shared collectives."""
    collective_uncertainty_ns: int | None
    """Standard error of the collective estimate (ns)."""
    collective_samples: int
    """Synchronizing collectives the collective estimate used."""
    disagreement_ns: int
    """|collective − exchange| when both exist, else 0."""


@dataclass(frozen=True, slots=True)
class ClockAlignment:
    """Offsets for every loaded rank."""

    reference_rank: int
    """The rank whose clock is the common clock."""
    ranks: tuple[RankClock, ...]
    """One entry per loaded rank, in rank order."""
    max_uncertainty_ns: int
    """Largest remaining uncertainty over the aligned ranks (ns); -1 when some rank is unaligned."""

    def offset(self, rank: int) -> int:
        # ranks are in rank order: a binary search (a linear scan per call made the per-rank
        # loops of the report quadratic in the number of ranks)
        i = bisect.bisect_left(self.ranks, rank, key=lambda rc: rc.rank)
        if i < len(self.ranks) and self.ranks[i].rank == rank:
            return self.ranks[i].offset_ns
        for rc in self.ranks:  # not in rank order (built by hand)
            if rc.rank == rank:
                return rc.offset_ns
        return 0

    def offsets(self) -> dict[int, int]:
        return {rc.rank: rc.offset_ns for rc in self.ranks}


def exchange_estimate(clock_sync: ClockSync | None) -> tuple[int, int] | None:
    """(offset_ns, rtt_ns) from the min-RTT sample of a rank's timestamp exchange, None without
    one."""
    if clock_sync is None:
        return None
    best: tuple[int, int] | None = None
    for s in clock_sync.samples or ():
        try:
            t_send, t_ref, t_recv = (int(x) for x in s)
        except (TypeError, ValueError):
            continue
        rtt = t_recv - t_send
        if rtt < 0:
            continue
        # offset = t_ref - (t_send + t_recv) / 2, in integers without overflow
        off = t_ref - t_send - rtt // 2
        if best is None or rtt < best[1]:
            best = (off, rtt)
    return best


@dataclass(frozen=True, slots=True)
class _SyncCells:
    """Completion times of synchronizing collectives seen by ≥ 2 ranks, one cell per
    (collective, rank), sorted by group, then collective, then rank column.

    ``row`` numbers the collectives (0..rows-1, in (group, seq) order), ``col`` is the rank's
    column (index into the sorted rank list), ``end`` the completion time relative to ``base``
    (float ns); ``group_start`` delimits each group's cells (``group_start[i]:group_start[i+1]``)."""

    row: np.ndarray
    col: np.ndarray
    end: np.ndarray
    group_start: np.ndarray
    base: int


_ROW_BLOCK = 1 << 18
"""Rows of the event table :func:`_sync_cells` reads at a time in its passes over all rows."""


def _sync_cells(table: EventTable, ranks: list[int], late: np.ndarray | None = None) -> _SyncCells:
    """The cells of synchronizing collectives seen by ≥ 2 ranks; beyond ``_MAX_SYNC``
    collectives in one group, ``_MAX_SYNC`` evenly spaced ones of it (every k-th seq first, then
    evenly spaced over those). Cost: one pass over the table's columns, then sorts over the
    selected events only (no rank × collective matrix)."""
    empty = _SyncCells(
        np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0), np.zeros(1, np.int64), 0
    )
    sync_ops = np.asarray([i for i, o in enumerate(table.ops) if o in SYNC_OPS], dtype=np.int32)
    is_sync = np.zeros(max(len(table.ops), 1), dtype=bool)
    is_sync[sync_ops] = True
    mask = is_sync[table.op]
    mask &= table.peer < 0
    # a group with more than _MAX_SYNC distinct seqs keeps every k-th seq only, decided before
    # any sort (the same seqs on every member): the sorts below then see ≤ _MAX_SYNC collectives
    # per group, not every event (8 ranks × 1M collectives: ~20k of them)
    ng = len(table.groups)
    if ng and mask.any():
        g = table.gid
        seq = table.seq
        big = np.iinfo(np.int64).max
        lo = np.full(ng, big, dtype=np.int64)
        hi = np.full(ng, -big, dtype=np.int64)
        # a block of rows at a time (int64 temporaries of every row were this function's peak:
        # +95 MiB at 4M events); indices as intp and values as int64: ufunc.at's fast path
        # (mixed dtypes take its slow one, 2.4 s at 8M events)
        blocks = range(0, len(mask), _ROW_BLOCK)
        for b in blocks:
            m = mask[b : b + _ROW_BLOCK]
            gm, sm = g[b : b + _ROW_BLOCK][m].astype(np.intp), seq[b : b + _ROW_BLOCK][m]
            np.minimum.at(lo, gm, sm.astype(np.int64))
            np.maximum.at(hi, gm, sm.astype(np.int64))
        stride = np.maximum((hi - lo + 1) // (2 * _MAX_SYNC), 1)  # 2×: seqs of other ops
        if (stride > 1).any():
            for b in blocks:
                gb = g[b : b + _ROW_BLOCK]
                mask[b : b + _ROW_BLOCK] &= (seq[b : b + _ROW_BLOCK] - lo[gb]) % stride[gb] == 0
    for b in range(0, len(mask), _ROW_BLOCK):
        mask[b : b + _ROW_BLOCK] &= ~_seen_late(table, b, min(b + _ROW_BLOCK, len(mask)))
    if late is not None:
        mask &= ~late
    sel = np.flatnonzero(mask)
    del mask
    if not len(sel) or not ranks:
        return empty
    idx_t = np.int32 if len(table) < 2**31 else np.int64
    sel = sel.astype(idx_t)
    colmap = np.full(max(max(ranks), int(table.rank[sel].max())) + 1, -1, dtype=np.int64)
    colmap[ranks] = np.arange(len(ranks))
    nr = len(ranks)
    # one int64 per cell that orders like (group, seq, rank column): one stable sort groups the
    # cells by collective, orders each collective's by column and puts a rank's second record of
    # a (group, seq) right after its first (kept: the first)
    q = table.seq[sel]
    q_lo = int(q.min())
    span = int(q.max()) - q_lo + 1
    g_n = int(table.gid[sel].max()) + 1
    if g_n * span * nr >= _PACK_LIMIT:  # not packable: the same order from two sorts
        order = lexsort2(colmap[table.rank[sel]], group_seq_key(table.gid[sel], q))
        key = None
    else:
        key = table.gid[sel].astype(np.int64)
        key *= span
        key += q
        key -= q_lo
        key *= nr
        key += colmap[table.rank[sel]]
        order = stable_argsort(key)
    del q
    sel = sel[order]
    # cells in that order, a rank's repeat of a (group, seq) dropped: their collective and column
    # (each temporary let go as soon as it is used: this is clock alignment's memory peak)
    if key is None:
        del order
        coll = group_seq_key(table.gid[sel], table.seq[sel])
        col = colmap[table.rank[sel]]
        first = np.r_[True, (coll[1:] != coll[:-1]) | (col[1:] != col[:-1])]
        if not first.all():
            sel, coll, col = sel[first], coll[first], col[first]
    else:
        key = key[order]
        del order
        first = np.r_[True, key[1:] != key[:-1]]
        if not first.all():
            sel, key = sel[first], key[first]
        col = np.remainder(key, nr).astype(np.int32)
        coll = np.floor_divide(key, nr, out=key)  # (key // nr, in place)
        del key
    del first
    col = col.astype(np.int32, copy=False)
    # collectives (runs of equal coll): members, group
    starts = np.flatnonzero(np.r_[True, coll[1:] != coll[:-1]])
    del coll
    counts = np.diff(np.r_[starts, len(sel)])
    gid = table.gid[sel[starts]].astype(np.int64)
    keep_key = counts >= 2
    # per group, at most _MAX_SYNC collectives, evenly spaced
    kk = np.flatnonzero(keep_key)
    if len(kk):
        kg = gid[kk]
        cut = np.flatnonzero(np.r_[True, kg[1:] != kg[:-1], True])
        sizes = np.diff(cut)
        for i in np.flatnonzero(sizes > _MAX_SYNC).tolist():
            g0, g1 = int(cut[i]), int(cut[i + 1])
            pick = np.zeros(g1 - g0, dtype=bool)
            pick[np.linspace(0, g1 - g0 - 1, _MAX_SYNC).astype(np.int64)] = True
            keep_key[kk[g0:g1][~pick]] = False
    rows = np.flatnonzero(keep_key)
    if not len(rows):
        return empty
    # cells of the kept collectives, numbered 0..len(rows)-1 in (group, seq) order
    keep = np.repeat(keep_key, counts)
    row = np.repeat(np.arange(len(rows), dtype=np.int32), counts[rows])
    col = col[keep]
    sel = sel[keep]
    cell_gid = np.repeat(gid[rows], counts[rows])
    del keep, keep_key, counts, gid, starts
    end = table.start_ns[sel] + table.duration_ns[sel]
    del sel
    base = int(end.min())
    gstart = np.flatnonzero(np.r_[True, cell_gid[1:] != cell_gid[:-1], True])
    end -= base
    return _SyncCells(row, col, end.astype(np.float64), gstart.astype(np.int64), base)


def _seen_late(table: EventTable, lo: int, hi: int) -> np.ndarray:
    """bool [row lo..hi): completed after the next row of its rank was issued — a blocking
    collective (or, without flags, any) whose completion the recorder saw late, as a poller
    does: its completion time aligns nothing. Rows compared with the next row of the file
    only where that one was issued later (a rank's rows are in issue order)."""
    start = table.start_ns[lo : min(hi + 1, len(table))]
    n = hi - lo
    nxt = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    k = len(start) - 1
    if k > 0:
        rk = table.rank[lo : lo + k + 1]
        ok = (rk[1:] == rk[:-1]) & (start[1:] >= start[:-1])
        nxt[:k] = np.where(ok, start[1:], nxt[:k])
    late = start[:n] + table.duration_ns[lo:hi] > nxt
    if table.is_async is not None:
        late &= ~table.is_async[lo:hi]
    return late


def _after_step_end(run: LoadedRun, table: EventTable) -> np.ndarray | None:
    """bool [row]: completed at or after the end of the step span it was issued in (a
    collective's caller waits for it before its step ends: such a completion is the
    recorder's, seen when the step ended); None when no rank recorded steps."""
    out: np.ndarray | None = None
    rk = table.rank
    for r, rd in run.ranks.items():
        sp = rd.spans
        st = sp[sp["kind"] == 0] if len(sp) else sp
        if not len(st):
            continue
        lo, hi = (int(x) for x in np.searchsorted(rk, [r, r + 1]))
        if lo == hi:
            continue
        if out is None:
            out = np.zeros(len(table), dtype=bool)
        st = st[np.argsort(st["start_ns"], kind="stable")]
        s0 = st["start_ns"].astype(np.int64)
        s1 = s0 + st["duration_ns"].astype(np.int64)
        a = table.start_ns[lo:hi]
        i = np.searchsorted(s0, a, side="right") - 1
        j = np.maximum(i, 0)
        out[lo:hi] = (i >= 0) & (a < s1[j]) & (a + table.duration_ns[lo:hi] >= s1[j])
    return out


def _collective_estimates(
    cells: _SyncCells, ranks: list[int], ref_col: int
) -> dict[int, tuple[float, float, int, float]]:
    """rank → (offset, standard error, samples, robust standard deviation of the samples) by
    aligning outward from the reference column.

    Group by group: the group with the most shared collectives among those with an aligned
    member comes first; each of its unaligned members is aligned on the mean aligned completion
    time of the collectives it shares with the group's aligned members (median of the
    differences). Each group's cells are read once or a few times, so the cost is linear in the
    events whatever the number of ranks (the former greedy step re-scanned every unaligned
    column against every aligned one: O(ranks³ × collectives))."""
    import heapq

    est: dict[int, tuple[float, float, int, float]] = {}
    ng = len(cells.group_start) - 1
    if ref_col < 0 or ng <= 0:
        return est
    nr = len(ranks)
    off = np.full(nr, np.nan)
    unc = np.full(nr, np.nan)
    off[ref_col], unc[ref_col] = 0.0, 0.0
    gs = cells.group_start
    # groups of each column, and each group's size in collectives (its priority): the distinct
    # (column, group) pairs, found a block of whole groups at a time (~2^18 cells: a bounded
    # transient instead of a few int64 copies of every cell)
    pairs = []
    g0 = 0
    while g0 < ng:
        g1 = max(int(np.searchsorted(gs, gs[g0] + (1 << 18), side="right")) - 1, g0 + 1)
        g1 = min(g1, ng)
        a, b = int(gs[g0]), int(gs[g1])
        g_of_cell = np.repeat(np.arange(g0, g1, dtype=np.int64), np.diff(gs[g0 : g1 + 1]))
        pairs.append(np.unique(cells.col[a:b].astype(np.int64) * ng + g_of_cell))
        g0 = g1
    gc = np.unique(np.concatenate(pairs))
    del pairs, g_of_cell
    col_groups_flat = gc % ng
    col_cut = np.searchsorted(gc // ng, np.arange(nr + 1))
    g_rows = cells.row[gs[1:] - 1] - cells.row[gs[:-1]] + 1  # groups are never empty
    # members of each group still unaligned
    unaligned_left = np.bincount(col_groups_flat, minlength=ng)
    unaligned_left[col_groups_flat[col_cut[ref_col] : col_cut[ref_col + 1]]] -= 1
    heap: list[tuple[int, int]] = []

    def push(c: int) -> None:
        for g in col_groups_flat[col_cut[c] : col_cut[c + 1]].tolist():
            if unaligned_left[g] > 0:
                heapq.heappush(heap, (-int(g_rows[g]), g))

    push(ref_col)
    while heap:
        _, g = heapq.heappop(heap)
        if unaligned_left[g] <= 0:
            continue
        a, b = int(gs[g]), int(gs[g + 1])
        row = cells.row[a:b] - cells.row[a]
        cols, mcol = np.unique(cells.col[a:b], return_inverse=True)
        mcol = mcol.reshape(-1)
        m = np.full((int(row[-1]) + 1, len(cols)), np.nan)
        m[row, mcol] = cells.end[a:b]
        anchors = ~np.isnan(off[cols])
        if not anchors.any():
            continue
        aligned = m[:, anchors] + off[cols[anchors]]
        present = np.sum(~np.isnan(aligned), axis=1)
        anchor_t = np.nansum(aligned, axis=1) / np.maximum(present, 1)
        has_anchor = present > 0
        u_anchor = float(np.max(unc[cols[anchors]]))
        newly = []
        for j in np.flatnonzero(~anchors).tolist():
            ok = has_anchor & ~np.isnan(m[:, j])
            n = int(ok.sum())
            if not n:
                continue
            d = anchor_t[ok] - m[ok, j]
            med = float(np.median(d))
            sd = 1.4826 * float(np.median(np.abs(d - med)))
            se = sd / np.sqrt(n)
            c = int(cols[j])
            off[c], unc[c] = med, se + u_anchor
            est[ranks[c]] = (med, se + u_anchor, n, sd)
            newly.append(c)
        for c in newly:
            unaligned_left[col_groups_flat[col_cut[c] : col_cut[c + 1]]] -= 1
        for c in newly:
            push(c)
    return est


def align_clocks(run: LoadedRun, table: EventTable) -> ClockAlignment:
    """Estimate every loaded rank's clock offset (see the module docstring)."""
    ranks = sorted(run.ranks)
    ref = 0
    for rd in run.ranks.values():
        cs = rd.meta.clock_sync
        if cs is not None and cs.ref_rank is not None:
            ref = int(cs.ref_rank)
            break
    if ref not in run.ranks:
        # without the reference's file the exchange still relates ranks to its clock; collectives
        # then anchor on the lowest rank that has an exchange estimate
        with_x = [r for r in ranks if exchange_estimate(run.ranks[r].meta.clock_sync)]
        anchor = with_x[0] if with_x else ranks[0]
    else:
        anchor = ref
    late = _after_step_end(run, table)
    coll = _collective_estimates(_sync_cells(table, ranks, late), ranks, ranks.index(anchor))
    x_anchor = exchange_estimate(run.ranks[anchor].meta.clock_sync) if anchor != ref else None
    shift = x_anchor[0] if x_anchor else 0  # collective offsets are relative to the anchor
    out: list[RankClock] = []
    for r in ranks:
        if r == ref:
            out.append(RankClock(r, 0, 0, "reference", None, None, None, None, 0, 0))
            continue
        x = exchange_estimate(run.ranks[r].meta.clock_sync)
        c = coll.get(r)
        if r == anchor and x is not None:
            c = None
        c_off = round(c[0]) + shift if c else None
        c_unc = int(np.ceil(c[1])) + (x_anchor[1] // 2 if x_anchor else 0) if c else None
        if x is not None and c is not None and c_off is not None and c_unc is not None:
            xo, xu = x[0], x[1] // 2
            diff = abs(c_off - xo)
            # the collectives overrule the exchange only when their samples agree with each
            # other far better than with it (their spread, not their standard error: a few
            # completions seen late by a poller move a median of a handful of samples)
            if diff <= _AGREE_FACTOR * (xu + max(c_unc, int(c[3]))):
                final = min(max(c_off, xo - xu), xo + xu) if c_unc < xu else xo
                # a collective median clamped to the exchange interval keeps only the causal
                # bound; an unclamped one keeps its (smaller, statistical) uncertainty
                unc = c_unc if c_unc < xu and final == c_off else xu
                out.append(
                    RankClock(
                        r,
                        final,
                        unc,
                        "exchange+collectives",
                        xo,
                        x[1],
                        c_off,
                        c_unc,
                        c[2],
                        diff,
                    )
                )
            else:
                out.append(
                    RankClock(r, c_off, c_unc, "collectives", xo, x[1], c_off, c_unc, c[2], diff)
                )
        elif x is not None:
            out.append(RankClock(r, x[0], x[1] // 2, "exchange", x[0], x[1], None, None, 0, 0))
        elif c is not None and c_off is not None and c_unc is not None:
            out.append(RankClock(r, c_off, c_unc, "collectives", None, None, c_off, c_unc, c[2], 0))
        else:
            out.append(RankClock(r, 0, -1, "none", None, None, None, None, 0, 0))
    uncs = [rc.uncertainty_ns for rc in out]
    return ClockAlignment(ref, tuple(out), -1 if any(u < 0 for u in uncs) else max(uncs, default=0))

"""Clock alignment: put every rank's timestamps on one clock (the reference rank's, rank 0).

Two estimates of each rank's offset (``aligned = local + offset``), combined:

1. **Timestamp exchange at start** (``meta["clock_sync"]``, see :mod:`meshprof.comm.clocksync`):
   from the sample with the smallest round trip, ``offset = t_ref − (t_send + t_recv) / 2``; the
   true offset lies within ``± RTT / 2`` of it whatever the delays on the way (causality).
2. **Completion of synchronizing collectives** (all_reduce, all_gather, reduce_scatter,
   all_to_all, barrier, ...): no member completes before the last one arrives and all complete at
   about the same instant, so for a collective seen by rank r and an already aligned rank a,
   ``(end_a + offset_a) − end_r`` estimates offset_r. The median over collectives is the estimate;
   its uncertainty is the standard error 1.4826·MAD/√n plus the anchor's own uncertainty. Ranks are
   aligned outward from the reference (a rank that shares no collective with the reference is
   aligned through ranks that do).

Combining: when both exist and agree (differ by at most ``_AGREE_FACTOR`` times the sum of
their uncertainties) the collective estimate is kept inside the exchange interval
``[o_x − RTT/2, o_x + RTT/2]`` when it is the tighter one, else the exchange estimate is kept;
the uncertainty is the collective one when its median lay inside the interval, else RTT/2.
The factor matters on a loaded host: with a handful of collectives whose completions are seen
hundreds of µs apart, the MAD-based standard error understates the spread, and a strict test
would throw away a ±35 µs exchange for a ±300 µs median. When they disagree by more (a clock stepped or drifted after start) the collective
estimate wins, since it covers the whole run, and the disagreement is reported.
Clock drift during the run is not modelled: one constant offset per rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshprof.analyze.sorting import group_seq_key, unique_inverse
from meshprof.analyze.table import EventTable
from meshprof.rundir import LoadedRun

#: Ops after which every member has seen every other member's arrival and completes together.
SYNC_OPS = frozenset(
    {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier", "all_gather_object"}
)
_MAX_SYNC = 20000  # collectives used for refinement (evenly spaced over the run beyond this)
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
        for rc in self.ranks:
            if rc.rank == rank:
                return rc.offset_ns
        return 0

    def offsets(self) -> dict[int, int]:
        return {rc.rank: rc.offset_ns for rc in self.ranks}


def exchange_estimate(clock_sync: dict | None) -> tuple[int, int] | None:
    """(offset_ns, rtt_ns) from the min-RTT sample of a ``clock_sync`` dict, None without one."""
    if not clock_sync:
        return None
    best: tuple[int, int] | None = None
    for s in clock_sync.get("samples") or ():
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


def _sync_matrix(table: EventTable, ranks: list[int]) -> tuple[np.ndarray, int]:
    """Completion times (ns relative to a base, float) of synchronizing collectives:
    one row per (group, seq) seen by ≥ 2 ranks, one column per rank (NaN where absent); beyond
    _MAX_SYNC rows, _MAX_SYNC evenly spaced ones (in (group, seq) order)."""
    sync_ops = np.asarray([i for i, o in enumerate(table.ops) if o in SYNC_OPS], dtype=np.int32)
    sel = np.flatnonzero((table.peer < 0) & np.isin(table.op, sync_ops))
    if not len(sel):
        return np.zeros((0, len(ranks))), 0
    keys, inv = unique_inverse(group_seq_key(table.gid[sel], table.seq[sel]))
    n_keys = len(keys)
    del keys
    rk = table.rank[sel]
    colmap = np.full(max(max(ranks), int(rk.max())) + 1, -1, dtype=np.int64)
    colmap[ranks] = np.arange(len(ranks))
    col = colmap[rk]
    del rk
    # members per (group, seq), counting each (key, rank) cell once as the matrix does
    seen = np.zeros((n_keys, len(ranks)), dtype=bool)
    seen[inv, col] = True
    counts = seen.sum(axis=1)
    del seen
    rows = np.flatnonzero(counts >= 2)
    if len(rows) > _MAX_SYNC:
        rows = rows[np.linspace(0, len(rows) - 1, _MAX_SYNC).astype(np.int64)]
    pos = np.full(n_keys, -1, dtype=np.int64)
    pos[rows] = np.arange(len(rows))
    p = pos[inv]
    del inv, pos
    keep = np.flatnonzero(p >= 0)
    end = table.start_ns[sel] + table.duration_ns[sel]
    base = int(end.min())
    m = np.full((len(rows), len(ranks)), np.nan)
    m[p[keep], col[keep]] = (end[keep] - base).astype(np.float64)
    return m, base


def _collective_estimates(
    m: np.ndarray, ranks: list[int], ref_col: int
) -> dict[int, tuple[float, float, int]]:
    """rank → (offset, standard error, samples) by aligning outward from the reference column."""
    est: dict[int, tuple[float, float, int]] = {}
    if ref_col < 0 or not len(m):
        return est
    off = np.full(len(ranks), np.nan)
    unc = np.full(len(ranks), np.nan)
    off[ref_col], unc[ref_col] = 0.0, 0.0
    while True:
        anchors = ~np.isnan(off)
        aligned = m[:, anchors] + off[anchors]
        present = np.sum(~np.isnan(aligned), axis=1)
        anchor_t = np.nansum(aligned, axis=1) / np.maximum(present, 1)
        best = None
        for c in np.nonzero(~anchors)[0]:
            ok = ~np.isnan(m[:, c]) & np.any(~np.isnan(m[:, anchors]), axis=1)
            n = int(ok.sum())
            if n and (best is None or n > best[1]):
                best = (c, n, ok)
        if best is None:
            return est
        c, n, ok = best
        d = anchor_t[ok] - m[ok, c]
        med = float(np.median(d))
        se = 1.4826 * float(np.median(np.abs(d - med))) / np.sqrt(n)
        u_anchor = float(np.nanmax(unc[anchors]))
        off[c], unc[c] = med, se + u_anchor
        est[ranks[c]] = (med, se + u_anchor, n)


def align_clocks(run: LoadedRun, table: EventTable) -> ClockAlignment:
    """Estimate every loaded rank's clock offset (see the module docstring)."""
    ranks = sorted(run.ranks)
    ref = 0
    for rd in run.ranks.values():
        cs = rd.meta.clock_sync or {}
        if "ref_rank" in cs:
            ref = int(cs["ref_rank"])
            break
    if ref not in run.ranks:
        # without the reference's file the exchange still relates ranks to its clock; collectives
        # then anchor on the lowest rank that has an exchange estimate
        with_x = [r for r in ranks if exchange_estimate(run.ranks[r].meta.clock_sync)]
        anchor = with_x[0] if with_x else ranks[0]
    else:
        anchor = ref
    m, _ = _sync_matrix(table, ranks)
    coll = _collective_estimates(m, ranks, ranks.index(anchor))
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
            if diff <= _AGREE_FACTOR * (xu + c_unc):
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

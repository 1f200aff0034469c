"""What the straggler report measures on every rank, for every rank at once.

Per rank and step: the step's time, its communication time (the length of the union of the
rank's collective intervals inside the step), the time the rank's collective members arriving
in the step waited for the others; per rank and phase: the phase's compute (its time minus the
communication inside it), summed per step, its median over the steps every rank recorded. The
definitions are :mod:`~meshprof.analyze.run.stragglers.stragglers`'; here they are computed without a
Python loop over ranks (100,000 ranks: ~15 s of the report in that loop): each rank's times are
moved onto its own stretch of one axis (a shift per rank, lengths unchanged, the stretches
apart), so that one union, one sort and a few ``searchsorted`` answer every rank's windows —
the same integers the per-rank computation gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from meshprof.analyze.compute import intervals
from meshprof.analyze.compute.grouped import grouped_median
from meshprof.analyze.compute.sorting import stable_argsort
from meshprof.analyze.run.events.clock import ClockAlignment
from meshprof.analyze.run.events.match import CollectiveMatch
from meshprof.analyze.run.events.table import EventTable
from meshprof.events import SPAN_DTYPE
from meshprof.rundir import LoadedRun
from meshprof.rundir.segments import join_rows


@dataclass(frozen=True, slots=True)
class RankMeasures:
    """Every rank's measures (rows: ``ranks`` in the order given)."""

    steps: tuple[int, ...]
    """Every step number any rank recorded, ascending (the columns of the [rank, step]
    arrays)."""
    common: tuple[int, ...]
    """The steps every rank recorded."""
    step_ns: np.ndarray
    """float [rank, step]: the step span's duration (ns); NaN where the rank has none."""
    comm_ns: np.ndarray
    """float [rank, step]: communication inside the step (ns; scaled up by 1 / the sample
    fraction when sampled, at most the step)."""
    wait_ns: np.ndarray
    """float [rank, step]: the wait of the rank's collective members that arrived in the step
    (ns; / the sample fraction when sampled)."""
    phase_names: tuple[str, ...]
    """Phase names, in order of first appearance (ranks in order)."""
    phase_ns: np.ndarray
    """float [rank, phase]: the median over the common steps (all steps when none is common)
    of the phase's compute in the step (ns); NaN where the rank has none."""


def _scaled(covered: np.ndarray, window: np.ndarray, fraction: float) -> np.ndarray:
    """Communication time in windows measured on a sample of the collectives (``fraction`` < 1):
    scaled up by 1 / fraction (the expected time of the whole run when collectives do not
    overlap), at most the window; unchanged for the whole run."""
    if fraction >= 1:
        return covered
    return np.minimum(covered / fraction, window)


class _Axis:
    """Per rank row i, times in [lo[i], hi[i]] moved onto the stretch [base[i], base[i] +
    hi[i] − lo[i]] of one axis; consecutive stretches two apart (so that no union or
    ``searchsorted`` crosses ranks)."""

    def __init__(self, lo: np.ndarray, hi: np.ndarray) -> None:
        self.lo, self.hi = lo, hi
        span = hi - lo + 3
        self.base = np.zeros(len(lo), dtype=np.int64)
        if len(lo) > 1:
            np.cumsum(span[:-1], out=self.base[1:])

    def key(self, ri: np.ndarray, t: np.ndarray, slack: int = 0) -> np.ndarray:
        """Times ``t`` of rank rows ``ri``, clamped into [lo, hi + slack], on the axis."""
        lo = self.lo[ri]
        return np.minimum(np.maximum(t, lo), self.hi[ri] + slack) - lo + self.base[ri]


def _extent(ri: np.ndarray, lo_t: np.ndarray, hi_t: np.ndarray, n: int) -> _Axis:
    """The axis of ``n`` rank rows from times [lo_t, hi_t] of rows ``ri`` (sorted by ri);
    a rank row without times gets the empty stretch [0, 0]."""
    lo = np.zeros(n, dtype=np.int64)
    hi = np.zeros(n, dtype=np.int64)
    if len(ri):
        cut = np.flatnonzero(np.r_[True, ri[1:] != ri[:-1]])
        lo[ri[cut]] = np.minimum.reduceat(lo_t, cut)
        hi[ri[cut]] = np.maximum.reduceat(hi_t, cut)
    return _Axis(lo, hi)


def measure_ranks(
    run: LoadedRun,
    table: EventTable,
    clock: ClockAlignment,
    match: CollectiveMatch,
    ranks: Sequence[int],
) -> RankMeasures:
    """The measures of ``ranks`` (loaded ranks, in the order of the rows returned)."""
    n = len(ranks)
    f = table.sample_fraction
    # every rank's spans, with its row and its names' global codes
    parts: list[np.ndarray] = []
    counts = np.zeros(n, dtype=np.int64)
    name_sets: dict[tuple[str, ...], int] = {}
    set_of = np.zeros(n, dtype=np.int64)
    for i, r in enumerate(ranks):
        rd = run.ranks[r]
        sp = rd.spans
        if len(sp):
            parts.append(sp)
            counts[i] = len(sp)
        set_of[i] = name_sets.setdefault(tuple(rd.span_names), len(name_sets))
    spans = join_rows(parts, SPAN_DTYPE)
    del parts
    s_ri = np.repeat(np.arange(n, dtype=np.int64), counts)
    kind = spans["kind"]
    start = spans["start_ns"].astype(np.int64)
    dur = spans["duration_ns"].astype(np.int64)
    step_of = spans["step"].astype(np.int64)

    # the steps, and those every rank recorded
    is_step = kind == 0
    st_ri, st_step = s_ri[is_step], step_of[is_step]
    steps_arr = np.unique(st_step)
    st_col = np.searchsorted(steps_arr, st_step)
    pairs = np.unique(st_ri * max(len(steps_arr), 1) + st_col)
    per_step = np.bincount(pairs % max(len(steps_arr), 1), minlength=len(steps_arr))
    common_arr = steps_arr[per_step == n] if n else steps_arr[:0]

    # each rank's collectives, unioned on one axis
    lut = np.full(max(int(table.rank.max(initial=0)), max(ranks, default=0)) + 1, -1, np.int64)
    lut[np.asarray(ranks, dtype=np.int64)] = np.arange(n, dtype=np.int64)
    t_ri = lut[table.rank]
    keep = np.flatnonzero(t_ri >= 0)  # (table rows are in rank order: so are these)
    t_ri = t_ri[keep]
    e_s = table.start_ns[keep].astype(np.int64)
    e_e = e_s + table.duration_ns[keep].astype(np.int64)
    ev_axis = _extent(t_ri, e_s, e_e, n)
    us, ue = intervals.union(ev_axis.key(t_ri, e_s), ev_axis.key(t_ri, e_e))
    del e_s, e_e

    def comm_in(ri: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        got = intervals.covered(us, ue, ev_axis.key(ri, a), ev_axis.key(ri, b))
        return _scaled(got, b - a, f)

    shape = (n, len(steps_arr))
    step_ns, comm_ns, wait_ns = (np.full(shape, np.nan) for _ in range(3))
    a, b = start[is_step], start[is_step] + dur[is_step]
    step_ns[st_ri, st_col] = spans["duration_ns"][is_step]
    comm_ns[st_ri, st_col] = comm_in(st_ri, a, b)

    # the waits of each rank's members, by arrival on its own clock, on a second axis
    m_row = match.member_row.astype(np.int64)
    m_ri = lut[table.rank[m_row]]
    ok = m_ri >= 0
    offsets = clock.offsets()
    off = np.asarray([offsets.get(int(r), 0) for r in ranks], dtype=np.int64)
    m_ri = m_ri[ok]
    arr = match.member_arrival_ns[ok].astype(np.int64) - off[m_ri]
    w = match.member_wait_ns[ok].astype(np.int64)
    by = stable_argsort(m_ri)
    m_ri, arr, w = m_ri[by], arr[by], w[by]
    ar_axis = _extent(m_ri, arr, arr, n)
    key = ar_axis.key(m_ri, arr)
    o = stable_argsort(key)  # (the sums below do not depend on the order of ties)
    key = key[o]
    cw = np.r_[np.int64(0), np.cumsum(w[o])]
    del arr, w, o, by
    hi_a = np.searchsorted(key, ar_axis.key(st_ri, b, slack=1), side="left")
    lo_a = np.searchsorted(key, ar_axis.key(st_ri, a, slack=1), side="left")
    waited = cw[hi_a] - cw[lo_a]
    wait_ns[st_ri, st_col] = waited / f if f < 1 else waited

    # the phases' compute, per (rank, phase, step), then its median per (rank, phase)
    is_ph = kind == 1
    p_ri = s_ri[is_ph]
    pa, pb = start[is_ph], start[is_ph] + dur[is_ph]
    pc = spans["duration_ns"][is_ph] - comm_in(p_ri, pa, pb)
    names, p_name = _global_names(spans["name"][is_ph], set_of[p_ri], name_sets)
    seen, first = np.unique(p_name, return_index=True)
    order = seen[np.argsort(first, kind="stable")]
    phase_names = tuple(names[j] for j in order.tolist())
    col = np.full(len(names), -1, dtype=np.int64)
    col[order] = np.arange(len(order), dtype=np.int64)
    n_ph = len(phase_names)
    phase_ns = np.full((n, n_ph), np.nan)
    if len(p_name):
        p_col = col[p_name]
        ph_steps, p_step = np.unique(step_of[is_ph], return_inverse=True)
        n_steps = len(ph_steps)
        cell = (p_ri * n_ph + p_col) * n_steps + p_step.ravel()
        cells, inv = np.unique(cell, return_inverse=True)
        # (bincount adds each cell's values in the spans' order, as the per-rank loop did)
        sums = np.bincount(inv.ravel(), weights=pc.astype(np.float64))
        c_step = ph_steps[cells % n_steps]
        use = np.isin(c_step, common_arr) if len(common_arr) else np.ones(len(cells), bool)
        code = cells[use] // n_steps
        phase_ns = grouped_median(sums[use], code, n * n_ph).reshape(n, n_ph)
    return RankMeasures(
        steps=tuple(steps_arr.tolist()),
        common=tuple(common_arr.tolist()),
        step_ns=step_ns,
        comm_ns=comm_ns,
        wait_ns=wait_ns,
        phase_names=phase_names,
        phase_ns=phase_ns,
    )


def _global_names(
    local: np.ndarray, name_set: np.ndarray, name_sets: dict[tuple[str, ...], int]
) -> tuple[list[str], np.ndarray]:
    """The names of spans given as (local code, its rank's name list): the distinct names and
    each span's index into them (a code beyond its rank's list is named ``#code``)."""
    names: list[str] = []
    index: dict[str, int] = {}

    def code_of(name: str) -> int:
        got = index.get(name)
        if got is None:
            got = index[name] = len(names)
            names.append(name)
        return got

    out = np.zeros(len(local), dtype=np.int64)
    local = local.astype(np.int64)
    for tup, k in name_sets.items():
        mine = np.flatnonzero(name_set == k)
        if not len(mine):
            continue
        codes = local[mine]
        top = max(int(codes.max(initial=0)) + 1, len(tup))
        lut = np.asarray(
            [code_of(tup[c] if c < len(tup) else f"#{c}") for c in range(top)], dtype=np.int64
        )
        out[mine] = lut[codes]
    return names, out


__all__ = ["RankMeasures", "measure_ranks"]

"""Each rank's time in each serving step: compute, collectives split into transfer and waiting
for the last arrival, and who arrived last.

Per rank and step (aligned clock, ns): *step* is the rank's step span; *comm* the sum of its
collectives' durations (issue to completion) in the step; *wait* the part of them spent waiting
for the collective's last member to arrive (:mod:`meshprof.analyze.run.events.match`); *transfer* =
comm − wait; *compute* = step − comm (the forward's arithmetic and everything else that is not
a collective). A rank's *excess* in a step is its compute minus the median compute of its peers
(the other ranks of its pipeline stage that ran the step). The *last arrival* of a collective of
two members or more is the member that issued it last; the wait it *caused* is the sum of the
other members' waits there.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from meshprof.analyze.serve.step_members import StepMembers
from meshprof.analyze.serve.types import DimShare, RankStepBreakdown
from meshprof.events import STEP_KINDS


@dataclass(frozen=True, slots=True)
class StepMatrix:
    """Per (rank, serving step) figures, NaN where the rank has no such step (ns)."""

    ranks: tuple[int, ...]
    """The rows' ranks."""
    step: np.ndarray
    """float64 [rank, step]: the step span."""
    comm: np.ndarray
    """float64 [rank, step]: collective time."""
    wait: np.ndarray
    """float64 [rank, step]: waiting for the last arrival."""
    dim_comm: np.ndarray
    """float64 [dim, rank, step]: collective time per dimension."""
    dim_wait: np.ndarray
    """float64 [dim, rank, step]: waiting per dimension."""
    last: np.ndarray
    """int64 [rank, step]: collectives the rank arrived last at."""
    caused: np.ndarray
    """float64 [rank, step]: the wait it caused there."""
    excess: np.ndarray
    """float64 [rank, step]: compute over the peers' median (NaN without a peer)."""

    @property
    def compute(self) -> np.ndarray:
        return self.step - self.comm


def step_matrix(sm: StepMembers) -> StepMatrix:
    """The figures of the module docstring for every rank and serving step."""
    ranks = tuple(sorted(set(sm.span_rank.tolist())))
    ri = {r: i for i, r in enumerate(ranks)}
    nr, ns, nd = len(ranks), len(sm.numbers), max(len(sm.dims), 1)
    step = np.full((nr, ns), np.nan)
    if len(sm.span_rank):
        rix = np.asarray([ri[r] for r in sm.span_rank.tolist()], dtype=np.int64)
        step[rix, sm.span_step] = (sm.span_end - sm.span_start).astype(np.float64)
    known = np.asarray([r in ri for r in sm.m_rank.tolist()], dtype=bool)
    mr = np.asarray([ri.get(r, 0) for r in sm.m_rank.tolist()], dtype=np.int64)[known]
    ms, md = sm.m_step[known], sm.m_dim[known]
    dur = (sm.m_end - sm.m_arrival)[known].astype(np.float64)
    wt = sm.m_wait[known].astype(np.float64)
    flat = mr * ns + ms
    comm = np.bincount(flat, weights=dur, minlength=nr * ns).reshape(nr, ns)
    wait = np.bincount(flat, weights=wt, minlength=nr * ns).reshape(nr, ns)
    flat3 = (md * nr + mr) * ns + ms
    dim_comm = np.bincount(flat3, weights=dur, minlength=nd * nr * ns).reshape(nd, nr, ns)
    dim_wait = np.bincount(flat3, weights=wt, minlength=nd * nr * ns).reshape(nd, nr, ns)
    have = np.isfinite(step)
    comm[~have] = np.nan
    wait[~have] = np.nan
    # last arrivals: per item, its last member and the other members' waits
    items = sm.m_item[known]
    caused_by_item = np.bincount(items, weights=wt, minlength=len(sm.item_last_rank))
    last_rank = sm.item_last_rank
    first_member = np.unique(items, return_index=True)[1]
    it = items[first_member]
    lr = last_rank[it]
    ok = np.asarray([r in ri for r in lr.tolist()], dtype=bool) & (lr >= 0)
    li = np.asarray([ri.get(r, 0) for r in lr.tolist()], dtype=np.int64)[ok]
    lstep = ms[first_member][ok]
    last = np.bincount(li * ns + lstep, minlength=nr * ns).reshape(nr, ns).astype(np.int64)
    caused = np.bincount(
        li * ns + lstep, weights=caused_by_item[it[ok]], minlength=nr * ns
    ).reshape(nr, ns)
    compute = step - comm
    excess = np.full((nr, ns), np.nan)
    stages: dict[int, list[int]] = {}
    for r in ranks:
        stages.setdefault(sm.stage.get(r, 0), []).append(ri[r])
    for rows in stages.values():
        if len(rows) < 2:
            continue
        block = compute[rows]
        for k, row in enumerate(rows):
            excess[row] = compute[row] - _nanmedian_rows(np.delete(block, k, axis=0))
    return StepMatrix(ranks, step, comm, wait, dim_comm, dim_wait, last, caused, excess)


def _nanmedian_rows(x: np.ndarray) -> np.ndarray:
    """The median of each column over its finite rows (NaN where none is), quietly."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.asarray(np.nanmedian(x, axis=0), dtype=np.float64)


def _mean(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(x.mean()) if len(x) else float("nan")


def _median(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(np.median(x)) if len(x) else float("nan")


def rank_breakdowns(sm: StepMembers, mat: StepMatrix) -> tuple[RankStepBreakdown, ...]:
    """Every rank's means per step, by kind."""
    out = []
    for code, name in enumerate(STEP_KINDS):
        cols = np.flatnonzero(sm.kind == code)
        if not len(cols):
            continue
        for i, r in enumerate(mat.ranks):
            st = mat.step[i, cols]
            have = np.isfinite(st)
            if not have.any():
                continue
            c = cols[have]
            mean_step = _mean(mat.step[i, c])
            dims = []
            for d, dim in enumerate(sm.dims):
                dc = mat.dim_comm[d, i, c]
                if not (dc > 0).any():
                    continue
                dw = mat.dim_wait[d, i, c]
                comm, wait = _mean(dc), _mean(dw)
                dims.append(
                    DimShare(dim, comm, comm - wait, wait, comm / mean_step, wait / mean_step)
                )
            comm, wait = _mean(mat.comm[i, c]), _mean(mat.wait[i, c])
            out.append(
                RankStepBreakdown(
                    rank=r,
                    kind=name,
                    steps=int(have.sum()),
                    step_ns=mean_step,
                    compute_ns=mean_step - comm,
                    transfer_ns=comm - wait,
                    wait_ns=wait,
                    last_arrivals=int(mat.last[i, c].sum()),
                    caused_wait_ns=_mean(mat.caused[i, c]),
                    excess_ns=_median(mat.excess[i, c]),
                    dims=tuple(dims),
                )
            )
    return tuple(out)


def dim_shares(sm: StepMembers, mat: StepMatrix) -> tuple[tuple[str, tuple[DimShare, ...]], ...]:
    """Per kind, each dimension's collectives: means over the ranks and steps."""
    out = []
    for code, name in enumerate(STEP_KINDS):
        cols = np.flatnonzero(sm.kind == code)
        if not len(cols):
            continue
        st = mat.step[:, cols]
        mean_step = _mean(st)
        shares = []
        for d, dim in enumerate(sm.dims):
            dc = mat.dim_comm[d][:, cols]
            dc = np.where(np.isfinite(st), dc, np.nan)
            if not (np.nan_to_num(dc) > 0).any():
                continue
            dw = np.where(np.isfinite(st), mat.dim_wait[d][:, cols], np.nan)
            comm, wait = _mean(dc), _mean(dw)
            shares.append(
                DimShare(dim, comm, comm - wait, wait, comm / mean_step, wait / mean_step)
            )
        out.append((name, tuple(shares)))
    return tuple(out)


__all__ = ["StepMatrix", "dim_shares", "rank_breakdowns", "step_matrix"]

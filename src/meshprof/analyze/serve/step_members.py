"""Every rank's part in the serving steps: its step spans and the collectives it issued in them,
on the aligned clock, each collective matched across its members.

A rank's collective belongs to the step (the rank's own step span, by step number) it was
issued in. The serving steps are the serving rank's steps of a kind
(:mod:`meshprof.analyze.serve.step_kinds`); every rank's step of the same number is the same
forward (each rank runs the serving loop's forwards in the same order). A matched
point-to-point pair (a pipeline send and its recv) is an item of two members like a collective
of two, without a wait (no member waits for a last arrival in the match).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshprof.analyze.run.events.clock import ClockAlignment
from meshprof.analyze.run.events.match import CollectiveMatch
from meshprof.analyze.run.events.table import EventTable
from meshprof.analyze.run.events.window import step_spans
from meshprof.analyze.serve.step_kinds import ServingSteps
from meshprof.rundir import LoadedRun


@dataclass(frozen=True, slots=True)
class StepMembers:
    """The ranks' steps and collectives in the serving steps (aligned clock, ns)."""

    numbers: np.ndarray
    """int64: the serving steps' numbers, ascending."""
    kind: np.ndarray
    """int8 per number: its kind (:data:`~meshprof.events.STEP_KINDS` index)."""
    span_rank: np.ndarray
    """int64 per (rank, step) span."""
    span_step: np.ndarray
    """int64 per span: index into :attr:`numbers`."""
    span_start: np.ndarray
    """int64 per span: aligned start."""
    span_end: np.ndarray
    """int64 per span: aligned end."""
    m_rank: np.ndarray
    """int64 per member (one rank's part in one item)."""
    m_step: np.ndarray
    """int64 per member: index into :attr:`numbers`."""
    m_item: np.ndarray
    """int64 per member: its item (a matched collective, or a send/recv pair)."""
    m_arrival: np.ndarray
    """int64 per member: aligned issue time."""
    m_end: np.ndarray
    """int64 per member: aligned completion."""
    m_wait: np.ndarray
    """int64 per member: time waited for the item's last arrival (0 for send/recv)."""
    m_dim: np.ndarray
    """int64 per member: index into :attr:`dims`."""
    item_last_rank: np.ndarray
    """int64 per item: the member that arrived last (-1 for send/recv and single members)."""
    dims: tuple[str, ...]
    """The dimensions of the collectives' groups."""
    stage: dict[int, int]
    """rank → its pipeline stage (0 without pipelining): peers share a stage."""

    def step_of(self, number: int) -> int:
        """Index of step ``number`` in :attr:`numbers` (-1: not a serving step)."""
        i = int(np.searchsorted(self.numbers, number))
        return i if i < len(self.numbers) and self.numbers[i] == number else -1


def step_members(
    run: LoadedRun,
    steps: ServingSteps,
    table: EventTable,
    clock: ClockAlignment,
    match: CollectiveMatch,
) -> StepMembers:
    """The members of the serving steps (see the module docstring)."""
    keep = steps.kind >= 0
    numbers, first = np.unique(steps.step[keep], return_index=True)
    kind = steps.kind[keep][first].astype(np.int8)
    offsets = clock.offsets()
    n_num = len(numbers)
    sr, ss, s0, s1 = [], [], [], []
    ev_step = np.full(len(table), -1, dtype=np.int64)
    bounds = np.searchsorted(table.rank, sorted(run.ranks), side="left")
    ends = np.searchsorted(table.rank, sorted(run.ranks), side="right")
    for r, lo, hi in zip(sorted(run.ranks), bounds.tolist(), ends.tolist(), strict=True):
        st = step_spans(run.ranks[r])
        if not len(st) or not n_num:
            continue
        idx = np.searchsorted(numbers, st["step"])
        idx = np.minimum(idx, n_num - 1)
        ok = numbers[idx] == st["step"]
        st, idx = st[ok], idx[ok]
        if not len(st):
            continue
        off = int(offsets.get(r, 0))
        start = st["start_ns"].astype(np.int64)
        end = start + st["duration_ns"].astype(np.int64)
        sr.append(np.full(len(st), r, dtype=np.int64))
        ss.append(idx.astype(np.int64))
        s0.append(start + off)
        s1.append(end + off)
        if hi > lo:
            order = np.argsort(start, kind="stable")
            t = table.start_ns[lo:hi].astype(np.int64)
            j = np.searchsorted(start[order], t, side="right") - 1
            inside = j >= 0
            jj = order[np.maximum(j, 0)]
            inside &= t < end[jj]
            ev_step[lo:hi] = np.where(inside, idx[jj], -1)
    dims = tuple(sorted({g.dimension for g in table.groups}))
    dim_of_gid = np.asarray([dims.index(g.dimension) for g in table.groups] or [0], np.int64)
    # collectives: their members in serving steps
    rows = match.member_row.astype(np.int64)
    mstep = ev_step[rows]
    sel = mstep >= 0
    rows = rows[sel]
    m_item = match.member_coll.astype(np.int64)[sel]
    m_rank = table.rank[rows].astype(np.int64)
    m_arr = match.member_arrival_ns[sel].astype(np.int64)
    m_end = m_arr + table.duration_ns[rows].astype(np.int64)
    m_wait = match.member_wait_ns[sel].astype(np.int64)
    m_dim = dim_of_gid[table.gid[rows].astype(np.int64)]
    item_last = np.where(match.present >= 2, match.last_rank, -1).astype(np.int64)
    # send/recv pairs: items after the collectives
    n_coll = len(match)
    pr = np.concatenate([match.p2p_send_row, match.p2p_recv_row]).astype(np.int64)
    pitem = np.concatenate([np.arange(len(match.p2p_send_row))] * 2).astype(np.int64) + n_coll
    pstep = ev_step[pr] if len(pr) else np.zeros(0, np.int64)
    psel = pstep >= 0
    # both ends must be in serving steps for the pair to be an item
    if len(pr):
        both = np.zeros(len(match.p2p_send_row), dtype=bool)
        half = len(match.p2p_send_row)
        both = psel[:half] & psel[half:]
        psel = np.concatenate([both, both])
    pr, pitem = pr[psel], pitem[psel]
    p_rank = table.rank[pr].astype(np.int64)
    p_off = np.asarray([offsets.get(int(r), 0) for r in p_rank.tolist()], dtype=np.int64)
    p_arr = table.start_ns[pr].astype(np.int64) + p_off
    p_dim = dim_of_gid[table.gid[pr].astype(np.int64)] if len(pr) else np.zeros(0, np.int64)
    item_last = np.concatenate([item_last, np.full(len(match.p2p_send_row), -1, np.int64)])
    lay = run.layout()
    stage = {}
    for r in run.ranks:
        stage[r] = lay.coords(r)[2] if lay is not None and r < lay.world_size else 0
    cat = np.concatenate
    return StepMembers(
        numbers=numbers.astype(np.int64),
        kind=kind,
        span_rank=cat(sr) if sr else np.zeros(0, np.int64),
        span_step=cat(ss) if ss else np.zeros(0, np.int64),
        span_start=cat(s0) if s0 else np.zeros(0, np.int64),
        span_end=cat(s1) if s1 else np.zeros(0, np.int64),
        m_rank=cat([m_rank, p_rank]),
        m_step=cat([mstep[sel], ev_step[pr]]),
        m_item=cat([m_item, pitem]),
        m_arrival=cat([m_arr, p_arr]),
        m_end=cat([m_end, p_arr + table.duration_ns[pr].astype(np.int64)]),
        m_wait=cat([m_wait, np.zeros(len(pr), np.int64)]),
        m_dim=cat([m_dim, p_dim]),
        item_last_rank=item_last,
        dims=dims,
        stage=stage,
    )


__all__ = ["StepMembers", "step_members"]

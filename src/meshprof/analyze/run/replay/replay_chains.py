"""The what-if's chains (:mod:`meshprof.analyze.run.replay.replay`): each rank's events inside each
replayed step span, in issue order, and a code per chain for the program it ran (its pipeline
stage and sequence of (op, dimension)), so that chains of one program can be compared."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from meshprof.analyze.compute.sorting import RowsByKey, stable_argsort, unique_inverse
from meshprof.analyze.run.events.table import EventTable
from meshprof.rundir import LoadedRun


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


def pipeline_stages(table: EventTable, n: int) -> np.ndarray:
    """Each rank's pipeline stage: its position in its pipeline-parallel group ("pp"
    dimension; 0 for ranks in none)."""
    stage = np.zeros(max(n, 1), dtype=np.int64)
    for gr in table.groups:
        if gr.dimension == "pp":
            for i, r in enumerate(gr.ranks):
                if 0 <= r < n:
                    stage[r] = i
    return stage


def chain_signatures(ch: Chains, op: np.ndarray, dimc: np.ndarray, stage: np.ndarray) -> np.ndarray:
    """Per chain, a code (int64, dense) equal for chains of the same pipeline stage that
    issued the same sequence of (op, dimension)."""
    n, nch = len(ch.chain), len(ch.c_rank)
    first = np.flatnonzero(np.r_[True, ch.chain[1:] != ch.chain[:-1]]) if n else ch.chain
    c_first = np.zeros(nch, dtype=np.int64)
    c_len = np.zeros(nch, dtype=np.int64)
    c_first[ch.chain[first]] = first
    c_len[ch.chain[first]] = np.diff(np.r_[first, n])
    pos = np.arange(n) - c_first[ch.chain]
    h = _mix((op.astype(np.int64) << 40) ^ (dimc.astype(np.int64) << 32) ^ pos)
    has = np.flatnonzero(c_len > 0)
    sig = np.zeros(nch, dtype=np.uint64)
    sig[has] = np.add.reduceat(h, c_first[has])
    sig = _mix(sig ^ c_len.astype(np.uint64))
    sig = _mix(sig ^ stage[ch.c_rank].astype(np.uint64))
    return unique_inverse(sig.view(np.int64))[1]


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 of each value (uint64; wraps)."""
    z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))

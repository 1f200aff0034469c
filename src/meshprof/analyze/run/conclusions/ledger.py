"""The time ledger of the run: every rank's analysed wall time split into causes
(:class:`meshprof.records.ledger.TimeCause`), and the job's (their sum: GPU-time), each summing
to its wall time exactly.

A rank's own ledger comes from its step analysis (:mod:`meshprof.analyze.steps.ledger`). What one
rank cannot see is *why* it was blocked in a collective; across ranks it can be said: the part of
its waiting in the collectives of its analysed steps that it spent waiting for a rank that
arrived later (its wait, :attr:`meshprof.analyze.run.stragglers.stragglers.StragglerReport.wait_ns`) is
``straggler_wait``, taken out of its exposed data-parallel, tensor-parallel and other
communication in proportion (at most what they hold: a wait hidden behind compute costs nothing;
a pipeline stage's waiting is its bubble, counted there).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from meshprof.analyze.run.stragglers.stragglers import StragglerReport
from meshprof.analyze.steps.ledger import CAUSES
from meshprof.analyze.steps.types import StepAnalysis
from meshprof.records.ledger import LedgerEntry, RankLedger, TimeCause

CARVED = (TimeCause.EXPOSED_DP, TimeCause.EXPOSED_TP, TimeCause.EXPOSED_OTHER)
"""The exposed communication the straggler wait is taken out of."""


@dataclass(frozen=True, slots=True)
class Ledger:
    """The run's time ledger over the analysed steps."""

    job: LedgerEntry
    """Every rank's ledger summed (the wall time is GPU-time: ranks × time)."""
    ranks: tuple[RankLedger, ...]
    """One per analysed rank, rank order."""
    steps: int
    """Rank-steps analysed: the ranks' analysed steps summed (the job's wall time / this is the
    mean step of a rank)."""

    def check(self) -> None:
        """Raise AssertionError unless every ledger's parts are ≥ 0 and sum to its wall time,
        and the job's are the ranks' sums."""
        entries: list[RankLedger | LedgerEntry] = [*self.ranks, self.job]
        for e in entries:
            if min(e.parts.values(), default=0) < 0 or sum(e.parts.values()) != e.wall_ns:
                raise AssertionError(f"ledger does not add up: {e}")
        if self.job.wall_ns != sum(r.wall_ns for r in self.ranks):
            raise AssertionError("the job's wall time is not the ranks' sum")


@dataclass(frozen=True, slots=True)
class _WaitIndex:
    """Where a rank's row and a step's column are in the straggler report's wait matrix (built
    once per run: a lookup per rank in the report's rank tuple was O(ranks) each, 105 s of CPU
    at 100,000 ranks)."""

    row: dict[int, int]
    col: dict[int, int]

    @classmethod
    def of(cls, s: StragglerReport) -> _WaitIndex:
        return cls(
            {int(r): i for i, r in enumerate(s.ranks)}, {int(st): i for i, st in enumerate(s.steps)}
        )


def _waited(s: StragglerReport, rank: int, steps: Sequence[int], at: _WaitIndex) -> int:
    """The rank's waiting in the collectives of ``steps`` (ns)."""
    row = at.row.get(rank)
    if row is None or not at.col:
        return 0
    cols = [at.col[st] for st in steps if st in at.col]
    w = s.wait_ns[row, cols]
    return int(np.nansum(w)) if len(w) else 0


def rank_ledger(a: StepAnalysis, s: StragglerReport, at: _WaitIndex | None = None) -> RankLedger:
    """One rank's ledger, its straggler wait carved out of its exposed communication."""
    parts = {k: int(a.ledger.get(k, 0)) for k in CAUSES}
    pool = sum(parts[c] for c in CARVED)
    at = at if at is not None else _WaitIndex.of(s)
    wait = min(_waited(s, a.rank, [r.step for r in a.per_step], at), pool)
    if wait > 0:
        taken = 0
        for i, c in enumerate(CARVED):
            part = wait - taken if i == len(CARVED) - 1 else wait * parts[c] // pool
            part = min(part, parts[c])
            parts[c] -= part
            taken += part
        parts[TimeCause.STRAGGLER_WAIT] += taken
    return RankLedger(a.rank, a.steps, a.ledger_wall_ns, parts)


def run_ledger(analyses: Sequence[StepAnalysis], stragglers: StragglerReport) -> Ledger:
    """The ledger of every analysed rank and of the job."""
    at = _WaitIndex.of(stragglers)
    ranks = tuple(rank_ledger(a, stragglers, at) for a in sorted(analyses, key=lambda a: a.rank))
    job = LedgerEntry(
        wall_ns=sum(r.wall_ns for r in ranks),
        parts={k: sum(r.parts[k] for r in ranks) for k in CAUSES},
    )
    ledger = Ledger(job, ranks, sum(r.steps for r in ranks))
    ledger.check()
    return ledger


__all__ = ["Ledger", "rank_ledger", "run_ledger"]

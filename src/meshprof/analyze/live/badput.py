"""The job's lost time as counters: each rank's cumulative time ledger
(:attr:`RankLive.ledger_ns`, causes :class:`~meshprof.records.ledger.TimeCause`) with its
straggler wait carved out across ranks, for ``meshprof_badput_seconds_total{cause}``.

A rank alone cannot tell whether its exposed communication was the transfer or the wait for a
late peer; across the ranks' records it can be estimated
(:func:`~meshprof.analyze.live.snapshot.wait_estimates`: the slowest peer's compute − its own,
per step). Each time the ledger grows, that share of the growth of its exposed data-parallel,
tensor-parallel and other communication (the report's carving, :mod:`meshprof.analyze.run.conclusions.ledger`)
moves to ``straggler_wait``, at the share of the moment. So every part only grows, and the parts
still sum to the ledger's wall time: causes + compute = wall, per rank, exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meshprof.records.ledger import TimeCause
from meshprof.records.live import RankLive

CARVED = (TimeCause.EXPOSED_DP, TimeCause.EXPOSED_TP, TimeCause.EXPOSED_OTHER)
"""The exposed communication a straggler wait is taken out of (as in the report)."""


@dataclass(slots=True)
class _Book:
    started_ns: int
    seen: dict[str, int] = field(default_factory=dict)
    """The record's carved causes when last folded (ns)."""
    waited: dict[str, int] = field(default_factory=dict)
    """What moved from each carved cause to the straggler wait so far (ns)."""


class BadputBook:
    """Cumulative per-rank ledgers with the straggler wait carved out (:meth:`update`). Keep one
    per endpoint: the carving is folded scrape by scrape (a new book starts from the share of
    its first scrape; Prometheus sees a counter reset)."""

    def __init__(self) -> None:
        self._books: dict[int, _Book] = {}

    def update(self, rec: RankLive, wait_ns: int, exposed_ns: int) -> dict[str, int]:
        """The rank's ledger now (cause → ns, summing to ``rec.ledger_wall_ns``), with the
        share ``wait_ns / exposed_ns`` (its wait and its carvable exposed communication per
        step, recent) of its carved causes' growth since the last call moved to
        ``straggler_wait``. Empty before the rank's first step."""
        if not rec.ledger_ns:
            return {}
        b = self._books.get(rec.rank)
        if b is None or b.started_ns != rec.started_ns:  # a new rank process: start over
            b = self._books[rec.rank] = _Book(rec.started_ns)
        share = min(wait_ns / exposed_ns, 1.0) if exposed_ns > 0 and wait_ns > 0 else 0.0
        out = dict(rec.ledger_ns)
        moved = 0
        for c in CARVED:
            now = int(rec.ledger_ns.get(c, 0))
            grew = max(now - b.seen.get(c, 0), 0)
            b.seen[c] = max(now, b.seen.get(c, 0))
            w = b.waited[c] = min(b.waited.get(c, 0) + int(grew * share), now)
            out[c] = now - w
            moved += w
        out[TimeCause.STRAGGLER_WAIT] = int(rec.ledger_ns.get(TimeCause.STRAGGLER_WAIT, 0)) + moved
        return out


__all__ = ["CARVED", "BadputBook"]

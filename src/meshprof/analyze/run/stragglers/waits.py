"""Who waits for whom: the ranks the others wait for in the collectives, and where.

In a collective, every member that arrived before the last one waits for it (its *wait*,
:attr:`meshprof.analyze.run.events.match.CollectiveMatch.member_wait_ns`, is at most the skew between
its arrival and the last arrival). That wait is *caused* by the rank that arrived last. Summed
over the run, per causing rank, it says which ranks hold the others up, in which group, and how
much of the run's total waiting is theirs — the question "which rank is everybody waiting for",
asked of every collective rather than of the step time.

Times in ns (aligned clock); shares as fractions of the run's total wait.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshprof.analyze.run.events.match import CollectiveMatch
from meshprof.analyze.run.events.table import EventTable

TOP_RANKS = 8
"""Causes listed at most (the largest)."""


@dataclass(frozen=True, slots=True)
class WaitCause:
    """A rank the others waited for."""

    rank: int
    """The rank that arrived last."""
    caused_ns: int
    """Time the other members waited for it, summed over the collectives it arrived last at."""
    share: float
    """caused_ns / the run's total wait (fraction)."""
    collectives: int
    """Collectives (≥ 2 members present) it arrived last at and someone waited for it."""
    group: str
    """The group where it caused the most wait (its description, else its name)."""
    group_ns: int
    """The wait it caused there."""


def wait_causes(
    table: EventTable, match: CollectiveMatch, top: int = TOP_RANKS
) -> tuple[WaitCause, ...]:
    """The ranks that caused the most wait, largest first (at most ``top``)."""
    if not len(match.member_wait_ns):
        return ()
    wait = match.member_wait_ns.astype(np.int64)
    total = int(wait.sum())
    if total <= 0:
        return ()
    # each member's wait is charged to its collective's last rank (the one it waited for)
    per_coll = np.bincount(match.member_coll, weights=wait, minlength=len(match)).astype(np.int64)
    waited = per_coll > 0
    causes = match.last_rank[waited].astype(np.int64)
    caused = per_coll[waited]
    gids = match.gid[waited].astype(np.int64)
    by_rank = np.bincount(causes, weights=caused).astype(np.int64)
    counts = np.bincount(causes)
    n_groups = len(table.groups)
    order = [int(r) for r in np.argsort(-by_rank, kind="stable") if by_rank[r] > 0][:top]
    out = []
    for r in order:
        # (per named rank, not a ranks × groups matrix: 100,000 ranks × 37,533 groups is 28 GiB)
        mine = causes == r
        per_group = np.bincount(gids[mine], weights=caused[mine]).astype(np.int64)
        g = int(np.argmax(per_group))
        ref = table.groups[g] if g < n_groups else None
        out.append(
            WaitCause(
                rank=r,
                caused_ns=int(by_rank[r]),
                share=float(by_rank[r] / total),
                collectives=int(counts[r]),
                group=(ref.desc or ref.name) if ref is not None else "",
                group_ns=int(per_group[g]),
            )
        )
    return tuple(out)


__all__ = ["TOP_RANKS", "WaitCause", "wait_causes"]

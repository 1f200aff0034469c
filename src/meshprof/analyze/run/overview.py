"""The run at a glance, whatever its size: each per-rank figure's spread across ranks
(min / p50 / p95 / max, and which rank is at the extremes), the outlier ranks, and the process
groups of each kind (dimension and description) taken together — what the console shows instead
of one row per rank and per group.

Percentiles are numpy's linear ones over the ranks that have the figure (NaN left out).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from meshprof.analyze.run.types import GroupRow, RankRow

TOP_OUTLIERS = 5
"""Outlier ranks listed at most."""


@dataclass(frozen=True, slots=True)
class Spread:
    """One per-rank figure across ranks."""

    figure: str
    """The :class:`~meshprof.analyze.run.types.RankRow` field (``step_ns``, ``comm_share``, ...)."""
    min: float
    """Smallest over ranks (NaN: no rank has it)."""
    p50: float
    """Median over ranks."""
    p95: float
    """95th percentile over ranks."""
    max: float
    """Largest over ranks."""
    min_rank: int
    """The rank with the smallest (-1: none)."""
    max_rank: int
    """The rank with the largest (-1: none)."""


@dataclass(frozen=True, slots=True)
class Outlier:
    """A rank far from the others."""

    rank: int
    """Global rank."""
    score: float
    """Straggler score: its compute / the median rank's − 1 (fraction)."""
    last_share: float
    """Share of its collectives it arrived at last."""
    step_ns: float
    """Its mean step time (ns)."""
    peak_memory_bytes: int
    """Its peak memory (bytes; -1: not sampled)."""


@dataclass(frozen=True, slots=True)
class GroupKind:
    """The process groups of one kind (dimension and description), taken together."""

    dimension: str
    """Parallel dimension (dp, tp, pp, world, ...)."""
    desc: str
    """The groups' description (``mesh_tp``, ``default_pg``, ...)."""
    groups: int
    """How many groups of this kind."""
    collectives: int
    """Collectives matched in them."""
    skew_p50_ns: float
    """Median over the groups of their median arrival skew (ns)."""
    skew_max_ns: float
    """Largest arrival skew in any of them (ns)."""
    wait_ns: int
    """Total wait of every member of every group (ns)."""


@dataclass(frozen=True, slots=True)
class Overview:
    """The run at a glance."""

    spread: tuple[Spread, ...]
    """Step time, compute, communication and wait shares, peak memory, score, across ranks."""
    outliers: tuple[Outlier, ...]
    """Ranks whose compute is furthest from the median (|score|), largest first."""
    group_kinds: tuple[GroupKind, ...]
    """Groups by kind, largest total wait first."""


SPREAD_FIGURES = ("step_ns", "compute_ns", "comm_share", "wait_share", "peak_memory_bytes", "score")
"""The figures whose spread is given, in order."""


def _spread(rows: Sequence[RankRow], figure: str) -> Spread:
    vals = [(float(getattr(r, figure)), r.rank) for r in rows]
    if figure == "peak_memory_bytes":
        vals = [(v, r) for v, r in vals if v >= 0]
    vals = [(v, r) for v, r in vals if math.isfinite(v)]
    if not vals:
        nan = float("nan")
        return Spread(figure, nan, nan, nan, nan, -1, -1)
    a = np.asarray([v for v, _ in vals])
    lo = min(vals)
    hi = max(vals, key=lambda x: (x[0], -x[1]))
    return Spread(
        figure,
        lo[0],
        float(np.percentile(a, 50)),
        float(np.percentile(a, 95)),
        hi[0],
        lo[1],
        hi[1],
    )


def overview(
    rows: Sequence[RankRow], groups: Sequence[GroupRow], top: int = TOP_OUTLIERS
) -> Overview:
    """The spread of the per-rank figures, the outliers and the groups by kind."""
    spread = tuple(_spread(rows, f) for f in SPREAD_FIGURES)
    scored = [r for r in rows if math.isfinite(r.score)]
    scored.sort(key=lambda r: (-abs(r.score), r.rank))
    outliers = tuple(
        Outlier(r.rank, r.score, r.last_share, r.step_ns, r.peak_memory_bytes)
        for r in scored[:top]
        if abs(r.score) > 0
    )
    kinds: dict[tuple[str, str], list[GroupRow]] = {}
    for g in groups:
        kinds.setdefault((g.dimension, g.desc), []).append(g)
    group_kinds = tuple(
        sorted(
            (
                GroupKind(
                    dimension=d,
                    desc=desc,
                    groups=len(gs),
                    collectives=sum(g.collectives for g in gs),
                    skew_p50_ns=float(np.median([g.skew_p50_ns for g in gs])),
                    skew_max_ns=max(g.skew_max_ns for g in gs),
                    wait_ns=sum(g.wait_ns for g in gs),
                )
                for (d, desc), gs in kinds.items()
            ),
            key=lambda k: (-k.wait_ns, k.dimension, k.desc),
        )
    )
    return Overview(spread, outliers, group_kinds)


__all__ = [
    "SPREAD_FIGURES",
    "TOP_OUTLIERS",
    "GroupKind",
    "Outlier",
    "Overview",
    "Spread",
    "overview",
]

"""Ranks grouped by where they are: identical Python stacks form one cluster, and the ranks
outside the largest cluster are the outliers ("ranks 0–62 in ``all_reduce`` ← ``_sync``; rank
63 in ``__next__``"). Used by ``meshprof stacks`` (every rank's stack, now) and by the hang
diagnosis (the stacks in the watchdog's dumps).

Two stacks are identical when every frame (file, line, function) is. A rank's stack is the one
of the thread that matters: the main thread (``meshprof stacks``), or the thread waiting in the
in-flight collective (hang dumps). A cluster is described by its innermost frames outside
meshprof's own code and Python's machinery (the *where*). Outliers: when one cluster holds more
ranks than any other, the ranks of every other cluster; with no such cluster (every rank
somewhere else, or a tie), none.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meshprof.records.stacks import RankStacks, StackFrame

#: Frames described per cluster (innermost first).
WHERE_FRAMES = 3

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
_MACHINERY = (
    f"{os.sep}threading.py",
    f"{os.sep}runpy.py",
    f"{os.sep}contextlib.py",
    f"{os.sep}functools.py",
    f"{os.sep}c10d_logger.py",
    f"{os.sep}_contextlib.py",
    "<frozen ",
)


@dataclass(frozen=True, slots=True)
class StackCluster:
    """Ranks whose stacks are identical."""

    ranks: tuple[int, ...]
    """The ranks, sorted."""
    frames: tuple[StackFrame, ...]
    """Their stack, outermost frame first."""
    where: str
    """The innermost frames that say where they are (``function (file:line) ← caller ...``)."""
    outlier: bool
    """Outside the largest cluster (see the module docstring)."""


@dataclass(frozen=True, slots=True)
class StackClusters:
    """Every rank's stack, clustered."""

    clusters: tuple[StackCluster, ...]
    """Largest cluster first (ties: lowest rank first)."""
    missing: tuple[int, ...] = ()
    """Ranks without a stack (no answer, no dump, or no Python stack in it)."""

    @property
    def outliers(self) -> tuple[int, ...]:
        """The ranks of the outlier clusters, sorted."""
        return tuple(sorted(r for c in self.clusters if c.outlier for r in c.ranks))

    @property
    def lines(self) -> tuple[str, ...]:
        """One line per cluster, then the missing ranks: ``ranks 0–62 in f (a.py:3) ← g``."""
        out = [
            f"{rank_ranges(c.ranks)} in {c.where or 'no Python frame'}"
            + (" (outlier)" if c.outlier else "")
            for c in self.clusters
        ]
        if self.missing:
            out.append(f"{rank_ranges(self.missing)}: no stack")
        return tuple(out)

    def to_dict(self) -> dict[str, Any]:
        """JSON: the clusters, the missing ranks, the outliers and the lines."""
        return {
            "clusters": self.clusters,
            "missing": self.missing,
            "outliers": self.outliers,
            "lines": self.lines,
        }


@dataclass(frozen=True, slots=True)
class StacksSnapshot:
    """``meshprof stacks``: the ranks' answers to one stacks request, clustered."""

    id: str
    """The request's id (``RUN_DIR/stacks/<id>/`` holds the answers)."""
    asked: tuple[int, ...]
    """The ranks asked (the running ones, or those named)."""
    clusters: StackClusters
    """The answers' main-thread stacks, clustered; the ranks that did not answer are its
    ``missing``."""
    stacks: tuple[RankStacks, ...]
    """Every answer (all threads), by rank."""
    waited_s: float
    """How long the answers took (the timeout when a rank did not answer)."""


def snapshot_of(
    request_id: str, asked: Sequence[int], answers: Mapping[int, RankStacks], waited_s: float
) -> StacksSnapshot:
    """Cluster the main-thread stacks of ``answers``; the asked ranks without one are missing."""
    frames = {r: (s.main.frames if s.main is not None else ()) for r, s in answers.items()}
    missing = [r for r in asked if r not in answers]
    return StacksSnapshot(
        request_id,
        tuple(asked),
        cluster_stacks(frames, missing),
        tuple(answers[r] for r in sorted(answers)),
        waited_s,
    )


def rank_ranges(ranks: Sequence[int]) -> str:
    """``rank 3`` or ``ranks 0–2, 5, 6`` (runs of three consecutive ranks or more as ranges)."""
    rs = sorted(set(ranks))
    if not rs:
        return "no rank"
    parts: list[str] = []
    start = prev = rs[0]
    for r in [*rs[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        if prev - start >= 2:
            parts.append(f"{start}–{prev}")
        else:
            parts += [str(x) for x in range(start, prev + 1)]
        if r is not None:
            start = prev = r
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(parts)


def _interesting(f: StackFrame) -> bool:
    return not f.file.startswith(_PACKAGE_DIR) and not any(m in f.file for m in _MACHINERY)


def describe_where(frames: Sequence[StackFrame], n: int = WHERE_FRAMES) -> str:
    """The innermost ``n`` frames outside meshprof and Python's machinery, innermost first
    (all frames when every one is machinery)."""
    picked = [f for f in reversed(frames) if _interesting(f)][:n] or list(reversed(frames))[:n]
    return " ← ".join(f"{f.function} ({os.path.basename(f.file)}:{f.line})" for f in picked)


def cluster_stacks(
    stacks: Mapping[int, Sequence[StackFrame]], missing: Sequence[int] = ()
) -> StackClusters:
    """Group the ranks by identical stacks (``stacks``: rank -> frames, outermost first; a rank
    with no frame counts as missing)."""
    groups: dict[tuple[tuple[str, int, str], ...], list[int]] = {}
    first: dict[tuple[tuple[str, int, str], ...], Sequence[StackFrame]] = {}
    absent = set(missing)
    for r, frames in stacks.items():
        if not frames:
            absent.add(r)
            continue
        key = tuple((f.file, int(f.line), f.function) for f in frames)
        groups.setdefault(key, []).append(r)
        first.setdefault(key, frames)
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))
    sizes = [len(v) for _, v in ordered]
    majority = len(sizes) > 1 and sizes[0] > sizes[1]
    clusters = tuple(
        StackCluster(
            ranks=tuple(sorted(ranks)),
            frames=tuple(StackFrame(f, ln, fn) for f, ln, fn in key),
            where=describe_where(first[key]),
            outlier=majority and i > 0,
        )
        for i, (key, ranks) in enumerate(ordered)
    )
    return StackClusters(clusters, tuple(sorted(absent)))


__all__ = [
    "StackCluster",
    "StackClusters",
    "StacksSnapshot",
    "cluster_stacks",
    "describe_where",
    "rank_ranges",
    "snapshot_of",
]

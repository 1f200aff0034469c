"""A run's live snapshot (what ``meshprof top``, ``serve`` and the alert rules look at) and the
live stragglers in it."""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from meshprof.records.live import LiveSnapshot, LiveStraggler, RankLive
from meshprof.rundir.live import manifest_done, read_alerts, read_rank_lives


def find_stragglers(
    ranks: dict[int, RankLive], stale: list[int], min_ratio: float = 0.10, min_ns: int = 100_000
) -> list[LiveStraggler]:
    """Ranks whose recent compute time (step − exposed communication) exceeds the median of the
    *other* fresh ranks of the same pipeline stage (:attr:`RankLive.stage`: stages do different
    work, so the last stage's loss is no straggler) by more than ``min_ratio`` and ``min_ns``;
    largest excess first. (Against the others, not all ranks: with two ranks the median of both
    would halve the excess.)"""
    by_stage: dict[int, list[tuple[int, int]]] = {}
    for r, x in ranks.items():
        if r not in stale and x.compute_ns > 0:
            by_stage.setdefault(x.stage, []).append((x.compute_ns, r))
    out: list[LiveStraggler] = []
    for fresh in by_stage.values():
        out += _stragglers_among(sorted(fresh), min_ratio, min_ns)
    return sorted(out, key=lambda s: -s.excess_ns)


def _stragglers_among(
    fresh: list[tuple[int, int]], min_ratio: float, min_ns: int
) -> list[LiveStraggler]:
    """:func:`find_stragglers` within one set of comparable ranks, ``fresh`` = sorted
    (compute_ns, rank) pairs."""
    n = len(fresh)
    if n < 2:
        return []
    v = [c for c, _ in fresh]
    out = []
    for p, (c, r) in enumerate(fresh):
        m = n - 1

        def w(k: int, p: int = p) -> int:
            return v[k] if k < p else v[k + 1]

        med = w(m // 2) if m % 2 else (w(m // 2 - 1) + w(m // 2)) // 2
        excess = c - med
        if med > 0 and excess > min_ns and excess / med > min_ratio:
            out.append(LiveStraggler(r, c, med, excess, excess / med))
    return out


def read_snapshot(run_dir: str | os.PathLike[str], now_ns: int | None = None) -> LiveSnapshot:
    """Read a run directory's live state. Raises :class:`FileNotFoundError` when ``run_dir`` is
    not a directory (the commands turn that into their one-line error)."""
    run = Path(run_dir)
    if not run.is_dir():
        raise FileNotFoundError(f"{run} is not a directory")
    now = time.time_ns() if now_ns is None else now_ns
    ranks = read_rank_lives(run)
    stale = [r for r, x in ranks.items() if x.is_stale(now)]
    job_done = manifest_done(run)
    ended = bool(ranks) and (job_done or all(x.status != "running" for x in ranks.values()))
    if job_done:
        stale = []  # the job is over: nobody is expected to publish
    world = max((x.world_size for x in ranks.values()), default=-1)
    return LiveSnapshot(
        taken_ns=now,
        ranks=ranks,
        stale=stale,
        stragglers=find_stragglers(ranks, stale),
        alerts=read_alerts(run),
        ended=ended,
        world_size=world,
    )


def snapshot_to_dict(s: LiveSnapshot) -> dict[str, Any]:
    """The ``meshprof top --json`` shape: ``{"taken_ns", "ended", "world_size", "ranks": [...],
    "stale", "stragglers", "alerts"}``; each rank entry has ``rank, step, step_ns,
    tokens_per_s, comm_share, memory_bytes, inflight, updated_ns`` and the rest of its record."""
    ranks = []
    for r, x in s.ranks.items():
        d = x.to_dict()
        d.pop("series", None)
        d["stale"] = r in s.stale
        ranks.append(d)
    return {
        "taken_ns": s.taken_ns,
        "ended": s.ended,
        "world_size": s.world_size,
        "ranks": ranks,
        "stale": list(s.stale),
        "stragglers": [asdict(x) for x in s.stragglers],
        "alerts": [a.to_dict() for a in s.alerts],
    }

"""A run's live snapshot (what ``meshprof top``, ``serve`` and the alert rules look at) and the
live stragglers in it."""

from __future__ import annotations

import os
import statistics
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


def _peer_sets(ranks: dict[int, RankLive], stale: list[int] | set[int]) -> list[dict[int, int]]:
    """The fresh ranks with a compute time, by pipeline stage: ``{rank: compute_ns}`` each."""
    by_stage: dict[int, dict[int, int]] = {}
    for r, x in ranks.items():
        if r not in stale and x.compute_ns > 0:
            by_stage.setdefault(x.stage, {})[r] = x.compute_ns
    return list(by_stage.values())


def straggler_scores(ranks: dict[int, RankLive], stale: list[int] | set[int]) -> dict[int, float]:
    """Per fresh rank, its **straggler score**: its recent compute time
    (:attr:`RankLive.compute_ns`: the median over its recent steps of step time − exposed
    communication) over the median of the *other* fresh running ranks' of its pipeline stage
    (with two ranks: the other rank's). 1 is a typical rank; 1.5 computes 50 % longer than its
    peers, and the peers wait for it. Ranks alone in their stage (or without a step yet) have
    none."""
    out: dict[int, float] = {}
    for peers in _peer_sets(ranks, stale):
        if len(peers) < 2:
            continue
        for r, c in peers.items():
            med = statistics.median(v for p, v in peers.items() if p != r)
            if med > 0:
                out[r] = c / med
    return out


def wait_estimates(ranks: dict[int, RankLive], stale: list[int] | set[int]) -> dict[int, int]:
    """Per fresh rank, the time it waits per step for the slowest rank of its pipeline
    stage (ns; recent medians): max(0, the slowest peer's compute − its own), at most its
    exposed data-parallel, tensor-parallel and other communication per step (waiting hidden
    behind compute costs nothing; a stage's waiting on pipeline send/recv is its bubble). An
    estimate from the ranks' records, which carry no per-collective arrival times; the report
    measures it per collective (``straggler_wait`` in its time ledger)."""
    out: dict[int, int] = {}
    for peers in _peer_sets(ranks, stale):
        if len(peers) < 2:
            continue
        slowest = max(peers.values())
        for r, c in peers.items():
            out[r] = min(max(slowest - c, 0), carvable_exposed_ns(ranks[r]))
    return out


def carvable_exposed_ns(x: RankLive) -> int:
    """The rank's exposed communication per step over its recent window outside the pipeline
    dimension (ns): where a straggler wait can hide (:func:`wait_estimates`)."""
    n = len(x.recent_step_ns)
    if n == 0:
        return 0
    return sum(d.exposed_ns for d in x.dims if d.dim != "pp") // n


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

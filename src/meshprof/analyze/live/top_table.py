"""What ``meshprof top`` shows, computed from a :class:`~meshprof.records.live.LiveSnapshot`: one
typed row per rank, sorted by a key and cut to the rows that fit, plus the summary line (ranks,
stale, ended, median step). The renderer (:mod:`meshprof.render.live_top`) only formats it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from meshprof.analyze.live.alerts import inflight_age_ns, rank_rate
from meshprof.analyze.live.serving_rules import decode_excess
from meshprof.analyze.live.snapshot import straggler_scores
from meshprof.records.live import Alert, LiveSnapshot, LiveStraggler, RankLive
from meshprof.records.serving import ServingLive

SORT_KEYS: dict[str, str] = {
    "o": "cost",
    "s": "step",
    "t": "throughput",
    "c": "comm",
    "e": "exposed",
    "m": "memory",
    "i": "inflight",
    "r": "rank",
}
"""Key → sort order of ``meshprof top`` (``--sort`` takes the name; ``cost`` is the default)."""

STUCK_STEPS = 10
"""A running rank in its step for more than this many of its median steps (and
:data:`STUCK_MIN_NS`) is stuck: ``cost`` shows it before the others."""
STUCK_MIN_NS = 10 * 10**9

_ASCENDING = {"rank", "throughput"}
"""Orders shown smallest first (the slowest throughput is the interesting one)."""


@dataclass(slots=True)
class TopRow:
    """One rank in ``meshprof top``."""

    rank: int
    host: str
    state: str
    """"running", "stale" (no record for a while) or "ended"."""
    exit_how: str
    step: int
    """Step in progress (-1: none yet)."""
    step_ns: int
    """Median of the recent steps, ns (0: none yet)."""
    recent_step_ns: list[int]
    """The recent steps' durations, oldest first."""
    rate: float
    rate_unit: str
    """"tokens/s" or "steps/s"."""
    comm_share: float
    exposed_share: float
    memory_bytes: int
    """-1: not measured."""
    memory_capacity_bytes: int
    inflight_op: str
    """The oldest collective in flight ("" when none) with its group."""
    inflight_age_ns: int
    """How long it has been in flight at the snapshot (0: none)."""
    record_age_ns: int
    """Age of the rank's record at the snapshot."""
    straggler: bool
    score: float = 0.0
    """Its straggler score (recent compute / its peers' median,
    :func:`~meshprof.analyze.live.snapshot.straggler_scores`); 0: none (no peer, no step)."""
    in_step_ns: int = 0
    """How long a running rank has been in its current step at the snapshot (0: unknown)."""
    cost: int = 3
    """The ``cost`` order's tier: 0 stale, or ended abnormally while the job runs; 1 stuck in
    its step (:data:`STUCK_STEPS`) with no collective in flight (the hang's culprit); 2 stuck
    waiting in a collective; 3 the others (by straggler score); 4 ended normally."""


@dataclass(slots=True)
class TopTable:
    """The rows ``meshprof top`` shows and its summary line."""

    taken_ns: int
    sort: str
    """Name of the sort order (a value of :data:`SORT_KEYS`)."""
    rows: list[TopRow]
    """The shown rows: stale ranks first, then by ``sort``."""
    ranks: int
    """Ranks with a record."""
    world_size: int
    hidden: int
    """Ranks not shown (``--rows``)."""
    stale: int
    ended: bool
    median_step_ns: int | None
    """Median over the ranks of their recent step time (None: no steps yet)."""
    stragglers: list[LiveStraggler] = field(default_factory=list)
    alerts: list[Alert] = field(default_factory=list)
    """The most recent alerts, oldest first."""
    serving: ServingTop | None = None
    """A serving job's figures (None: no rank serves requests or names decode steps)."""


@dataclass(slots=True)
class ServingTop:
    """What ``top`` shows of a serving job: the serving rank's live figures and each rank's
    decode compute against its peers'."""

    rank: int
    """The serving rank shown (the lowest that records requests; -1: none, decode only)."""
    live: ServingLive | None
    """Its live figures."""
    decode_scores: dict[int, float] = field(default_factory=dict)
    """rank → its recent decode compute / its peers' median."""


def serving_top(snap: LiveSnapshot) -> ServingTop | None:
    """The serving part of ``snap`` (None when there is none)."""
    have = {r: x.serving for r, x in snap.ranks.items() if x.serving is not None}
    if not have:
        return None
    serving = sorted(r for r, s in have.items() if s is not None and s.serves_requests)
    scores = {r: 1.0 + e for r, (e, _) in decode_excess(snap.ranks, snap.stale).items()}
    r0 = serving[0] if serving else -1
    return ServingTop(r0, have.get(r0) if r0 >= 0 else None, scores)


def top_row(
    rec: RankLive, snap: LiveSnapshot, stragglers: set[int], scores: dict[int, float] | None = None
) -> TopRow:
    """The row of one rank (``scores``: the snapshot's straggler scores)."""
    rate, unit = rank_rate(rec)
    if rec.rank in snap.stale:
        state = "stale"
    elif rec.status == "running" and not snap.ended:
        state = "running"
    else:
        state = "ended"  # a rank killed with its job never wrote its "ended" record
    f = rec.inflight
    in_step = 0
    if state == "running" and rec.last_step_end_ns > 0:
        in_step = max(snap.taken_ns - rec.last_step_end_ns, 0)
    age = inflight_age_ns(rec, snap.taken_ns) if state == "running" else 0
    if state == "stale" or (state == "ended" and rec.exit_how not in ("", "normal")):
        cost = 0
    elif state == "ended":
        cost = 4
    elif in_step > max(STUCK_STEPS * rec.step_ns, STUCK_MIN_NS):
        cost = 2 if f is not None else 1
    else:
        cost = 3
    return TopRow(
        rank=rec.rank,
        host=rec.hostname,
        state=state,
        exit_how=rec.exit_how,
        step=rec.step,
        step_ns=rec.step_ns,
        recent_step_ns=list(rec.recent_step_ns),
        rate=rate,
        rate_unit=unit,
        comm_share=rec.comm_share,
        exposed_share=rec.exposed_share,
        memory_bytes=rec.memory_bytes,
        memory_capacity_bytes=rec.memory_capacity_bytes,
        inflight_op=f"{f.op} {f.dim}" if f is not None else "",
        inflight_age_ns=age,
        record_age_ns=max(snap.taken_ns - rec.updated_ns, 0),
        straggler=rec.rank in stragglers,
        score=(scores or {}).get(rec.rank, 0.0),
        in_step_ns=in_step,
        cost=cost,
    )


def _key(sort: str, r: TopRow) -> tuple[float, ...]:
    if sort == "cost":  # the worst first: its tier, then the straggler score, then step time
        return (r.cost, -r.score, -r.step_ns)
    sign = 1 if sort in _ASCENDING else -1
    return (r.state != "stale", sign * _value(sort, r))


def _value(sort: str, r: TopRow) -> float:
    return {
        "step": r.step_ns,
        "throughput": r.rate,
        "comm": r.comm_share,
        "exposed": r.exposed_share,
        "memory": r.memory_bytes,
        "inflight": r.inflight_age_ns,
        "rank": r.rank,
    }[sort]


def build_top_table(
    snap: LiveSnapshot, sort: str = "cost", limit: int | None = None, alerts: int = 5
) -> TopTable:
    """The table of ``snap`` sorted by ``sort`` (a value of :data:`SORT_KEYS`): ``cost`` puts
    the worst rank first (:attr:`TopRow.cost`'s tiers, then the highest straggler score), so
    the culprit is on screen however few rows fit; the others stale ranks first, then largest
    first, except rank and throughput. Cut to ``limit`` rows (None: all), with the last
    ``alerts`` alerts."""
    if sort not in SORT_KEYS.values():
        raise ValueError(f"unknown sort {sort!r}")
    strag = {s.rank for s in snap.stragglers}
    scores = straggler_scores(snap.ranks, snap.stale)
    rows = [top_row(x, snap, strag, scores) for x in snap.ranks.values()]
    rows.sort(key=lambda r: (*_key(sort, r), r.rank))
    steps = [r.step_ns for r in rows if r.step_ns > 0 and r.state != "stale"]
    shown = rows if limit is None else rows[: max(limit, 0)]
    return TopTable(
        taken_ns=snap.taken_ns,
        sort=sort,
        rows=shown,
        ranks=len(rows),
        world_size=snap.world_size,
        hidden=len(rows) - len(shown),
        stale=len(snap.stale),
        ended=snap.ended,
        median_step_ns=int(statistics.median(steps)) if steps else None,
        stragglers=list(snap.stragglers),
        alerts=list(snap.alerts[-alerts:]) if alerts > 0 else [],
        serving=serving_top(snap),
    )


__all__ = [
    "SORT_KEYS",
    "STUCK_MIN_NS",
    "STUCK_STEPS",
    "ServingTop",
    "TopRow",
    "TopTable",
    "build_top_table",
    "serving_top",
    "top_row",
]

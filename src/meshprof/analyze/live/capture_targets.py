"""Which ranks a capture traces: the culprit and a healthy peer with the same role.

The **peer** of a rank in a dp × tp × pp layout is the rank with the same pipeline stage and
tensor-parallel position in another data-parallel replica (it runs the same code on other
data): the nearest replica whose rank is healthy (running, publishing, not itself named by the
alert or a live straggler). With a single replica, its neighbour in the group it slows: the next
tensor-parallel rank, else the next pipeline stage. Without a layout every rank is a replica.

The **culprit** depends on what asked for the capture: the live straggler named by the alert
(``straggler``); the largest live straggler of the snapshot, else the alert's rank that computes
longest (``step_regression``, ``throughput_drop``: job-wide symptoms); for a forming hang
(``stall``, ``inflight``, ``stale``) a rank that is *not* waiting in a collective, since the
ones waiting wait for it.

:class:`CaptureConfig` is ``meshprof run --capture-on``'s settings.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from meshprof.analyze.live.alert_config import RULES
from meshprof.errors import MeshprofError
from meshprof.layout import Layout
from meshprof.records.captures import MAX_CAPTURE_STEPS, MAX_TIMEOUT_S
from meshprof.records.live import LiveSnapshot, RankLive

TRIGGERS: dict[str, tuple[str, ...]] = {
    "straggler": ("straggler",),
    "slow-step": ("step_regression", "throughput_drop"),
    "hang": ("stall", "inflight", "stale"),
}
"""``--capture-on`` names -> the alert kinds they capture on (a rule's own name works too)."""

HANG_KINDS = frozenset(TRIGGERS["hang"])
"""Alert kinds of a forming hang: the ranks may never reach a step boundary, so the capture also
takes every rank's stacks and does not wait long."""


GIB = 1 << 30


@dataclass(kw_only=True, slots=True)
class CaptureConfig:
    """``meshprof run --capture-on``: capture on alerts, within limits. Validated on
    construction (bad values raise :class:`MeshprofError`)."""

    on: tuple[str, ...] = ()
    """Triggers: ``straggler``, ``slow-step``, ``hang`` (see :data:`TRIGGERS`) or alert rule
    names; empty: no capture on alerts."""
    steps: int = 3
    """Steps each capture traces."""
    max_per_hour: int = 4
    """At most this many captures start in any hour (a week-long job: at most 672)."""
    max_bytes: int = 2 * GIB
    """Disk budget of ``RUN_DIR/captures``: no capture starts once it is spent, and a rank does
    not keep a trace that would exceed it."""
    timeout_s: float = 60.0
    """How long a capture waits for its ranks (a forming hang's: at most 10 s)."""

    def __post_init__(self) -> None:
        for t in self.on:
            if t not in TRIGGERS and t not in RULES:
                names = ", ".join([*TRIGGERS, *(r for r in RULES if r not in TRIGGERS)])
                raise MeshprofError(f"--capture-on {t!r}: expected some of {names}")
        if not 1 <= self.steps <= MAX_CAPTURE_STEPS:
            raise MeshprofError(
                f"--capture-steps {self.steps}: expected 1 to {MAX_CAPTURE_STEPS} steps"
            )
        if self.max_per_hour < 1:
            raise MeshprofError(f"--capture-max-per-hour {self.max_per_hour}: must be >= 1")
        if self.max_bytes < 1:
            raise MeshprofError(f"--capture-max-bytes {self.max_bytes}: must be positive")
        if not 0 < self.timeout_s <= MAX_TIMEOUT_S:
            raise MeshprofError(
                f"--capture-timeout {self.timeout_s}: expected 0 to {MAX_TIMEOUT_S:g} seconds"
            )

    @property
    def enabled(self) -> bool:
        return bool(self.on)

    @property
    def kinds(self) -> frozenset[str]:
        """The alert kinds that start a capture."""
        return frozenset(k for t in self.on for k in TRIGGERS.get(t, (t,)))


@dataclass(frozen=True, slots=True)
class CaptureTargets:
    """The ranks to trace, the culprit first."""

    culprit: int
    """The rank looked at."""
    peer: int | None
    """The rank it is compared with (None: the job has no other rank)."""
    reason: str
    """Both choices in words."""

    @property
    def ranks(self) -> tuple[int, ...]:
        return (self.culprit,) if self.peer is None else (self.culprit, self.peer)


def _healthy(snap: LiveSnapshot | None, r: int) -> bool:
    if snap is None:
        return True
    x = snap.ranks.get(r)
    return x is None or (x.status == "running" and r not in snap.stale)


def peer_of(
    rank: int,
    layout: Layout | None,
    world_size: int,
    avoid: Iterable[int] = (),
    snap: LiveSnapshot | None = None,
) -> tuple[int | None, str]:
    """A healthy peer of ``rank`` with the same role, and how it was chosen (see the module
    docstring). None when the job has no other rank."""
    lay = layout if layout is not None and layout.world_size == world_size else None
    if lay is None:
        lay = Layout(dp=max(world_size, 1))
    bad = set(avoid) | {rank}

    def ok(r: int) -> bool:
        return 0 <= r < world_size and r not in bad and _healthy(snap, r)

    d, t, p = lay.coords(rank)
    step = lay.tp * lay.pp
    skipped: list[int] = []  # the nearest replica peers that were not healthy (two at most)
    for x in _nearest(d, lay.dp):
        r = x * step + t * lay.pp + p
        if ok(r):
            if lay.tp == 1 and lay.pp == 1:
                return r, f"rank {r}: another data-parallel replica"
            return r, (
                f"rank {r}: the same pipeline stage ({p}) and tensor-parallel position ({t}) "
                f"in data-parallel replica {x}"
            )
        if len(skipped) < 2:
            skipped.append(r)
    none = "no healthy replica" + "".join(f"; {_why_not(q, bad, snap)}" for q in skipped)
    for x in _nearest(t, lay.tp):
        r = d * step + x * lay.pp + p
        if ok(r):
            return r, f"rank {r}: its tensor-parallel neighbour ({none})"
    for x in _nearest(p, lay.pp):
        r = d * step + t * lay.pp + x
        if ok(r):
            return r, f"rank {r}: its pipeline neighbour, stage {x} ({none})"
    healthy = next((r for r in _nearest(rank, world_size) if ok(r)), None)
    if healthy is not None:
        return healthy, f"rank {healthy}: the nearest healthy rank (no peer with its role)"
    other = next(_nearest(rank, world_size), None)
    if other is not None:
        return other, f"rank {other}: the only other rank left (not a healthy peer)"
    return None, "no other rank"


def _why_not(r: int, bad: set[int], snap: LiveSnapshot | None) -> str:
    """Why rank ``r`` is not a healthy peer, in words."""
    x = snap.ranks.get(r) if snap is not None else None
    if snap is not None and r in snap.stale:
        return f"rank {r} stopped publishing"
    if x is not None and x.status != "running":
        return f"rank {r} is {x.status}"
    if r in bad:
        return f"rank {r} is named by the alert or is a live straggler"
    return f"rank {r} is not in the job"


def _nearest(center: int, n: int) -> Iterator[int]:
    """``0 .. n-1`` except ``center``, nearest first (the lower one first at equal distance),
    made as they are asked for: a search that stops at the first healthy rank costs the ranks
    it looks at, not the world size a live record claims."""
    for k in range(1, max(center, n - 1 - center) + 1):
        if 0 <= center - k < n:
            yield center - k
        if center + k < n:
            yield center + k


def _slowest(ranks: Iterable[int], snap: LiveSnapshot) -> int | None:
    recs = [(snap.ranks[r].compute_ns, -r) for r in ranks if r in snap.ranks]
    return -max(recs)[1] if recs else None


def choose_culprit(
    kind: str, alert_ranks: Sequence[int], snap: LiveSnapshot
) -> tuple[int | None, str]:
    """The rank to look at for an alert of ``kind`` naming ``alert_ranks`` ("demand": no alert,
    the largest live straggler or the rank that computes longest), and why."""
    strag = {s.rank: s for s in snap.stragglers}
    if kind in HANG_KINDS:
        named = [r for r in alert_ranks if r in snap.ranks]
        free = [r for r in named if snap.ranks[r].inflight is None]
        if kind == "stale" and named:
            return named[0], f"rank {named[0]}: it stopped publishing its live state"
        if free:
            return free[0], f"rank {free[0]}: stuck outside any collective (the others wait for it)"
        outside = [
            r
            for r, x in snap.ranks.items()
            if x.status == "running" and x.inflight is None and r not in named
        ]
        if outside:
            return outside[0], f"rank {outside[0]}: not in the collective the others wait in"
        if named:
            return named[0], f"rank {named[0]}: named by the {kind} alert"
        return None, "no rank named"
    if kind == "straggler":
        picked = [r for r in alert_ranks if r in strag] or list(alert_ranks)
        if picked:
            r = max(picked, key=lambda r: (strag[r].excess_ns if r in strag else 0, -r))
            return r, _straggler_reason(r, snap)
    if snap.stragglers:
        r = snap.stragglers[0].rank
        return r, _straggler_reason(r, snap)
    r2 = _slowest(alert_ranks or list(snap.ranks), snap)
    if r2 is not None:
        return r2, f"rank {r2}: the longest compute per step ({_ms(snap.ranks[r2].compute_ns)})"
    return None, "no rank publishes its live state"


def _ms(ns: int) -> str:
    return f"{ns / 1e6:.1f} ms"


def _straggler_reason(r: int, snap: LiveSnapshot) -> str:
    s = next((x for x in snap.stragglers if x.rank == r), None)
    if s is None:
        return f"rank {r}: named a straggler by the alert"
    return f"rank {r}: live straggler, +{_ms(s.excess_ns)} compute per step (+{s.excess_ratio:.0%})"


def choose_targets(
    kind: str,
    alert_ranks: Sequence[int],
    snap: LiveSnapshot,
    layout: Layout | None,
    world_size: int,
) -> CaptureTargets | None:
    """The culprit and its healthy peer for an alert (or ``kind`` "demand"); None when no rank
    can be named."""
    culprit, why = choose_culprit(kind, alert_ranks, snap)
    if culprit is None:
        return None
    avoid = set(alert_ranks) | {s.rank for s in snap.stragglers} | set(snap.stale)
    if kind in HANG_KINDS:  # compare with a rank that is waiting, not with another stuck one
        avoid = {culprit}
    peer, peer_why = peer_of(culprit, layout, world_size, avoid, snap)
    return CaptureTargets(culprit, peer, f"{why}; {peer_why}")


def rank_records(snap: LiveSnapshot) -> dict[int, RankLive]:
    """The running ranks' records."""
    return {r: x for r, x in snap.ranks.items() if x.status == "running"}


__all__ = [
    "HANG_KINDS",
    "TRIGGERS",
    "CaptureConfig",
    "CaptureTargets",
    "choose_culprit",
    "choose_targets",
    "peer_of",
    "rank_records",
]

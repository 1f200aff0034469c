"""Which steps the live exporter sends as traces, and when it decides.

A step is sent (all the ranks' steps of that number the exporter sees, with their phases) when

- its number is a multiple of ``every`` (``every``),
- on some rank it lasted more than ``slow`` × the median of that rank's previous steps
  (``slow``: a straggler's step, a hiccup),
- it lies within ``around_alert`` steps of the step an alert fired in (``alert``), or
- a capture traced it (``capture``).

Alerts come seconds after their step (the rules look at the live state every second), so a
closed step is *held* ``hold_s`` seconds before its decision; at most ``max_held_steps`` are
held (the oldest are decided at once beyond it). An alert or capture later than that still
becomes an event of its step's trace (a span of its own there, see
:mod:`meshprof.live.otel.spans`). A rank's step that arrives after its step was decided
follows the decision.
"""

from __future__ import annotations

import statistics
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from meshprof.errors import MeshprofError
from meshprof.live.otel.steps import JobStep, PendingRankStep, RankStep, join_arrivals

REASONS = ("every", "slow", "alert", "capture", "all")
"""Why a step was sent (its root span's ``meshprof.sampled`` attribute)."""

_KEEP_DECIDED = 4096
"""Decisions (and step windows) remembered, for ranks' late steps and for placing alerts."""
_KEEP_FORCED = 256


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceSampling:
    """Which steps are sent as traces (see the module docstring)."""

    every: int = 100
    """Every step whose number is a multiple of this is sent (0: none by number; 1: all)."""
    slow: float = 1.5
    """A step that lasted more than this × the median of the rank's previous steps is sent
    (0: off)."""
    around_alert: int = 2
    """Steps sent on each side of the step an alert fired in."""
    hold_s: float = 10.0
    """Seconds a closed step waits for alerts and captures before its decision."""
    max_held_steps: int = 64
    """Steps held at most (memory bound: their phases and collectives' issue times)."""
    history: int = 32
    """A rank's previous steps the ``slow`` median is over."""
    min_history: int = 8
    """Steps a rank needs before one of its steps can be slow."""

    def __post_init__(self) -> None:
        if self.every < 0:
            raise MeshprofError(f"--otlp-every {self.every}: must be >= 0 (0: by number none)")
        if not (self.slow == 0 or self.slow > 1):
            raise MeshprofError(f"--otlp-slow {self.slow}: must be above 1 (0: off)")
        if self.around_alert < 0 or self.hold_s < 0 or self.max_held_steps < 1:
            raise MeshprofError("trace sampling: negative steps, seconds or bounds")


@dataclass(slots=True)
class _Held:
    first_seen: float
    ranks: dict[int, RankStep | PendingRankStep] = field(default_factory=dict)
    slow: bool = False


class StepBook:
    """Holds the ranks' closed steps and decides which are sent (see the module docstring).
    ``now`` arguments are monotonic seconds (the exporter's clock, not the ranks')."""

    def __init__(self, sampling: TraceSampling) -> None:
        self.sampling = sampling
        self._held: dict[int, _Held] = {}
        self._history: dict[int, deque[int]] = {}
        self._decided: OrderedDict[int, tuple[str, ...]] = OrderedDict()
        self._windows: OrderedDict[int, tuple[int, int]] = OrderedDict()
        self._forced: deque[tuple[int, int, str]] = deque(maxlen=_KEEP_FORCED)
        self.steps_seen = 0
        """Ranks' steps added."""
        self.steps_sent = 0
        """Ranks' steps handed out to be sent."""

    def add(self, rs: RankStep | PendingRankStep, now: float) -> None:
        """A rank's closed step (a pending one is summarized only if it is sent)."""
        self.steps_seen += 1
        s = rs.step
        lo, hi = self._windows.pop(s, (rs.start_ns, rs.end_ns))
        self._windows[s] = (min(lo, rs.start_ns), max(hi, rs.end_ns))
        while len(self._windows) > _KEEP_DECIDED:
            self._windows.popitem(last=False)
        hist = self._history.setdefault(rs.rank, deque(maxlen=self.sampling.history))
        slow = (
            self.sampling.slow > 0
            and len(hist) >= self.sampling.min_history
            and rs.duration_ns > self.sampling.slow * statistics.median(hist)
        )
        hist.append(rs.duration_ns)
        h = self._held.get(s)
        if h is None:
            h = self._held[s] = _Held(now)
        h.ranks[rs.rank] = rs
        h.slow = h.slow or slow

    def force(self, lo: int, hi: int, reason: str) -> None:
        """Send steps ``lo`` to ``hi`` (an alert's or a capture's)."""
        self._forced.append((lo, hi, reason))

    def decided(self, step: int) -> tuple[str, ...] | None:
        """Why ``step`` was sent (empty: it was not); None while undecided."""
        return self._decided.get(step)

    def step_at(self, t_ns: int, final: bool = False) -> int | None:
        """The step the job was in at ``t_ns`` (common clock): the one whose span across the
        ranks holds it, else the last one begun before it. None while no step known ends after
        ``t_ns`` (the ranks' steps reach the exporter a second or two late: ask again), unless
        ``final`` (then the step after the last one known: the one in progress)."""
        if not self._windows:
            return None
        inside = [s for s, (lo, hi) in self._windows.items() if lo <= t_ns < hi]
        if inside:
            return max(inside)
        if not any(hi > t_ns for _lo, hi in self._windows.values()):
            return max(self._windows) + 1 if final else None
        before = [s for s, (lo, _hi) in self._windows.items() if lo <= t_ns]
        return max(before) if before else min(self._windows)

    def due(self, now: float, final: bool = False) -> list[tuple[JobStep, bool]]:
        """The steps decided now and sent, each with whether it is its first part (its root
        span goes with it); ranks' late steps of steps already decided go out as parts."""
        out: list[tuple[JobStep, bool]] = []
        over = len(self._held) - self.sampling.max_held_steps
        for s in sorted(self._held):
            h = self._held[s]
            earlier = self._decided.get(s)
            if earlier is None and not (
                final or over > 0 or now - h.first_seen >= self.sampling.hold_s
            ):
                continue
            over -= 1
            del self._held[s]
            first = earlier is None
            reasons = earlier if earlier is not None else self._reasons(s, h)
            if first:
                self._decided[s] = reasons
                while len(self._decided) > _KEEP_DECIDED:
                    self._decided.popitem(last=False)
            if reasons:
                self.steps_sent += len(h.ranks)
                built = [
                    r.build() if isinstance(r, PendingRankStep) else r for r in h.ranks.values()
                ]
                out.append((JobStep(s, join_arrivals(built), reasons), first))
        return out

    def _reasons(self, s: int, h: _Held) -> tuple[str, ...]:
        why = []
        if self.sampling.every > 0 and s % self.sampling.every == 0:
            why.append("all" if self.sampling.every == 1 else "every")
        if h.slow:
            why.append("slow")
        for lo, hi, reason in self._forced:
            if lo <= s <= hi and reason not in why:
                why.append(reason)
        return tuple(why)


__all__ = ["REASONS", "StepBook", "TraceSampling"]

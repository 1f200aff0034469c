"""How a recorder sees a simulated job's completions: the flaws of the *recording*, never of the
job (the timeline, and so the truth re-simulated from it, is the same whatever is chosen here).

A real recorder notices a completion when something looks: the caller's ``Work.wait`` (exact), a
poller thread (late by its period, and by much more on a loaded machine), or the next time the
rank's Python thread gets the lock back — at its next blocking op, or when a pipeline exchange
ends. :class:`Recording` describes one such recorder; :func:`seen_completions` gives, per rank
and event, the completion time it writes (true clock, ns) — never earlier than the true one.

Families (the issue's "how completions are recorded"):

- *exact* — the default;
- *independent lag* on async ops (``lag_ns``; a share ``late_share`` of them by
  ``late_ns``..3 × ``late_ns`` instead), as a polled DDP bucket;
- *lag on blocking ops* (``blocking_lag_ns``) too;
- *tied lateness* (``tied``): ``"next"``, a blocking collective seen complete only when the
  rank's next blocking op completes (the step's end after its last); ``"exchange"``, the last
  blocking collective before each point-to-point exchange seen complete only when that
  exchange ends (its last completion);
- on every chain (a rank's events in a step) or on some (``scope="some"``: a seeded half);
- the async flags present or absent (``flags``; absent: the loader strips the column, see
  :func:`sim.check.load_recorded`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.jobsim import Timeline

TIED = ("", "next", "exchange")
SCOPES = ("all", "some")


@dataclass(frozen=True, slots=True)
class Recording:
    """One recorder's view of the completions (ns)."""

    lag_ns: int = 0
    """Async ops: each completion seen a uniform draw in [0, this) late."""
    late_share: float = 0.0
    """Async ops: this share seen ``late_ns``..3 × ``late_ns`` late instead."""
    late_ns: int = 0
    blocking_lag_ns: int = 0
    """Blocking ops: each completion seen a uniform draw in [0, this) late."""
    tied: str = ""
    """Lateness tied to the program (:data:`TIED`; see the module docstring)."""
    scope: str = "all"
    """Chains the tied lateness and the blocking lag hit (:data:`SCOPES`): every rank's steps,
    or a seeded half of the (rank, step) chains."""
    flags: bool = True
    """The async flag (``FLAG_ASYNC``) is in the record."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.tied not in TIED:
            raise ValueError(f"tied={self.tied!r}: expected one of {TIED}")
        if self.scope not in SCOPES:
            raise ValueError(f"scope={self.scope!r}: expected one of {SCOPES}")

    @property
    def name(self) -> str:
        """A short label of the family."""
        parts = []
        if self.lag_ns or self.late_share:
            parts.append("async-lag")
        if self.blocking_lag_ns:
            parts.append("blocking-lag")
        if self.tied:
            parts.append(f"tied-{self.tied}")
        if parts and self.scope == "some":
            parts.append("some-chains")
        if not self.flags:
            parts.append("no-flags")
        return "+".join(parts) or "exact"


def seen_completions(tl: Timeline, rec: Recording) -> list[np.ndarray]:
    """Per rank, the completion time the recorder writes for each event (true clock, ns; the
    events of :attr:`Timeline.events`, in issue order): the true one or later."""
    rng = np.random.default_rng(rec.seed)
    job = tl.job
    hit = rng.random((job.world, job.steps)) < 0.5 if rec.scope == "some" else None
    out = []
    for r in range(job.world):
        ev = tl.events[r]
        true_end = ev[:, 2].copy()
        seen = true_end.copy()
        ops = [tl.ops[int(i)] for i in ev[:, 0]]
        is_async = np.asarray([op.is_async for op in ops], dtype=bool)
        is_p2p = np.asarray([op.name == "p2p" for op in ops], dtype=bool)
        step = tl.step_of[r]
        on = np.ones(len(ev), dtype=bool) if hit is None else hit[r, step]
        if rec.lag_ns > 0 or rec.late_share > 0:
            lag = rng.integers(0, max(rec.lag_ns, 1), len(ev))
            late = rng.random(len(ev)) < rec.late_share
            lag[late] = rng.integers(rec.late_ns, 3 * rec.late_ns + 1, int(late.sum()))
            seen[is_async] += lag[is_async]
        if rec.blocking_lag_ns > 0:
            lag = rng.integers(0, rec.blocking_lag_ns, len(ev))
            sel = ~is_async & on
            seen[sel] += lag[sel]
        if rec.tied:
            blocking_coll = ~is_async & ~is_p2p
            for j in np.flatnonzero(blocking_coll & on).tolist():
                later = j + 1
                same = later < len(ev) and step[later] == step[j]
                if rec.tied == "next":
                    k = j + 1
                    while k < len(ev) and step[k] == step[j] and is_async[k]:
                        k += 1
                    if k < len(ev) and step[k] == step[j]:
                        seen[j] = max(seen[j], true_end[k])
                    else:  # the last blocking op of its step: seen at the step's end
                        seen[j] = max(seen[j], int(tl.step_end[r, step[j]]))
                elif same and is_p2p[later]:  # "exchange": the p2p ops right after it
                    k = later
                    while k < len(ev) and step[k] == step[j] and is_p2p[k]:
                        k += 1
                    seen[j] = max(seen[j], int(true_end[later:k].max()))
        out.append(seen)
    return out

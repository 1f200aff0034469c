"""Per-step totals of one rank (STEP_TOTALS_DTYPE), built by the rank writer from the rows it
appends, and kept for the whole run when the detailed rows are rotated out.

A step's row is complete once its step span has closed and one more tick has passed (a
collective issued in the step and completing just after it is counted); the rows are emitted
then, and nothing older is kept in memory: the builder holds only the steps still open.
"""

from __future__ import annotations

import numpy as np

from meshprof.events import STEP_TOTALS_DTYPE

_STEP_KIND = 0  # SPAN_KINDS.index("step")
KEEP_OPEN = 4096
"""Steps with collectives but no closed span yet kept at most (the oldest go first)."""


class StepTotals:
    """Folds appended rows into per-step totals; :meth:`ready` hands out the finished ones."""

    def __init__(self) -> None:
        self._comm: dict[int, list[int]] = {}  # step -> [collectives, comm_ns, comm_bytes]
        self._spans: dict[int, tuple[int, int, int]] = {}  # step -> (start, duration, tokens)
        self._memory: dict[int, int] = {}  # step -> peak
        self._waited: set[int] = set()  # closed steps that have seen one tick
        self.emitted = 0
        self._last_emitted = -1

    def add(self, events: np.ndarray, spans: np.ndarray, memory: np.ndarray) -> None:
        """Fold one tick's new rows in."""
        if len(events):
            ev = events[(events["duration_ns"] >= 0) & (events["step"] > self._last_emitted)]
            if len(ev):
                steps, inv = np.unique(ev["step"], return_inverse=True)
                n = np.bincount(inv)
                dur = np.bincount(inv, weights=ev["duration_ns"].astype(np.float64))
                nbytes = np.bincount(inv, weights=ev["in_bytes"].astype(np.float64))
                for s, c, d, b in zip(
                    steps.tolist(), n.tolist(), dur.tolist(), nbytes.tolist(), strict=True
                ):
                    row = self._comm.setdefault(int(s), [0, 0, 0])
                    row[0] += int(c)
                    row[1] += int(d)
                    row[2] += int(b)
                if len(self._comm) > KEEP_OPEN:
                    for s in sorted(self._comm)[: len(self._comm) - KEEP_OPEN]:
                        del self._comm[s]
        if len(spans):
            st = spans[(spans["kind"] == _STEP_KIND) & (spans["step"] >= 0)]
            for s, t0, d, tok in zip(
                st["step"].tolist(),
                st["start_ns"].tolist(),
                st["duration_ns"].tolist(),
                st["tokens"].tolist(),
                strict=True,
            ):
                self._spans[int(s)] = (int(t0), int(d), int(tok))
        if len(memory):
            peak = np.where(memory["peak"] >= 0, memory["peak"], memory["rss"])
            for s, p in zip(memory["step"].tolist(), peak.tolist(), strict=True):
                self._memory[int(s)] = int(p)

    def ready(self, final: bool = False) -> np.ndarray:
        """The steps finished since the last call (all closed ones when ``final``), by step."""
        done = sorted(s for s in self._spans if final or s in self._waited)
        self._waited = set(self._spans) - set(done)
        out = np.zeros(len(done), STEP_TOTALS_DTYPE)
        for i, s in enumerate(done):
            t0, dur, tokens = self._spans.pop(s)
            n, ns, nbytes = self._comm.pop(s, (0, 0, 0))
            out[i] = (
                s,
                n,
                min(max(tokens, 0), 2**32 - 1),
                t0,
                dur,
                ns,
                nbytes,
                self._memory.pop(s, -1),
            )
        if done:
            self._last_emitted = max(self._last_emitted, done[-1])
            for table in (self._comm, self._memory):
                for s in [k for k in table if k <= self._last_emitted]:
                    del table[s]
        self.emitted += len(done)
        return out


__all__ = ["KEEP_OPEN", "StepTotals"]

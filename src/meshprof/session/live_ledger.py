"""The rank's cumulative time ledger for the live record (:attr:`RankLive.ledger_ns`): its wall
time since it started recording, split into the causes of the report's time ledger
(:class:`~meshprof.records.ledger.TimeCause`), the parts summing to the wall time exactly.

Each completed step is accounted once, by the report's own definition
(:func:`meshprof.analyze.steps.ledger.step_parts`, phase by phase, a record's new steps at once): its collectives are those
issued inside it, their union clipped to each top-level phase and per dimension, as the step
analysis measures them. Time outside the steps (before the first, between two, after the last
once the rank ended) is ``idle``; so are steps the monitor's bounded span buffer dropped before
they were seen (more than its capacity between two records). The ledger ends at the last
completed step's end: a step in progress is accounted when it ends, so no part ever goes down
(the exporter serves them as counters).

Cost: on the publisher thread, once per record, the new steps only; on the training thread, a
reference to each flushed chunk of events (as :class:`~.live_publish.LiveCounters`).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from meshprof.analyze.compute.intervals import clipped_total
from meshprof.analyze.steps.ledger import CAUSES, step_parts, whole_ns
from meshprof.analyze.steps.timeline import FB_PHASES, PhaseSpan, StepSpan, timeline_of_spans
from meshprof.events import FLAG_UNSAMPLED, PIPELINE_CHUNKS
from meshprof.records.ledger import TimeCause
from meshprof.records.live import RankLive

MAX_INTERVALS = 1_000_000
"""Collectives kept waiting for their step to end (the oldest go first)."""
MAX_CHUNKS = 256
"""Chunks queued between two records (~1,000 collectives each; beyond, the oldest go: their
communication counts as compute)."""
SCAN_ROWS = 50_000
"""Span rows looked at per record, newest first (older steps count as idle)."""
_STEP, _PHASE = 0, 1  # SPAN_KINDS


class LiveLedger:
    """Accounts a rank's completed steps into cumulative parts by cause (:meth:`fill`).

    ``counters``: the publisher's :class:`~.live_publish.LiveCounters` (for the recorder's log
    and the dimension of each group)."""

    def __init__(self, counters: Any) -> None:
        self.counters = counters
        self.parts: dict[str, int] = dict.fromkeys(CAUSES, 0)
        self.origin_ns = 0
        """Where the ledger starts (0: not yet)."""
        self.until_ns = 0
        """Where it ends: the end of the last accounted step."""
        self.last_step = -1
        """The last accounted step's number."""
        self._chunks: deque[np.ndarray] = deque(maxlen=MAX_CHUNKS)
        self._attached = False
        self._start = np.zeros(0, np.int64)
        self._end = np.zeros(0, np.int64)
        self._dim = np.zeros(0, np.int64)
        self._dims: list[str] = []

    def _on_chunk(self, chunk: np.ndarray) -> None:
        self._chunks.append(chunk)

    def fill(self, rec: RankLive, monitor: Any) -> None:
        """Account the steps completed since the last call and set ``rec.ledger_ns`` and
        ``rec.ledger_wall_ns`` (never raises: a failure leaves them as they were)."""
        try:
            self._fill(rec, monitor)
        except Exception:
            rec.internal_errors += 1

    def _fill(self, rec: RankLive, monitor: Any) -> None:
        if not self._attached:
            self._attached = True
            self.counters.prof.log.listeners.append(self._on_chunk)
        self._fold()
        steps = self._new_steps(monitor)
        if steps and self.origin_ns == 0:
            self.origin_ns = self.until_ns = min(rec.started_ns or steps[0][0][5], steps[0][0][5])
        taken = [self._take(row, phases, monitor) for row, phases in steps]
        self._account([x for x in taken if x is not None])
        if rec.status != "running":  # the last record: the tail is idle, stop listening
            if self.origin_ns and rec.updated_ns > self.until_ns:
                self.parts[TimeCause.IDLE] += rec.updated_ns - self.until_ns
                self.until_ns = rec.updated_ns
            if self._on_chunk in self.counters.prof.log.listeners:
                self.counters.prof.log.listeners.remove(self._on_chunk)
        if self.origin_ns:
            rec.ledger_ns = dict(self.parts)
            rec.ledger_wall_ns = self.until_ns - self.origin_ns

    def _fold(self) -> None:
        """Queued chunks → the collectives' (start, end, dimension) arrays, sorted by start."""
        starts, ends, dims = [self._start], [self._end], [self._dim]
        while self._chunks:
            c = self._chunks.popleft()
            ok = ((c["flags"] & FLAG_UNSAMPLED) == 0) & (c["duration_ns"] >= 0)
            if not ok.any():
                continue
            c = c[ok]
            s = c["start_ns"].astype(np.int64)
            codes = []
            for g in c["group"].tolist():
                d = self.counters.dim_of_group(int(g))
                if d not in self._dims:
                    self._dims.append(d)
                codes.append(self._dims.index(d))
            starts.append(s)
            ends.append(s + c["duration_ns"].astype(np.int64))
            dims.append(np.asarray(codes, dtype=np.int64))
        if len(starts) == 1:
            return
        s, e, d = np.concatenate(starts), np.concatenate(ends), np.concatenate(dims)
        order = np.argsort(s, kind="stable")[-MAX_INTERVALS:]
        self._start, self._end, self._dim = s[order], e[order], d[order]

    def _new_steps(self, monitor: Any) -> list[tuple[tuple[Any, ...], list[tuple[Any, ...]]]]:
        """The closed steps after :attr:`last_step` (SPAN rows) with their phases, oldest first."""
        rows = getattr(monitor, "span_rows", None)
        if rows is None:
            return []
        for _ in range(3):  # the training thread may append while we read: retry
            try:
                found: dict[int, tuple[Any, ...]] = {}
                phases: dict[int, list[tuple[Any, ...]]] = {}
                for i, row in enumerate(reversed(rows)):
                    st = int(row[4])
                    if i >= SCAN_ROWS or (row[0] == _STEP and st <= self.last_step):
                        break
                    if row[0] == _STEP and row[2] == 0:
                        found[st] = row
                    elif row[0] == _PHASE and st > self.last_step:
                        phases.setdefault(st, []).append(row)
                return [(found[k], phases.get(k, [])[::-1]) for k in sorted(found)]
            except RuntimeError:
                continue
        return []

    def _take(
        self, row: tuple[Any, ...], phase_rows: list[tuple[Any, ...]], mon: Any
    ) -> tuple[StepSpan, int, int] | None:
        """A completed step measured, the time since the ledger's end before it counted idle:
        (step, its part inside the ledger in ns, its duration in ns); None for a step that
        ended before the ledger began."""
        # SPAN row: (kind, status, depth, name, step, start_ns, duration_ns, tokens, samples, cpu)
        start, dur = int(row[5]), int(row[6])
        end = start + dur
        self.last_step = int(row[4])
        if end <= self.until_ns:  # (a step that ended before the ledger began)
            return None
        if start > self.until_ns:
            self.parts[TimeCause.IDLE] += start - self.until_ns
        st = self._step_span(row, phase_rows, getattr(mon, "span_names", []))
        kept = end - max(start, self.until_ns)
        self.until_ns = end
        self._drop_before(end)
        return st, kept, dur

    def _account(self, taken: list[tuple[StepSpan, int, int]]) -> None:
        """Add the steps' parts (:func:`~meshprof.analyze.steps.ledger.step_parts`, all the
        steps at once): a step that began before the ledger counts its part inside it, in
        proportion."""
        if not taken:
            return
        dims = tuple(self._dims)
        every = step_parts(timeline_of_spans([st for st, _, _ in taken], dims))
        for (_, kept, dur), row in zip(taken, every.tolist(), strict=True):
            parts = dict(zip(CAUSES, row, strict=True))
            if kept < dur:
                parts = {k: v * kept / dur for k, v in parts.items()}
            for k, v in whole_ns(parts, kept).items():
                self.parts[k] += v

    def _comm(self, lo: int, hi: int, a: int, b: int) -> tuple[int, tuple[int, ...]]:
        """Union of the collectives [lo:hi) inside [a, b), and per dimension."""
        s, e, d = self._start[lo:hi], self._end[lo:hi], self._dim[lo:hi]
        by_dim = tuple(clipped_total(s[d == k], e[d == k], a, b) for k in range(len(self._dims)))
        return clipped_total(s, e, a, b), by_dim

    def _step_span(
        self, row: tuple[Any, ...], phase_rows: list[tuple[Any, ...]], names: list[str]
    ) -> StepSpan:
        start, dur = int(row[5]), int(row[6])
        lo = int(np.searchsorted(self._start, start, side="left"))
        hi = int(np.searchsorted(self._start, start + dur, side="left"))
        comm, by_dim = self._comm(lo, hi, start, start + dur)
        phases = []
        for p in phase_rows:
            name = names[p[3]] if p[3] < len(names) else str(p[3])
            p0, pd, depth = int(p[5]), int(p[6]), int(p[2])
            pc, pdim = self._comm(lo, hi, p0, p0 + pd) if depth == 1 else (0, ())
            phases.append(
                PhaseSpan(
                    name=name,
                    start_ns=p0,
                    duration_ns=pd,
                    cpu_ns=int(p[9]),
                    depth=depth,
                    is_fb=name in FB_PHASES,
                    is_chunk=name in PIPELINE_CHUNKS,
                    comm_ns=pc,
                    comm_by_dim=pdim,
                    tp_ns=0,
                )
            )
        zeros = (0,) * len(self._dims)
        return StepSpan(
            step=int(row[4]),
            start_ns=start,
            duration_ns=dur,
            cpu_ns=int(row[9]),
            tokens=int(row[7]),
            samples=int(row[8]),
            comm_ns=comm,
            comm_by_dim=by_dim,
            count_by_dim=zeros,
            bytes_by_dim=zeros,
            phases=tuple(sorted(phases, key=lambda p: p.start_ns)),
        )

    def _drop_before(self, t_ns: int) -> None:
        """Forget the collectives issued before ``t_ns`` (their steps are accounted)."""
        k = int(np.searchsorted(self._start, t_ns, side="left"))
        if k:
            self._start, self._end, self._dim = self._start[k:], self._end[k:], self._dim[k:]


__all__ = ["LiveLedger"]

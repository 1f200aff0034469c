"""One rank's closed steps as its rank writes them, for the live exporter.

:class:`RankFeed` follows a rank folder (:class:`~meshprof.rundir.segment_tail.RankTail`),
keeps the phase and event rows of the steps still open, and hands out each step (a
:class:`~meshprof.live.otel.steps.PendingRankStep`, summarized when it is sent) once its step span has closed and ``grace_s`` more
seconds have passed (a collective issued in the step and completing just after it is counted).
What it keeps is bounded: the rows of at most :data:`KEEP_OPEN` steps. A serving rank's
finished requests are handed out as they are read (:meth:`RankFeed.take_requests`), on the
same clock as its steps.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from meshprof.analyze.run.events.clock import exchange_estimate
from meshprof.events import EVENT_DTYPE, SPAN_DTYPE
from meshprof.live.otel.request_spans import RequestRecord, request_records
from meshprof.live.otel.steps import PendingRankStep, RankTables
from meshprof.rundir.schema import resolve_layout
from meshprof.rundir.segment_tail import RankTail
from meshprof.rundir.segments import join_rows

KEEP_OPEN = 4096
"""Steps whose rows are kept at most while they are open or wait out their grace (the oldest
go first)."""
KEEP_EVENTS = 1_000_000
"""Event rows kept at most over those steps (54 MB; the oldest steps' go first, counted in
:attr:`RankFeed.dropped_events`)."""
_STEP_KIND = 0


class RankFeed:
    """A rank's closed steps, step by step (see the module docstring)."""

    def __init__(
        self, rank: int, path: str | os.PathLike[str], layout: object = None, grace_s: float = 1.0
    ) -> None:
        self.rank = rank
        self.tail = RankTail(Path(path), requests=True)
        self.layout = layout
        self.grace_s = grace_s
        self.tables = RankTables(rank=rank, layout=layout)
        self._meta_seen = False
        self._phases: dict[int, list[np.ndarray]] = {}
        self._events: dict[int, list[np.ndarray]] = {}
        self._closed: dict[int, tuple[np.void, float]] = {}  # step -> (its row, seen at)
        self._done = -1  # the newest step handed out
        self.late_events = 0
        """Events of steps already handed out (not in their step's figures)."""
        self.dropped_events = 0
        """Events let go to keep the feed's memory bounded (not in their step's figures)."""

    @property
    def node_id(self) -> str | None:
        """The launcher (node) the rank runs under, once its meta says (None before)."""
        meta = self.tail.meta()
        return None if meta is None else (meta.node_id or "")

    def poll(self, now: float, final: bool = False) -> list[PendingRankStep]:
        """Read what the rank appended; the steps ready now (all closed ones when ``final``)."""
        spans_parts: list[np.ndarray] = []
        events_parts: list[np.ndarray] = []
        for b in self.tail.poll():
            if len(b.spans):
                spans_parts.append(b.spans)
            if len(b.events):
                events_parts.append(b.events)
        spans = join_rows(spans_parts, SPAN_DTYPE)
        events = join_rows(events_parts, EVENT_DTYPE)
        if not self._meta_seen or not self.tables.knows(spans, events):
            self._refresh_tables()
        self._fold(spans, events, now)
        return self._ready(now, final)

    def take_requests(self) -> list[RequestRecord]:
        """The requests the rank finished that :meth:`poll` read since the last call (on the
        common clock: the rank's offset once its meta is read)."""
        rows, traces = self.tail.take_traced_requests()
        if not len(rows):
            return []
        return request_records(rows, self.rank, self.tables.offset_ns, traces)

    def _refresh_tables(self) -> None:
        meta = self.tail.meta()
        if meta is None:
            return
        self._meta_seen = True
        est = exchange_estimate(meta.clock_sync)
        offset = est[0] if est is not None else 0
        layout = self.layout if self.layout is not None else resolve_layout(meta)
        self.tables = RankTables.of(self.rank, meta, offset, layout)

    def _fold(self, spans: np.ndarray, events: np.ndarray, now: float) -> None:
        if len(spans):
            spans = spans[spans["step"] > self._done]
            for row in spans[(spans["kind"] == _STEP_KIND) & (spans["depth"] == 0)]:
                self._closed[int(row["step"])] = (row.copy(), now)
            _by_step(spans[spans["depth"] > 0], self._phases)
        if len(events):
            late = events["step"] <= self._done
            self.late_events += int(late.sum())
            _by_step(events[~late & (events["step"] >= 0)], self._events)
        for s in sorted(self._phases)[: max(len(self._phases) - KEEP_OPEN, 0)]:
            del self._phases[s]
        for s in sorted(self._events)[: max(len(self._events) - KEEP_OPEN, 0)]:
            self.dropped_events += sum(map(len, self._events.pop(s)))
        held = sum(len(x) for parts in self._events.values() for x in parts)
        for s in sorted(self._events):
            if held <= KEEP_EVENTS:
                break
            n = sum(map(len, self._events.pop(s)))
            held -= n
            self.dropped_events += n

    def _ready(self, now: float, final: bool) -> list[PendingRankStep]:
        out = []
        for s in sorted(self._closed):
            row, seen = self._closed[s]
            if not final and now - seen < self.grace_s:
                break
            del self._closed[s]
            phases = join_rows(self._phases.pop(s, []), SPAN_DTYPE)
            events = join_rows(self._events.pop(s, []), EVENT_DTYPE)
            out.append(PendingRankStep(row, phases, events, self.tables))
            self._done = max(self._done, s)
        if out:
            for table in (self._phases, self._events):
                for s in [k for k in table if k <= self._done]:
                    del table[s]
        return out


def _by_step(rows: np.ndarray, table: dict[int, list[np.ndarray]]) -> None:
    """Append ``rows`` to ``table`` step by step (one sort, one slice per step)."""
    if not len(rows):
        return
    rows = rows[np.argsort(rows["step"], kind="stable")]
    steps, first = np.unique(rows["step"], return_index=True)
    ends = [*first[1:].tolist(), len(rows)]
    for s, a, b in zip(steps.tolist(), first.tolist(), ends, strict=True):
        table.setdefault(int(s), []).append(rows[a:b])


__all__ = ["KEEP_EVENTS", "KEEP_OPEN", "RankFeed"]

"""What a rank writer appends of a serving rank's requests (:mod:`meshprof.rundir.writer`): the
requests finished and the tokens emitted since its last tick, read from the request monitor's
bounded rows (:class:`~meshprof.monitor.request_monitor.RequestMonitor`), as one serving chunk
of the rank's segments (:func:`~meshprof.rundir.segments.serving_payload`), with the
``traceparent`` of those requests that had one (parsed here, off the serving thread) as
REQUEST_TRACE_DTYPE rows in the same chunk as their request rows."""

from __future__ import annotations

from typing import Any

import numpy as np

from meshprof.events import REQUEST_DTYPE, REQUEST_TRACE_DTYPE, TOKEN_DTYPE
from meshprof.monitor.request_monitor import get_request_monitor
from meshprof.records.rank_meta import RankMeta
from meshprof.records.trace_context import trace_fields
from meshprof.rundir.row_tail import RowTail, rows_since
from meshprof.rundir.segments import serving_payload

MAX_PENDING_TRACES = 1 << 14
"""Trace rows kept at most for request rows not written yet (those of requests the monitor's
bounded rows let go are never written)."""


class ServingRows:
    """The rows a rank writer has not appended yet (one per writer; never raises by itself:
    the writer's tick catches what its store raises)."""

    def __init__(self) -> None:
        self.monitor: Any = None
        """The request monitor read (None: the process' active one, looked up every tick)."""
        self._requests = RowTail()
        self._tokens = RowTail()
        self._traces = RowTail()
        self._pending: dict[tuple[int, int], tuple[int, ...]] = {}
        self.invalid_traceparents = 0
        """``traceparent`` values that were not one (ignored: those requests have none)."""
        """Trace rows read whose request row is not written yet, by (id, arrival): the monitor
        appends a trace row just before its request row and the tick reads the request rows
        first, so a trace row is at most one tick ahead of its request row."""

    def current(self) -> Any:
        """The request monitor in effect (None: the process serves no requests)."""
        return self.monitor if self.monitor is not None else get_request_monitor()

    def append(self, store: Any, t0: int, final: bool) -> None:
        """Append what is new to ``store`` (a segment writer) as one serving chunk at ``t0``."""
        got = self.payload(final)
        if got is not None:
            store.append_serving(*got, t0)

    def counted(self, meta: RankMeta) -> RankMeta:
        """``meta`` with the request monitor's counts (``serving``), when there is one."""
        rm = self.current()
        if rm is None:
            return meta
        return meta.updated(
            serving={**rm.counters(), "invalid_traceparents": self.invalid_traceparents}
        )

    def payload(self, final: bool) -> tuple[bytes, int, int] | None:
        """(a serving chunk's payload, request rows, token rows) of what is new; at the last
        write (``final``) with the requests still running; None when nothing is."""
        rm = self.current()
        if rm is None:
            return None
        reqs = rows_since(rm.finished_rows, self._requests, REQUEST_DTYPE)
        toks = rows_since(rm.token_rows, self._tokens, TOKEN_DTYPE)
        trace_dq = getattr(rm, "trace_rows", None)  # (after the request rows: see _pending)
        if trace_dq is not None:
            self._parse(self._traces.new_rows(trace_dq))
        if final:
            running = rm.inflight_rows()
            if len(running):
                reqs = np.concatenate([reqs, running])
                more = getattr(rm, "inflight_traces", None)
                if more is not None:
                    self._parse(more())
        if not (len(reqs) or len(toks)):
            return None
        return serving_payload(reqs, toks, self._traces_of(reqs)), len(reqs), len(toks)

    def _parse(self, given: list[tuple[int, int, object]]) -> None:
        """Pend the trace rows of (id, arrival ns, ``traceparent`` as given)."""
        for rid, arrival, header in given:
            got = trace_fields(header)
            if got is None:
                self.invalid_traceparents += 1
            else:
                self._pending[(rid, arrival)] = (rid, arrival, *got)

    def _traces_of(self, reqs: np.ndarray) -> np.ndarray:
        """The pending trace rows of the requests ``reqs`` (taken out of the pending ones)."""
        pending = self._pending
        if not pending:
            return np.zeros(0, REQUEST_TRACE_DTYPE)
        got = []
        for key in zip(reqs["id"].tolist(), reqs["arrival_ns"].tolist(), strict=True):
            row = pending.pop(key, None)
            if row is not None:
                got.append(row)
        while len(pending) > MAX_PENDING_TRACES:  # (rows whose request was lost: oldest out)
            del pending[next(iter(pending))]
        return np.array(got, REQUEST_TRACE_DTYPE) if got else np.zeros(0, REQUEST_TRACE_DTYPE)


__all__ = ["ServingRows"]

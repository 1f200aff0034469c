"""What a rank writer appends of a serving rank's requests (:mod:`meshprof.rundir.writer`): the
requests finished and the tokens emitted since its last tick, read from the request monitor's
bounded rows (:class:`~meshprof.monitor.request_monitor.RequestMonitor`), as one serving chunk
of the rank's segments (:func:`~meshprof.rundir.segments.serving_payload`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from meshprof.events import REQUEST_DTYPE, TOKEN_DTYPE
from meshprof.monitor.request_monitor import get_request_monitor
from meshprof.records.rank_meta import RankMeta
from meshprof.rundir.row_tail import RowTail, rows_since
from meshprof.rundir.segments import serving_payload


class ServingRows:
    """The rows a rank writer has not appended yet (one per writer; never raises by itself:
    the writer's tick catches what its store raises)."""

    def __init__(self) -> None:
        self.monitor: Any = None
        """The request monitor read (None: the process' active one, looked up every tick)."""
        self._requests = RowTail()
        self._tokens = RowTail()

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
        return meta if rm is None else meta.updated(serving=rm.counters())

    def payload(self, final: bool) -> tuple[bytes, int, int] | None:
        """(a serving chunk's payload, request rows, token rows) of what is new; at the last
        write (``final``) with the requests still running; None when nothing is."""
        rm = self.current()
        if rm is None:
            return None
        reqs = rows_since(rm.finished_rows, self._requests, REQUEST_DTYPE)
        toks = rows_since(rm.token_rows, self._tokens, TOKEN_DTYPE)
        if final:
            running = rm.inflight_rows()
            if len(running):
                reqs = np.concatenate([reqs, running])
        if not (len(reqs) or len(toks)):
            return None
        return serving_payload(reqs, toks), len(reqs), len(toks)


__all__ = ["ServingRows"]

"""``RequestMonitor``: the requests a serving loop handles, as they move (collection only).

A serving loop tells the monitor what happens to each request, on its serving thread::

    rm = meshprof.requests()                   # the process' request monitor
    rid = rm.begin(prompt_tokens=len(prompt))  # the request arrived
    rm.scheduled(rid)                          # its prefill begins
    rm.tokens(running_ids)                     # one token for each running request, now
    rm.finish(rid, "length")                   # stop, length, abort or error

Several requests share a forward (continuous batching): :meth:`RequestMonitor.tokens` takes
every request that got a token in the step at one clock read. The monitor keeps, per request in
flight, its timestamps and counts (as vLLM's ``RequestStateStats``), and appends rows that the
rank writer and the live publisher read on their own threads: one :data:`TOKEN_DTYPE` row per
emission, one :data:`REQUEST_DTYPE` row when the request finishes. It computes nothing else
(the intervals are the analysis', defined once in docs/definitions.md).

Cost on the serving thread: a clock read per call and a tuple appended per request and
emission (benchmarks/request_api_cost.py). Memory is bounded: the rows wait in bounded deques
(the writer appends them to the rank's segments every tick), and at most ``max_inflight``
requests are tracked (the oldest are forgotten beyond it, and counted). Never raises into the
serving loop: a call about an unknown request is counted and ignored.

A request may come with its caller's W3C ``traceparent`` header (``begin(...,
traceparent=header)``): kept as given with the request's state (a reference: nothing is parsed
on the serving thread), handed with its finished row to the rank writer, which parses it
(:func:`~meshprof.records.trace_context.parse_traceparent`; a malformed one is counted and
ignored) and stores a REQUEST_TRACE_DTYPE row next to the request's, so that its OpenTelemetry
span is the caller's child (docs/opentelemetry.md).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable
from types import TracebackType
from typing import Any

import numpy as np

from meshprof.events import FINISH_CODES, REQUEST_DTYPE, TOKEN_DTYPE

_active: RequestMonitor | None = None
_lock = threading.Lock()

MAX_ROWS = 1 << 18
"""Token rows kept for the writer and the live publisher at most: more than a tick's worth at
any realistic rate (they read them every half second and every second)."""
MAX_FINISHED = 1 << 14
"""Finished-request rows kept for them at most (16,384 requests finishing within a second:
beyond any one server's rate)."""
MAX_INFLIGHT = 100_000
"""Requests tracked at once at most (a loop that never finishes its requests stays bounded)."""

_ARRIVAL, _QUEUED, _SCHEDULED, _FIRST, _LAST, _PROMPT, _OUT, _TRACE = range(8)
_UNFINISHED = FINISH_CODES["unfinished"]


def get_request_monitor() -> RequestMonitor | None:
    """The process' request monitor, None until a serving loop (or the Hugging Face
    ``generate()`` integration) made one."""
    return _active


def requests() -> RequestMonitor:
    """The process' request monitor, made on first use (``meshprof.requests()``)."""
    global _active
    rm = _active
    if rm is None:
        with _lock:
            rm = _active
            if rm is None:
                rm = _active = RequestMonitor()
    return rm


def forget_request_monitor() -> None:
    """No request monitor any more (``meshprof.reset()``)."""
    global _active
    _active = None


class RequestMonitor:
    """The requests of one serving process (see the module docstring)."""

    def __init__(
        self,
        *,
        max_rows: int = MAX_ROWS,
        max_finished: int = MAX_FINISHED,
        max_inflight: int = MAX_INFLIGHT,
    ) -> None:
        global _active
        self._states: dict[int, list[Any]] = {}
        self._token_rows: deque[tuple[int, int, int]] = deque(maxlen=max(int(max_rows), 1))
        self._finished_rows: deque[tuple[Any, ...]] = deque(maxlen=max(int(max_finished), 1))
        self._trace_rows: deque[tuple[int, int, Any]] = deque(maxlen=max(int(max_finished), 1))
        self.max_inflight = max(int(max_inflight), 1)
        self._next_id = 0
        self.begun = 0
        """Requests begun so far."""
        self.finished = 0
        """Requests finished so far (every reason)."""
        self.by_reason = dict.fromkeys(FINISH_CODES, 0)
        """Requests finished so far by reason."""
        self.prompt_tokens = 0
        """Prompt tokens of the requests begun so far."""
        self.output_tokens = 0
        """Output tokens emitted so far."""
        self.scheduled_count = 0
        """Requests begun that were scheduled (or emitted a token) so far."""
        self.forgotten = 0
        """Requests dropped unfinished beyond ``max_inflight``."""
        self.unknown = 0
        """Calls about a request the monitor does not track (ignored)."""
        self.traceparents = 0
        """Requests begun with a ``traceparent`` (valid or not: the rank writer parses it)."""
        _active = self

    # -- recording (the serving thread) ---------------------------------------------------------
    def begin(
        self,
        prompt_tokens: int = 0,
        *,
        request_id: int | None = None,
        arrival_ns: int | None = None,
        traceparent: str | None = None,
    ) -> int:
        """A request arrived (now, or at ``arrival_ns``, wall clock ns) with ``prompt_tokens``
        tokens; returns its id (``request_id`` when given: a non-negative integer unique among
        the requests in flight). ``traceparent``: the W3C header the request came with
        (``00-<trace id>-<span id>-<flags>``): its span becomes that caller's child; a value
        that is not one is ignored (the rank writer counts it)."""
        t = time.time_ns() if arrival_ns is None else int(arrival_ns)
        if traceparent is not None:
            self.traceparents += 1
        if request_id is None:
            rid = self._next_id
            self._next_id += 1
        else:
            rid = int(request_id)
            if rid >= self._next_id:
                self._next_id = rid + 1
        states = self._states
        if len(states) >= self.max_inflight:
            try:
                del states[next(iter(states))]
                self.forgotten += 1
            except (StopIteration, RuntimeError, KeyError):
                pass
        states[rid] = [t, t, -1, -1, -1, int(prompt_tokens), 0, traceparent]
        self.begun += 1
        self.prompt_tokens += int(prompt_tokens)
        return rid

    def queued(self, rid: int, t_ns: int | None = None) -> None:
        """The request entered the scheduler's queue (default: at its arrival)."""
        st = self._states.get(rid)
        if st is None:
            self.unknown += 1
            return
        st[_QUEUED] = time.time_ns() if t_ns is None else int(t_ns)

    def scheduled(self, rid: int, t_ns: int | None = None) -> None:
        """The request was scheduled for the first time: its prefill begins (later calls, a
        resumption after preemption, are ignored)."""
        st = self._states.get(rid)
        if st is None:
            self.unknown += 1
            return
        if st[_SCHEDULED] < 0:
            st[_SCHEDULED] = time.time_ns() if t_ns is None else int(t_ns)
            if st[_FIRST] < 0:
                self.scheduled_count += 1

    def token(self, rid: int, n: int = 1) -> None:
        """``n`` output tokens of the request were emitted now (its first call: the first
        token)."""
        # tokens()' bookkeeping inline: one call per token on the serving thread, where
        # delegating to tokens((rid,), n) costs about 160 ns more (benchmarks/request_api_cost.py)
        t = time.time_ns()
        st = self._states.get(rid)
        if st is None:
            self.unknown += 1
            return
        if st[_FIRST] < 0:
            st[_FIRST] = t
            if st[_SCHEDULED] < 0:
                self.scheduled_count += 1
        st[_LAST] = t
        st[_OUT] += n
        self.output_tokens += n
        self._token_rows.append((rid, t, n))

    def tokens(self, rids: Iterable[int], n: int = 1) -> None:
        """``n`` tokens for each of ``rids`` emitted at one instant (a batched serving step)."""
        t = time.time_ns()
        states = self._states
        append = self._token_rows.append
        k = 0
        for rid in rids:
            st = states.get(rid)
            if st is None:
                self.unknown += 1
                continue
            if st[_FIRST] < 0:
                st[_FIRST] = t
                if st[_SCHEDULED] < 0:
                    self.scheduled_count += 1
            st[_LAST] = t
            st[_OUT] += n
            append((rid, t, n))
            k += 1
        self.output_tokens += k * n

    def finish(self, rid: int, reason: str = "stop") -> None:
        """The request ended: ``reason`` is ``stop``, ``length``, ``abort`` or ``error``."""
        t = time.time_ns()
        st = self._states.pop(rid, None)
        if st is None:
            self.unknown += 1
            return
        code = FINISH_CODES.get(reason)
        if code is None or code == _UNFINISHED:
            code = FINISH_CODES["error"]
            reason = "error"
        if st[_SCHEDULED] < 0 and st[_FIRST] < 0:
            self.scheduled_count += 1  # (it leaves the waiting requests)
        if st[_TRACE] is not None:  # (before its request row: the writer reads that one first)
            self._trace_rows.append((rid, st[_ARRIVAL], st[_TRACE]))
        self._finished_rows.append(
            (rid, st[_ARRIVAL], st[_QUEUED], st[_SCHEDULED], st[_FIRST], st[_LAST], t,
             st[_PROMPT], st[_OUT], code)
        )  # fmt: skip
        self.finished += 1
        self.by_reason[reason] += 1

    def request(
        self,
        prompt_tokens: int = 0,
        *,
        request_id: int | None = None,
        traceparent: str | None = None,
    ) -> Request:
        """A context manager around one request: begun on entry; finished on exit with the
        reason set on it (``stop`` by default), or ``error`` when the block raised."""
        return Request(self, prompt_tokens, request_id, traceparent)

    # -- reading (other threads) ----------------------------------------------------------------
    @property
    def token_rows(self) -> deque[tuple[int, int, int]]:
        """Emissions as TOKEN_DTYPE tuples, oldest first (bounded; read it, never change it)."""
        return self._token_rows

    @property
    def finished_rows(self) -> deque[tuple[Any, ...]]:
        """Finished requests as REQUEST_DTYPE tuples, oldest first (bounded; read-only)."""
        return self._finished_rows

    @property
    def trace_rows(self) -> deque[tuple[int, int, Any]]:
        """(id, arrival ns, ``traceparent`` as given) of the finished requests that had one,
        oldest first, each appended just before its request's row (bounded; read-only)."""
        return self._trace_rows

    @property
    def running(self) -> int:
        """Requests scheduled (or emitting) and not finished."""
        return max(self.scheduled_count - self.finished, 0)

    @property
    def waiting(self) -> int:
        """Requests begun and neither scheduled nor emitting yet."""
        return max(self.begun - self.forgotten - self.scheduled_count, 0)

    def inflight_rows(self) -> np.ndarray:
        """The requests in flight as REQUEST_DTYPE rows of reason ``unfinished`` (finish time
        -1): what the rank writer's last write stores of them."""
        for _ in range(3):  # the serving thread may change the dict meanwhile: retry
            try:
                items = list(self._states.items())
                break
            except RuntimeError:
                continue
        else:
            return np.zeros(0, REQUEST_DTYPE)
        rows = [
            (rid, s[_ARRIVAL], s[_QUEUED], s[_SCHEDULED], s[_FIRST], s[_LAST], -1, s[_PROMPT],
             s[_OUT], _UNFINISHED)
            for rid, s in items
        ]  # fmt: skip
        return np.array(rows, REQUEST_DTYPE) if rows else np.zeros(0, REQUEST_DTYPE)

    def inflight_traces(self) -> list[tuple[int, int, Any]]:
        """(id, arrival ns, ``traceparent`` as given) of the requests in flight that had one:
        those of :meth:`inflight_rows`."""
        for _ in range(3):
            try:
                items = list(self._states.items())
                break
            except RuntimeError:
                continue
        else:
            return []
        return [(rid, s[_ARRIVAL], s[_TRACE]) for rid, s in items if s[_TRACE] is not None]

    def counters(self) -> dict[str, int]:
        """The monitor's counts for a rank meta (``serving``)."""
        return {
            "requests_begun": self.begun,
            "requests_finished": self.finished,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "requests_forgotten": self.forgotten,
            "unknown_calls": self.unknown,
            "traceparents": self.traceparents,
        }


class Request:
    """One request as a context manager (:meth:`RequestMonitor.request`)."""

    __slots__ = ("id", "monitor", "prompt_tokens", "reason", "request_id", "traceparent")

    def __init__(
        self,
        monitor: RequestMonitor,
        prompt_tokens: int,
        request_id: int | None,
        traceparent: str | None = None,
    ) -> None:
        self.monitor = monitor
        self.prompt_tokens = prompt_tokens
        self.request_id = request_id
        self.traceparent = traceparent
        self.id = -1
        self.reason = "stop"
        """The reason the request finishes with on a normal exit."""

    def __enter__(self) -> Request:
        self.id = self.monitor.begin(
            self.prompt_tokens, request_id=self.request_id, traceparent=self.traceparent
        )
        return self

    def __exit__(
        self,
        etype: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.monitor.finish(self.id, "error" if value is not None else self.reason)

    def scheduled(self) -> None:
        """Its prefill begins now."""
        self.monitor.scheduled(self.id)

    def token(self, n: int = 1) -> None:
        """``n`` of its tokens were emitted now."""
        self.monitor.token(self.id, n)


__all__ = [
    "MAX_FINISHED",
    "MAX_INFLIGHT",
    "MAX_ROWS",
    "TOKEN_DTYPE",
    "Request",
    "RequestMonitor",
    "forget_request_monitor",
    "get_request_monitor",
    "requests",
]

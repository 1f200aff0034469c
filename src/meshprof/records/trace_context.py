"""W3C Trace Context: the ``traceparent`` header a caller sends with a request.

``00-<32 hex trace id>-<16 hex parent span id>-<2 hex flags>``
(https://www.w3.org/TR/trace-context/#traceparent-header). A serving script hands the header of
an incoming request to :meth:`~meshprof.monitor.request_monitor.RequestMonitor.begin`; the
request's span in an OpenTelemetry backend is then that caller's child, in the caller's trace.
Parsed here, below every layer that needs it: the request API on the serving thread, the
exporters reading it back from a run directory.
"""

from __future__ import annotations

import re

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_MASK64 = (1 << 64) - 1


def parse_traceparent(value: object) -> tuple[int, int, int] | None:
    """(trace id, parent span id, flags) of a W3C ``traceparent`` header; None when ``value``
    is not one: not a string, another shape, version ``ff``, or an all-zero id. Never raises
    (a serving loop hands it what the client sent)."""
    if not isinstance(value, str) or len(value) > 256:
        return None
    m = _TRACEPARENT.fullmatch(value.strip().lower())
    if m is None or m.group(1) == "ff":
        return None
    trace, span = int(m.group(2), 16), int(m.group(3), 16)
    if not trace or not span:
        return None
    return trace, span, int(m.group(4), 16)


def traceparent_text(trace_id: int, span_id: int, flags: int) -> str:
    """The ``traceparent`` header (version 00) of a trace id (128 bits), a parent span id
    (64 bits) and the trace flags (8 bits)."""
    return f"00-{trace_id:032x}-{span_id:016x}-{flags & 0xFF:02x}"


def split_trace_id(trace_id: int) -> tuple[int, int]:
    """A 128-bit trace id as (high, low) 64-bit halves (how a segment stores it)."""
    return (trace_id >> 64) & _MASK64, trace_id & _MASK64


def join_trace_id(high: int, low: int) -> int:
    """The 128-bit trace id of its (high, low) 64-bit halves."""
    return ((int(high) & _MASK64) << 64) | (int(low) & _MASK64)


__all__ = ["join_trace_id", "parse_traceparent", "split_trace_id", "traceparent_text"]

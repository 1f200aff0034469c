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

_TRACEPARENT = re.compile(
    r"^[ \t]*([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:(-.*)|[ \t]*)$"
)
"""The header's grammar (lowercase hex only; a later version may append fields)."""
MAX_LENGTH = 512
"""Longer values are not read (as OpenTelemetry's propagator)."""
_MASK64 = (1 << 64) - 1


def parse_traceparent(value: object) -> tuple[int, int, int] | None:
    """(trace id, parent span id, flags) of a W3C ``traceparent`` header; None when ``value``
    is not a valid one: not a string, another shape, upper-case hex, version ``ff``, version
    ``00`` with more fields, or an all-zero id (the rules of the W3C recommendation, as
    OpenTelemetry's ``TraceContextTextMapPropagator`` applies them). Never raises (a serving
    loop hands it what the client sent)."""
    if not isinstance(value, str) or len(value) > MAX_LENGTH:
        return None
    m = _TRACEPARENT.match(value)
    if m is None:
        return None
    version = m.group(1)
    if version == "ff" or (version == "00" and m.group(5)):
        return None
    trace, span = int(m.group(2), 16), int(m.group(3), 16)
    if not trace or not span:
        return None
    return trace, span, int(m.group(4), 16)


def trace_fields(value: object) -> tuple[int, int, int, int] | None:
    """(trace id high 64 bits, low 64 bits, parent span id, flags) of a ``traceparent`` (how a
    segment stores it); None when it is not a valid one."""
    got = parse_traceparent(value)
    if got is None:
        return None
    return (got[0] >> 64) & _MASK64, got[0] & _MASK64, got[1], got[2]


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


__all__ = [
    "MAX_LENGTH",
    "join_trace_id",
    "parse_traceparent",
    "split_trace_id",
    "trace_fields",
    "traceparent_text",
]

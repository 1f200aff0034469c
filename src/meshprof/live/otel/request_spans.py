"""A served request as an OpenTelemetry span, under the GenAI semantic conventions.

One :class:`RequestRecord` (what a serving loop knows when a request finishes) becomes one
``SERVER`` span named ``{gen_ai.operation.name} {gen_ai.request.model}``, from the request's
arrival to its last token, with the conventions' attributes (operation, provider, model,
response id, input and output tokens, finish reasons, ``error.type``) and meshprof's figures
of it (time to first token, time per output token, queue time; seconds). When the request came
with a W3C ``traceparent`` header, the span is that caller's child (a remote parent, its trace
flags kept), in the caller's trace: a slow request shows under the client's own span. Otherwise
it starts a trace of its own, its trace id derived from the run id and the request id. Either
way its span id is derived from the run id, the rank and the request id: stable however often it
is sent (the live exporter and ``meshprof export`` send the same ids), and one span per rank of
a tensor-parallel ``generate()``, whose ranks each record the same requests.

:func:`request_records` reads a serving rank's REQUEST_DTYPE rows (its segments' serving
chunks) into records, with the REQUEST_TRACE_DTYPE rows of the requests that came with a
``traceparent`` (``RequestMonitor.begin(..., traceparent=...)``).

Definitions are ``vllm bench serve``'s: TTFT = first token − arrival; TPOT = (E2E − TTFT) /
(output tokens − 1), for requests of more than one output token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from meshprof.events import FINISH_CODES, FINISH_REASONS
from meshprof.live.otel.spans import (
    AttrValue,
    SpanContextInfo,
    derived_id,
    finished_span,
    local_context,
)
from meshprof.records.trace_context import join_trace_id, parse_traceparent, traceparent_text


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """A finished request, as the serving rank saw it (wall clock, ns)."""

    request_id: str
    """The request's id (``gen_ai.response.id``)."""
    rank: int
    """The rank that served it (the scheduler's)."""
    arrival_ns: int
    """When it arrived."""
    end_ns: int
    """When it finished: its last token was emitted, or it failed."""
    first_token_ns: int = 0
    """When its first token was emitted (0: none)."""
    scheduled_ns: int = 0
    """When it was first scheduled (0: unknown): the queue time ends there."""
    prompt_tokens: int = 0
    """Input tokens (``gen_ai.usage.input_tokens``)."""
    output_tokens: int = 0
    """Output tokens (``gen_ai.usage.output_tokens``)."""
    finish_reason: str = "stop"
    """``stop``, ``length``, ``abort`` or ``error``."""
    error_type: str = ""
    """Why it failed (``error.type``), "" when it did not."""
    operation: str = "text_completion"
    """``gen_ai.operation.name``."""
    provider: str = "meshprof"
    """``gen_ai.provider.name``: the serving framework."""
    model: str = ""
    """``gen_ai.request.model``."""
    traceparent: str = ""
    """The incoming request's W3C ``traceparent`` header ("" when it had none)."""

    @property
    def ttft_ns(self) -> int | None:
        """Time to first token (None without a first token)."""
        return self.first_token_ns - self.arrival_ns if self.first_token_ns else None

    @property
    def tpot_ns(self) -> float | None:
        """Time per output token after the first (None for fewer than two tokens)."""
        ttft = self.ttft_ns
        if ttft is None or self.output_tokens < 2:
            return None
        return (self.end_ns - self.arrival_ns - ttft) / (self.output_tokens - 1)


def request_attributes(rec: RequestRecord) -> dict[str, AttrValue]:
    """The span's attributes (see the module docstring)."""
    out: dict[str, AttrValue] = {
        "gen_ai.operation.name": rec.operation,
        "gen_ai.provider.name": rec.provider,
        "gen_ai.response.id": rec.request_id,
        "gen_ai.usage.input_tokens": rec.prompt_tokens,
        "gen_ai.usage.output_tokens": rec.output_tokens,
        "gen_ai.response.finish_reasons": (rec.finish_reason,),
        "meshprof.rank": rec.rank,
    }
    if rec.model:
        out["gen_ai.request.model"] = rec.model
    if rec.error_type:
        out["error.type"] = rec.error_type
    if rec.ttft_ns is not None:
        out["meshprof.request.time_to_first_token"] = rec.ttft_ns / 1e9
    if rec.tpot_ns is not None:
        out["meshprof.request.time_per_output_token"] = rec.tpot_ns / 1e9
    if rec.scheduled_ns:
        out["meshprof.request.queue_time"] = (rec.scheduled_ns - rec.arrival_ns) / 1e9
    return out


def request_span(rec: RequestRecord, info: SpanContextInfo) -> Any:
    """The request's ``SERVER`` span (see the module docstring)."""
    from opentelemetry import trace

    parent = None
    got = parse_traceparent(rec.traceparent) if rec.traceparent else None
    if got is not None:
        tid = got[0]
        parent = trace.SpanContext(
            trace_id=tid, span_id=got[1], is_remote=True, trace_flags=trace.TraceFlags(got[2])
        )
    else:
        tid = derived_id(128, "meshprof-request", info.run_id, rec.request_id)
    ctx = local_context(
        tid, derived_id(64, "meshprof-request-span", info.run_id, rec.rank, rec.request_id)
    )
    status = (
        trace.Status(trace.StatusCode.ERROR, rec.error_type)
        if rec.error_type
        else trace.Status(trace.StatusCode.UNSET)
    )
    name = f"{rec.operation} {rec.model}" if rec.model else rec.operation
    return finished_span(
        info,
        name,
        ctx,
        parent,
        request_attributes(rec),
        rec.arrival_ns,
        max(rec.end_ns, rec.arrival_ns),
        status,
        kind=trace.SpanKind.SERVER,
    )


ERROR_TYPE = "_OTHER"
"""``error.type`` of a request that finished with ``error`` (the request API says it failed, not
why: the conventions' fallback value)."""
_UNFINISHED = FINISH_CODES["unfinished"]


def traceparents(traces: np.ndarray | None) -> dict[tuple[int, int], str]:
    """The ``traceparent`` headers of REQUEST_TRACE_DTYPE rows, by (request id, arrival ns on
    the rank's clock)."""
    if traces is None or not len(traces):
        return {}
    return {
        (rid, arrival): traceparent_text(join_trace_id(hi, lo), span, flags)
        for rid, arrival, hi, lo, span, flags in traces.tolist()
    }


def request_records(
    rows: np.ndarray, rank: int, offset_ns: int = 0, traces: np.ndarray | None = None
) -> list[RequestRecord]:
    """The finished requests among REQUEST_DTYPE ``rows`` of ``rank`` (its own clock, plus
    ``offset_ns`` to the common one); the rows still running at the rank's last write
    (``unfinished``) are not requests that finished and are left out. ``traces``: the
    REQUEST_TRACE_DTYPE rows of those that came with a ``traceparent``."""
    parents = traceparents(traces)
    out = []
    for r in rows[rows["reason"] != _UNFINISHED].tolist():
        rid, arrival, _queued, sched, first, _last, finished, prompt, output, code = r
        reason = FINISH_REASONS[code] if code < len(FINISH_REASONS) else "error"
        out.append(
            RequestRecord(
                request_id=str(rid),
                rank=rank,
                arrival_ns=arrival + offset_ns,
                end_ns=max(finished, arrival) + offset_ns,
                first_token_ns=first + offset_ns if first >= 0 else 0,
                scheduled_ns=sched + offset_ns if sched >= 0 else 0,
                prompt_tokens=int(prompt),
                output_tokens=int(output),
                finish_reason=reason,
                error_type=ERROR_TYPE if reason == "error" else "",
                traceparent=parents.get((rid, arrival), "") if parents else "",
            )
        )
    return out


__all__ = [
    "ERROR_TYPE",
    "RequestRecord",
    "parse_traceparent",
    "request_attributes",
    "request_records",
    "request_span",
    "traceparents",
]

"""Steps, alerts, captures and findings as OpenTelemetry spans (the SDK's ``ReadableSpan``,
built with their own times and ids, as they happened: nothing is timed here).

The trace of a step::

    step                    one per job step (the launcher of node 0 sends it): the ranks'
    │                       span across them; alerts and captures of the step as events
    ├── rank step           one per rank: its collectives summarized in attributes
    │   ├── forward         its phases, nested as they were
    │   │   └── ...
    │   └── optimizer
    └── rank step ...

Ids are derived from the run id, the step and the rank (:func:`trace_id`, :func:`span_id`), so
the launchers of several nodes put their ranks' steps in one trace under one root without
talking to each other, and an alert raised after its step was sent finds the step's trace: it
goes there as a short ``alert`` span of its own, child of the step, carrying the event.
Durations in attributes are in seconds (doubles), as OpenTelemetry's duration metrics are.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from meshprof.live.otel.steps import JobStep, RankStep, SlowestCollective

AttrValue = str | bool | int | float | tuple[int, ...] | tuple[str, ...]

STEP_SPAN = "step"
"""The job step's span name."""
RANK_SPAN = "rank step"
"""A rank's step's span name."""
RUN_SPAN = "run"
"""A finished run's span (``meshprof export --format otlp``): the findings as its events."""
ALERT_EVENT = "meshprof.alert"
CAPTURE_EVENT = "meshprof.capture"
FINDING_EVENT = "meshprof.finding"


def derived_id(bits: int, *parts: object) -> int:
    """A ``bits``-bit id (never 0) derived from ``parts``: the same parts give the same id on
    every node and every time."""
    h = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=bits // 8)
    return int.from_bytes(h.digest(), "big") or 1


def trace_id(run_id: str, step: int) -> int:
    """The trace of step ``step`` of run ``run_id`` (128 bits)."""
    return derived_id(128, "meshprof-step", run_id, step)


def span_id(run_id: str, step: int, rank: int | None = None, phase: int | None = None) -> int:
    """The span of the job step (``rank`` None), of a rank's step, or of its phase ``phase``
    (its index in the step's phases), 64 bits."""
    return derived_id(64, "meshprof-span", run_id, step, rank, phase)


@dataclass(frozen=True, slots=True)
class StepEvent:
    """Something that happened in a step: an alert or a capture, as a span event."""

    name: str
    """:data:`ALERT_EVENT` or :data:`CAPTURE_EVENT`."""
    step: int
    """The step it belongs to."""
    t_ns: int
    """When (common clock)."""
    attributes: dict[str, AttrValue] = field(default_factory=dict)
    """What it says."""


@dataclass(frozen=True, slots=True)
class SpanContextInfo:
    """What every span of one exporter shares."""

    run_id: str
    """The run's id (the ids derive from it)."""
    resource: Any
    """The SDK ``Resource`` of the job."""
    scope: Any
    """The SDK ``InstrumentationScope`` (meshprof and its version)."""


def _sdk() -> Any:
    from opentelemetry import trace
    from opentelemetry.sdk import trace as sdk_trace

    return trace, sdk_trace


def _ctx(trace: Any, tid: int, sid: int) -> Any:
    """The sampled, local ``SpanContext`` of span ``sid`` in trace ``tid``."""
    return trace.SpanContext(
        trace_id=tid,
        span_id=sid,
        is_remote=False,
        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
    )


def local_context(tid: int, sid: int) -> Any:
    """The sampled, local ``SpanContext`` of span ``sid`` in trace ``tid`` (ids as ints)."""
    trace, _ = _sdk()
    return _ctx(trace, tid, sid)


def finished_span(
    info: SpanContextInfo,
    name: str,
    context: Any,
    parent: Any,
    attributes: dict[str, AttrValue],
    start_ns: int,
    end_ns: int,
    status: Any,
    events: Sequence[Any] = (),
    kind: Any = None,
) -> Any:
    """A finished SDK ``ReadableSpan`` of this exporter (its resource and instrumentation
    scope, from ``info``); ``kind`` None: ``INTERNAL``; times in ns."""
    trace, sdk_trace = _sdk()
    return sdk_trace.ReadableSpan(
        name=name,
        context=context,
        parent=parent,
        resource=info.resource,
        attributes=attributes,
        events=events,
        kind=trace.SpanKind.INTERNAL if kind is None else kind,
        start_time=start_ns,
        end_time=end_ns,
        status=status,
        instrumentation_scope=info.scope,
    )


def _s(ns: int) -> float:
    return ns / 1e9


def collective_attributes(prefix: str, c: SlowestCollective) -> dict[str, AttrValue]:
    """A slowest collective as attributes under ``prefix``."""
    out: dict[str, AttrValue] = {
        f"{prefix}.op": c.op,
        f"{prefix}.group": c.group,
        f"{prefix}.dim": c.dim,
        f"{prefix}.seq": c.seq,
        f"{prefix}.duration": _s(c.duration_ns),
        f"{prefix}.rank": c.rank,
        f"{prefix}.members": c.members,
    }
    if c.peer >= 0:
        out[f"{prefix}.peer"] = c.peer
    if c.last_arrival_rank >= 0:
        out[f"{prefix}.last_arrival.rank"] = c.last_arrival_rank
        out[f"{prefix}.arrival_skew"] = _s(c.arrival_skew_ns)
    out[f"{prefix}.members_seen"] = c.members_seen
    return out


def rank_attributes(rs: RankStep) -> dict[str, AttrValue]:
    """A rank's step as attributes."""
    c = rs.collectives
    out: dict[str, AttrValue] = {
        "meshprof.rank": rs.rank,
        "meshprof.node": rs.host,
        "meshprof.step": rs.step,
        "meshprof.collectives.count": c.count,
        "meshprof.collectives.time": _s(c.comm_ns),
        "meshprof.collectives.exposed_time": _s(c.exposed_ns),
    }
    if rs.cpu_ns >= 0:
        out["meshprof.step.cpu_time"] = _s(rs.cpu_ns)
    if rs.tokens:
        out["meshprof.step.tokens"] = rs.tokens
    if rs.samples:
        out["meshprof.step.samples"] = rs.samples
    if c.slowest is not None:
        out.update(collective_attributes("meshprof.collectives.slowest", c.slowest))
    return out


def _event(sdk_trace: Any, ev: StepEvent) -> Any:
    return sdk_trace.Event(ev.name, dict(ev.attributes), timestamp=ev.t_ns)


def step_spans(
    job: JobStep, info: SpanContextInfo, events: Sequence[StepEvent] = (), root: bool = True
) -> list[Any]:
    """The spans of one job step: its root (with ``root``: the step's first part; ``events``
    go on it), and each rank's step with its phases."""
    trace, sdk_trace = _sdk()
    tid = trace_id(info.run_id, job.step)
    root_ctx = _ctx(trace, tid, span_id(info.run_id, job.step))
    ok = trace.Status(trace.StatusCode.UNSET)
    out = []
    if root:
        slowest_rank = job.slowest_rank
        attrs: dict[str, AttrValue] = {
            "meshprof.step": job.step,
            "meshprof.ranks": len(job.ranks),
            "meshprof.sampled": tuple(job.reasons),
            "meshprof.step.slowest_rank": slowest_rank.rank,
            "meshprof.step.slowest_rank.duration": _s(slowest_rank.duration_ns),
        }
        if job.slowest is not None:
            attrs.update(collective_attributes("meshprof.collectives.slowest", job.slowest))
        out.append(
            finished_span(
                info,
                STEP_SPAN,
                root_ctx,
                None,
                attrs,
                job.start_ns,
                job.end_ns,
                ok,
                events=[_event(sdk_trace, e) for e in sorted(events, key=lambda e: e.t_ns)],
            )
        )
    for rs in job.ranks:
        sid = span_id(info.run_id, job.step, rs.rank)
        ctx = _ctx(trace, tid, sid)
        err = trace.Status(trace.StatusCode.ERROR, "the step raised") if rs.error else ok
        out.append(
            finished_span(
                info, RANK_SPAN, ctx, root_ctx, rank_attributes(rs), rs.start_ns, rs.end_ns, err
            )
        )
        for i, ph in enumerate(rs.phases):
            parent = ctx if ph.parent < 0 else _ctx(trace, tid, _phase(info, job, rs, ph.parent))
            out.append(
                finished_span(
                    info,
                    ph.name,
                    _ctx(trace, tid, _phase(info, job, rs, i)),
                    parent,
                    {"meshprof.rank": rs.rank, "meshprof.step": job.step},
                    ph.start_ns,
                    ph.start_ns + ph.duration_ns,
                    trace.Status(trace.StatusCode.ERROR, "the phase raised") if ph.error else ok,
                )
            )
    return out


def _phase(info: SpanContextInfo, job: JobStep, rs: RankStep, i: int) -> int:
    return span_id(info.run_id, job.step, rs.rank, i)


def event_span(ev: StepEvent, info: SpanContextInfo, under_root: bool = True) -> Any:
    """A late event (its step's root already sent, or its step not sent) as a zero-length span
    in the step's trace carrying the event: the child of the step's root (``under_root``, the
    step was sent), else the trace's only span."""
    trace, sdk_trace = _sdk()
    tid = trace_id(info.run_id, ev.step)
    kind = "alert" if ev.name == ALERT_EVENT else "capture"
    return finished_span(
        info,
        kind,
        _ctx(trace, tid, derived_id(64, "meshprof-event", info.run_id, ev.step, ev.t_ns, ev.name)),
        _ctx(trace, tid, span_id(info.run_id, ev.step)) if under_root else None,
        {"meshprof.step": ev.step},
        ev.t_ns,
        ev.t_ns,
        trace.Status(trace.StatusCode.UNSET),
        events=[_event(sdk_trace, ev)],
    )


def run_span(
    info: SpanContextInfo, start_ns: int, end_ns: int, events: Sequence[StepEvent], attrs: dict
) -> Any:
    """A finished run as one span of its own trace, its findings as events."""
    trace, sdk_trace = _sdk()
    tid = derived_id(128, "meshprof-run", info.run_id)
    return finished_span(
        info,
        RUN_SPAN,
        _ctx(trace, tid, derived_id(64, "meshprof-run-span", info.run_id)),
        None,
        attrs,
        start_ns,
        max(end_ns, start_ns),
        trace.Status(trace.StatusCode.UNSET),
        events=[_event(sdk_trace, e) for e in events],
    )


__all__ = [
    "ALERT_EVENT",
    "CAPTURE_EVENT",
    "FINDING_EVENT",
    "RANK_SPAN",
    "RUN_SPAN",
    "STEP_SPAN",
    "SpanContextInfo",
    "StepEvent",
    "derived_id",
    "event_span",
    "finished_span",
    "local_context",
    "rank_attributes",
    "run_span",
    "span_id",
    "step_spans",
    "trace_id",
]

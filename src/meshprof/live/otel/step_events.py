"""Alerts and captures as events of the step they happened in
(:class:`~meshprof.live.otel.spans.StepEvent`)."""

from __future__ import annotations

from meshprof.live.otel.spans import ALERT_EVENT, CAPTURE_EVENT, AttrValue, StepEvent
from meshprof.records.captures import CaptureState
from meshprof.records.live import Alert
from meshprof.rundir.captures import LoadedCapture


def alert_event(alert: Alert, step: int) -> StepEvent:
    """A live alert (``alerts.jsonl``) as an event of ``step``, at the time it was raised."""
    attrs: dict[str, AttrValue] = {
        "meshprof.alert.kind": str(alert.kind),
        "meshprof.alert.severity": str(alert.severity),
        "meshprof.alert.message": alert.message,
        "meshprof.alert.ranks": tuple(int(r) for r in alert.ranks),
        "meshprof.alert.value": float(alert.value),
        "meshprof.alert.threshold": float(alert.threshold),
        "meshprof.alert.unit": alert.unit,
        "meshprof.alert.since_step": int(alert.since_step),
    }
    return StepEvent(ALERT_EVENT, step, int(alert.t_ns), attrs)


def capture_state(cap: LoadedCapture) -> str:
    """``complete`` (every asked rank traced), ``partial``, ``empty`` or, while some rank's
    part is not final, ``running``."""
    asked = cap.request.ranks if cap.request is not None else tuple(cap.statuses)
    states = [cap.statuses[r].state if r in cap.statuses else None for r in asked]
    if any(s is None or not s.final for s in states):
        return "running"
    done = sum(1 for s in states if s is CaptureState.DONE)
    return "complete" if done == len(states) and done else "partial" if done else "empty"


def capture_start_step(cap: LoadedCapture) -> int:
    """The step the capture's ranks agreed to start tracing at (-1: not agreed yet)."""
    starts = [st.start_step for st in cap.statuses.values() if st.start_step >= 0]
    return min(starts) if starts else -1


def capture_event(cap: LoadedCapture, step: int) -> StepEvent:
    """A capture (``RUN_DIR/captures/<id>``) as an event of the first step it traced, at that
    step's start on the first rank traced (the request's time when none traced)."""
    req = cap.request
    traced = [s for st in cap.statuses.values() for s in st.steps]
    t_ns = min((s.start_ns for s in traced), default=req.requested_ns if req else 0)
    attrs: dict[str, AttrValue] = {
        "meshprof.capture.id": cap.id,
        "meshprof.capture.state": capture_state(cap),
        "meshprof.capture.ranks": tuple(int(r) for r in (req.ranks if req else cap.statuses)),
        "meshprof.capture.traces": tuple(p.name for _, p in sorted(cap.traces.items())),
        "meshprof.capture.dir": str(cap.path),
    }
    if req is not None:
        attrs["meshprof.capture.trigger"] = req.trigger
        attrs["meshprof.capture.steps"] = int(req.steps)
        if req.reason:
            attrs["meshprof.capture.reason"] = req.reason
    return StepEvent(CAPTURE_EVENT, step, int(t_ns), attrs)


__all__ = ["alert_event", "capture_event", "capture_start_step", "capture_state"]

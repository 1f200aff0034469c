"""``meshprof export DIR --format otlp``: a finished run's steps and conclusions over OTLP.

Every step of every rank (or every ``every``-th) becomes the trace the live exporter would have
sent (:mod:`meshprof.live.otel.spans`, the same ids), with its original timestamps put on one
clock by the report's clock alignment (:mod:`meshprof.analyze.run.events.clock`: the timestamp
exchange and the synchronizing collectives), so the ranks of several hosts line up. The alerts
raised while it ran and the captures taken are events of their steps; the report's findings
and its verdict are events of one ``run`` span over the whole run. A serving rank's finished
requests are one span each (:mod:`meshprof.live.otel.request_spans`, the live exporter's ids),
on the same common clock.

Metrics are not sent: a finished run's figures are points hours or days in the past, which
metric backends refuse or misplace (Prometheus-compatible stores reject samples older than
their head block); the traces carry the run's figures per step. Sending is synchronous and
nothing is dropped: each batch is retried by the SDK until its timeout, and what still fails is
counted and said.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshprof.errors import MeshprofError
from meshprof.live.otel.exporters import JobIdentity, SdkLog, job_resource, scope, span_exporter
from meshprof.live.otel.request_spans import RequestRecord, request_records, request_span
from meshprof.live.otel.settings import OtlpSettings
from meshprof.live.otel.spans import (
    FINDING_EVENT,
    AttrValue,
    SpanContextInfo,
    StepEvent,
    run_span,
    step_spans,
)
from meshprof.live.otel.step_events import alert_event, capture_event, capture_start_step
from meshprof.live.otel.steps import JobStep, RankStep, RankTables, join_arrivals, rank_steps
from meshprof.rundir import LoadedRun, load_run
from meshprof.rundir.captures import list_captures
from meshprof.rundir.live import alerts_after

VERDICT_EVENT = "meshprof.verdict"


@dataclass(slots=True)
class ExportResult:
    """What ``meshprof export --format otlp`` sent."""

    endpoint: str
    """Where the spans went."""
    steps: int = 0
    """Job steps sent."""
    rank_steps: int = 0
    """Ranks' steps sent."""
    requests: int = 0
    """Finished requests sent (one span each)."""
    spans: int = 0
    """Spans sent (accepted by the backend)."""
    failed_spans: int = 0
    """Spans the backend refused, or that could not be sent."""
    alerts: int = 0
    """Alerts sent as events."""
    captures: int = 0
    """Captures sent as events."""
    findings: int = 0
    """Findings and verdict items sent as events of the run span."""
    error: str = ""
    """Why spans failed (the SDK's last word), "" when none did."""
    trace_ids: list[str] = field(default_factory=list)
    """The run span's trace id first, then each step's (hex), as a backend shows them."""

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "trace_ids"}


def job_steps(run: LoadedRun, offsets: dict[int, int], every: int = 1) -> list[JobStep]:
    """Every ``every``-th step of the run across its ranks, on the common clock."""
    by_step: dict[int, list[RankStep]] = defaultdict(list)
    for r, rd in sorted(run.ranks.items()):
        tables = RankTables.of(r, rd.meta, offsets.get(r, 0), run.layout_of(r))
        for rs in rank_steps(rd.spans, rd.events, tables):
            if every <= 1 or rs.step % every == 0:
                by_step[rs.step].append(rs)
    reason = ("all",) if every <= 1 else ("every",)
    return [JobStep(s, join_arrivals(v), reason) for s, v in sorted(by_step.items())]


def run_requests(run: LoadedRun, offsets: dict[int, int]) -> list[RequestRecord]:
    """Every rank's finished requests on the common clock, by arrival."""
    out: list[RequestRecord] = []
    for r, rd in sorted(run.ranks.items()):
        if len(rd.requests):
            out += request_records(rd.requests, r, offsets.get(r, 0), rd.request_traces)
    return sorted(out, key=lambda x: (x.arrival_ns, x.rank))


def step_of(windows: Sequence[tuple[int, int, int]], t_ns: int) -> int | None:
    """The step whose span across the ranks holds ``t_ns`` (``windows``: (step, start, end),
    by step); past the last one the last, before the first the first; None without steps."""
    if not windows:
        return None
    inside = [s for s, lo, hi in windows if lo <= t_ns < hi]
    if inside:
        return max(inside)
    before = [s for s, lo, _hi in windows if lo <= t_ns]
    return max(before) if before else windows[0][0]


def run_events(
    run: LoadedRun, jobs: Sequence[JobStep]
) -> tuple[dict[int, list[StepEvent]], int, int]:
    """The alerts and captures of the run by step; the counts of each."""
    windows = [(j.step, j.start_ns, j.end_ns) for j in jobs]
    out: dict[int, list[StepEvent]] = defaultdict(list)
    n_alerts = n_caps = 0
    for path in run.paths or (run.path,):
        alerts, _ = alerts_after(path, 0, max_bytes=64 << 20)
        for alert in alerts:
            s = step_of(windows, alert.t_ns)
            if s is None:
                continue
            out[s].append(alert_event(alert, s))
            n_alerts += 1
        for cap in list_captures(path):
            start = capture_start_step(cap)
            s = (
                start
                if start >= 0
                else step_of(windows, cap.request.requested_ns if cap.request else 0)
            )
            if s is None:
                continue
            out[s].append(capture_event(cap, s))
            n_caps += 1
    return out, n_alerts, n_caps


def finding_events(findings: Sequence[Any], verdict: Sequence[Any], t_ns: int) -> list[StepEvent]:
    """The report's findings and verdict items as events at ``t_ns`` (the run's end)."""
    out = []
    for f in findings:
        attrs: dict[str, AttrValue] = {
            "meshprof.finding.kind": str(f.kind),
            "meshprof.finding.severity": str(f.severity),
            "meshprof.finding.title": f.title,
            "meshprof.finding.ranks": tuple(int(r) for r in f.ranks),
        }
        evidence = getattr(f, "evidence", None)
        if evidence:
            attrs["meshprof.finding.evidence"] = json.dumps(evidence, default=str, sort_keys=True)
        out.append(StepEvent(FINDING_EVENT, -1, t_ns, attrs))
    for v in verdict:
        attrs = {
            "meshprof.verdict.cause": v.cause,
            "meshprof.verdict.title": v.title,
            "meshprof.verdict.per_step": v.ns_per_step / 1e9,
            "meshprof.verdict.share_of_step": float(v.share_of_step),
            "meshprof.verdict.ranks": tuple(int(r) for r in v.ranks),
            "meshprof.verdict.action": v.action,
        }
        out.append(StepEvent(VERDICT_EVENT, -1, t_ns, attrs))
    return out


def export_run(
    dirs: Sequence[str | Path], settings: OtlpSettings, every: int = 1, batch: int = 512
) -> ExportResult:
    """Send the run in ``dirs`` (one directory, or each node's of one run) to
    ``settings.traces`` (see the module docstring)."""
    if settings.traces is None:
        raise MeshprofError("nothing to send: OTLP traces are off (OTEL_TRACES_EXPORTER=none)")
    if every < 1:
        raise MeshprofError(f"--every {every}: must be >= 1")
    from meshprof.report.executor import run_stages
    from meshprof.report.stages import REPORT_STAGES
    from meshprof.report.stages.conclusions import FINDINGS
    from meshprof.report.stages.matching import CLOCK
    from meshprof.report.stages.verdict import VERDICT

    run = load_run([Path(d) for d in dirs])
    got = run_stages(run, REPORT_STAGES, only=(CLOCK.name, FINDINGS.name, VERDICT.name))
    offsets = got[CLOCK.name].offsets()
    jobs = job_steps(run, offsets, every)
    events, n_alerts, n_caps = run_events(run, jobs)
    reqs = run_requests(run, offsets)
    m = run.manifest
    lay = run.layout()
    job = JobIdentity(
        run_id=m.run_id or run.path.name,
        world_size=run.world_size,
        layout=f"dp={lay.dp},tp={lay.tp},pp={lay.pp}" if lay is not None else "",
        node_id="export",
        host=(m.hosts or [""])[0],
        run_dir=str(run.path),
    )
    log = SdkLog.install()
    info = SpanContextInfo(job.run_id, job_resource(job), scope())
    starts = [j.start_ns for j in jobs] + [q.arrival_ns for q in reqs]
    start = min(starts, default=int(m.start_ns or time.time_ns()))
    end = max([j.end_ns for j in jobs] + [q.end_ns for q in reqs], default=start)
    notes = finding_events(got[FINDINGS.name], got[VERDICT.name], end)
    result = ExportResult(
        endpoint=settings.traces.endpoint,
        steps=len(jobs),
        rank_steps=sum(len(j.ranks) for j in jobs),
        requests=len(reqs),
        alerts=n_alerts,
        captures=n_caps,
        findings=len(notes),
    )
    attrs: dict[str, AttrValue] = {
        "meshprof.run.status": str(m.status or ""),
        "meshprof.run.steps": len(jobs),
        "meshprof.run.ranks": len(run.ranks),
    }
    if m.exit_code is not None:
        attrs["meshprof.run.exit_code"] = int(m.exit_code)
    pending = [run_span(info, start, end, notes, attrs)]
    result.trace_ids.append(f"{pending[0].context.trace_id:032x}")
    exporter = span_exporter(settings.traces)
    try:
        for j in jobs:
            evs = events.pop(j.step, [])
            pending += step_spans(j, info, evs, root=True)
            result.trace_ids.append(f"{pending[-1].context.trace_id:032x}")
            pending = _flush(exporter, pending, batch, result, log)
        for q in reqs:
            pending.append(request_span(q, info))
            pending = _flush(exporter, pending, batch, result, log)
        if pending:
            _send(exporter, pending, result, log)
    finally:
        exporter.shutdown()
    return result


def _flush(
    exporter: Any, pending: list[Any], batch: int, result: ExportResult, log: SdkLog
) -> list[Any]:
    """Send ``pending`` in whole batches; what is left (less than a batch)."""
    while len(pending) >= batch:
        _send(exporter, pending[:batch], result, log)
        pending = pending[batch:]
    return pending


def _send(exporter: Any, spans: list[Any], result: ExportResult, log: SdkLog) -> None:
    ok = getattr(exporter.export(spans), "name", "") == "SUCCESS"
    if ok:
        result.spans += len(spans)
    else:
        result.failed_spans += len(spans)
        result.error = log.last or "the backend refused the spans or could not be reached"


__all__ = [
    "ExportResult",
    "export_run",
    "finding_events",
    "job_steps",
    "run_events",
    "run_requests",
    "step_of",
]

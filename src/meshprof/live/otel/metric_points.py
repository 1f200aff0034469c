"""An :class:`~meshprof.live.otel.figures.ExportSnapshot` as OTLP metrics (the SDK's
``MetricsData``): one metric per instrument of :mod:`meshprof.live.otel.instruments`, one
point per rank (and op, dimension, cause).

Each point carries the time of the figure it holds, not the time of the export: a gauge the
time its rank wrote the record (``updated_ns``), a counter or histogram also its start (when
the rank started recording: the counters are cumulative from there, and a restarted rank starts
a new series as OpenTelemetry expects). Units are SI: seconds, bytes, ratios.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from meshprof.live.otel import instruments as I
from meshprof.live.otel.figures import ExportSnapshot, HistogramFigure, RankFigures
from meshprof.live.otel.instruments import Instrument, Kind
from meshprof.records.ledger import TimeCause
from meshprof.records.live import HIST_BOUNDS_S

Attrs = dict[str, Any]


@dataclass(slots=True)
class ExporterCounts:
    """What the exporter sent and dropped so far (its own counters)."""

    started_ns: int
    """When the exporter started."""
    exported: dict[str, int] = field(default_factory=dict)
    """Items sent, by signal (``traces``: spans; ``metrics``: metric points)."""
    dropped: dict[tuple[str, str], int] = field(default_factory=dict)
    """Items dropped, by (signal, reason): spans, or whole metric exports."""


@dataclass(slots=True)
class _Points:
    """The points of each instrument, by name."""

    by_name: dict[str, list[Any]] = field(default_factory=dict)

    def add(self, inst: Instrument, point: Any) -> None:
        self.by_name.setdefault(inst.name, []).append(point)


def _number(attrs: Attrs, start: int, t: int, value: float | int) -> Any:
    from opentelemetry.sdk.metrics.export import NumberDataPoint

    return NumberDataPoint(
        attributes=attrs, start_time_unix_nano=start, time_unix_nano=t, value=value
    )


def _histogram(attrs: Attrs, start: int, t: int, h: HistogramFigure) -> Any:
    from opentelemetry.sdk.metrics.export import HistogramDataPoint

    return HistogramDataPoint(
        attributes=attrs,
        start_time_unix_nano=start,
        time_unix_nano=t,
        count=h.count,
        sum=h.sum,
        bucket_counts=list(h.counts),
        explicit_bounds=list(h.bounds),
        min=None,  # type: ignore[arg-type]  # (optional in OTLP: not known from the buckets)
        max=None,  # type: ignore[arg-type]
    )


def collective_histogram(counts: Iterable[int], sum_ns: int) -> HistogramFigure:
    """A live record's per-bucket collective counts (:data:`HIST_BOUNDS_S`) as a histogram; a
    record of another bounds version is padded (or its extra buckets folded into the last)."""
    c = [int(x) for x in counts]
    n = len(HIST_BOUNDS_S) + 1
    if len(c) < n:
        c += [0] * (n - len(c))
    elif len(c) > n:
        c = [*c[: n - 1], sum(c[n - 1 :])]
    return HistogramFigure(HIST_BOUNDS_S, tuple(c), sum_ns / 1e9)


def _rank_points(p: _Points, f: RankFigures) -> None:
    x = f.record
    lab: Attrs = {I.RANK: x.rank, I.NODE: x.hostname or x.node_id}
    t, start = x.updated_ns, x.started_ns or x.updated_ns

    def gauge(inst: Instrument, v: float, attrs: Attrs = lab) -> None:
        p.add(inst, _number(attrs, 0, t, v))

    def count(inst: Instrument, v: float, attrs: Attrs = lab) -> None:
        p.add(inst, _number(attrs, start, t, v))

    if f.straggler_score is not None:
        gauge(I.STRAGGLER_SCORE, f.straggler_score)
    if f.wait_ns is not None:
        gauge(I.WAIT_DURATION, f.wait_ns / 1e9)
    if f.ledger_ns:
        for c in TimeCause:
            if c.badput:
                count(I.BADPUT, f.ledger_ns.get(c, 0) / 1e9, {**lab, I.CAUSE: c.value})
        count(I.GOODPUT, f.ledger_ns.get(TimeCause.COMPUTE, 0) / 1e9)
        count(I.WALL, x.ledger_wall_ns / 1e9)
    if x.compute_ns > 0:
        gauge(I.COMPUTE_DURATION, x.compute_ns / 1e9)
    gauge(I.STORAGE_WRITING, 0.0 if x.storage else 1.0)
    gauge(I.RANK_UP, 1.0 if f.up else 0.0)
    if x.step_ns > 0:
        gauge(I.STEP_DURATION, x.step_ns / 1e9)
    count(I.STEPS, x.steps_done)
    gauge(I.STEP_RATE, float(x.steps_per_s))
    gauge(I.TOKEN_RATE, float(x.tokens_per_s))
    for s in x.series:
        ol = {**lab, I.OP: s.op, I.DIM: s.dim}
        count(I.COLLECTIVES, s.count, ol)
        p.add(
            I.COLLECTIVE_DURATION,
            _histogram(ol, start, t, collective_histogram(s.buckets, s.sum_ns)),
        )
    for d in x.dims:
        gauge(I.COMM_RATIO, float(d.comm_share), {**lab, I.DIM: d.dim})
        gauge(I.COMM_EXPOSED_RATIO, float(d.exposed_share), {**lab, I.DIM: d.dim})
    if x.memory_bytes >= 0:
        gauge(I.MEMORY_USAGE, x.memory_bytes)
    if x.memory_peak_bytes >= 0:
        gauge(I.MEMORY_PEAK, x.memory_peak_bytes)
    if x.memory_capacity_bytes > 0:
        gauge(I.MEMORY_LIMIT, x.memory_capacity_bytes)
    age = 0.0
    if x.inflight is not None and x.status == "running":
        age = x.inflight.age_ns / 1e9
    gauge(I.INFLIGHT_AGE, age)


def points(snap: ExportSnapshot, counts: ExporterCounts | None = None) -> dict[str, list[Any]]:
    """Every point of ``snap`` (and of the exporter's own ``counts``), by instrument name."""
    p = _Points()
    for f in snap.ranks:
        _rank_points(p, f)
    for (kind, severity), n in sorted(snap.alerts.items()):
        attrs = {I.ALERT_KIND: kind, I.ALERT_SEVERITY: severity}
        p.add(I.ALERTS, _number(attrs, snap.alerts_since_ns, snap.taken_ns, n))
    for sv in snap.serving:
        lab: Attrs = {
            I.GENAI_OPERATION: sv.operation,
            I.GENAI_PROVIDER: sv.provider,
            I.RANK: sv.rank,
        }
        if sv.model:  # (conditionally required: when known)
            lab[I.GENAI_MODEL] = sv.model
        t0, t = sv.started_ns, sv.updated_ns
        p.add(I.TIME_TO_FIRST_TOKEN, _histogram(lab, t0, t, sv.time_to_first_token))
        p.add(I.TIME_PER_OUTPUT_TOKEN, _histogram(lab, t0, t, sv.time_per_output_token))
        for err, h in sorted(sv.request_duration.items()):
            p.add(
                I.REQUEST_DURATION, _histogram({**lab, I.ERROR_TYPE: err} if err else lab, t0, t, h)
            )
    if counts is not None:
        for signal, n in sorted(counts.exported.items()):
            p.add(I.EXPORTED, _number({I.SIGNAL: signal}, counts.started_ns, snap.taken_ns, n))
        for (signal, reason), n in sorted(counts.dropped.items()):
            attrs = {I.SIGNAL: signal, I.DROP_REASON: reason}
            p.add(I.DROPPED, _number(attrs, counts.started_ns, snap.taken_ns, n))
    return p.by_name


def metrics_data(
    snap: ExportSnapshot, resource: Any, scope: Any, counts: ExporterCounts | None = None
) -> Any:
    """``snap`` as the SDK's ``MetricsData`` (what an OTLP metric exporter sends)."""
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        Gauge,
        Histogram,
        Metric,
        MetricsData,
        ResourceMetrics,
        ScopeMetrics,
        Sum,
    )

    cumulative = AggregationTemporality.CUMULATIVE
    by_name = points(snap, counts)
    metrics = []
    for inst in I.ALL:
        pts = by_name.get(inst.name)
        if not pts:
            continue
        data: Any
        if inst.kind is Kind.GAUGE:
            data = Gauge(data_points=pts)
        elif inst.kind is Kind.COUNTER:
            data = Sum(data_points=pts, aggregation_temporality=cumulative, is_monotonic=True)
        else:
            data = Histogram(data_points=pts, aggregation_temporality=cumulative)
        metrics.append(
            Metric(name=inst.name, description=inst.description, unit=inst.unit, data=data)
        )
    scope_metrics = [ScopeMetrics(scope=scope, metrics=metrics, schema_url="")]
    return MetricsData(
        resource_metrics=[
            ResourceMetrics(resource=resource, scope_metrics=scope_metrics, schema_url="")
        ]
    )


def point_count(data: Any) -> int:
    """Data points in a ``MetricsData``."""
    return sum(
        len(m.data.data_points)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    )


__all__ = ["ExporterCounts", "collective_histogram", "metrics_data", "point_count", "points"]

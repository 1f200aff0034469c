"""``meshprof run --otlp-endpoint``: the launcher's OpenTelemetry exporter.

It runs in the launcher (one per node), not in the training processes: the ranks already
publish their live state every second and append their rows to the run directory every half
second, and everything the exporter sends is read from there — the ranks do no work for it,
hold no socket, import no SDK, and a dead or slow backend cannot reach them. (An exporter in
each rank would add a thread, the SDK's memory and the GIL contention of encoding to every
training process, eight times per node.) What the launcher spends is measured in
``benchmarks/otlp_overhead.py``.

Every ``tick_s`` seconds its thread (:class:`OtlpAgent`):

1. reads the ranks' new rows (:class:`~meshprof.live.otel.rank_feed.RankFeed`) and holds their
   closed steps (:class:`~meshprof.live.otel.trace_sampling.StepBook`); a serving rank's
   finished requests go to the span worker at once, one span each
   (:mod:`meshprof.live.otel.request_spans`; what the span queue has no room for is dropped and
   counted, never held);
2. on node 0, reads the alerts raised (``live/alerts.jsonl``) and the captures taken, asks for
   the steps around them and keeps them as events of their step;
3. hands the steps decided to the span worker (:mod:`meshprof.live.otel.spans`);
4. every metric period, reads the live figures (:class:`~meshprof.live.otel.figures.FigureReader`)
   and hands them to the metric worker (:mod:`meshprof.live.otel.metric_points`).

The workers (:mod:`meshprof.live.otel.export_worker`) send on their own threads with bounded queues:
the agent never waits for the network. Nothing here raises into the launcher: a failure is one
line on stderr and the job goes on.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from meshprof.live.otel.export_worker import EXPORT_FAILED, QUEUE_FULL, ExportWorker
from meshprof.live.otel.exporters import (
    JobIdentity,
    SdkLog,
    job_resource,
    metric_exporter,
    scope,
    span_exporter,
)
from meshprof.live.otel.figures import FigureReader
from meshprof.live.otel.metric_points import ExporterCounts, metrics_data, point_count
from meshprof.live.otel.rank_feed import RankFeed
from meshprof.live.otel.request_spans import RequestRecord, request_span
from meshprof.live.otel.settings import OtlpSettings
from meshprof.live.otel.spans import SpanContextInfo, StepEvent, event_span, step_spans
from meshprof.live.otel.step_events import (
    alert_event,
    capture_event,
    capture_start_step,
    capture_state,
)
from meshprof.live.otel.trace_sampling import StepBook
from meshprof.live.say import say
from meshprof.records.live import Alert
from meshprof.rundir.captures import list_captures
from meshprof.rundir.live import alerts_after
from meshprof.rundir.schema import RANK_DIR_RE, rank_entries

TICK_S = 0.5
"""Seconds between two looks at the run directory."""
SCAN_S = 2.0
"""Seconds between two listings of the rank folders and the captures."""
MAX_PENDING_EVENTS = 1024
"""Alert and capture events waiting for their step at most."""
CAPTURE_GIVE_UP_S = 120.0
"""A capture still running this long after its deadline is sent as it is."""


class OtlpAgent:
    """The launcher's exporter (see the module docstring). ``root``: this launcher sends the
    job steps' root spans, the alerts and the captures (node 0's)."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        settings: OtlpSettings,
        job: JobIdentity,
        *,
        node_id: str | None = None,
        layout: object = None,
        root: bool = True,
        tick_s: float = TICK_S,
        stream: TextIO | None = None,
        prefix: str = "meshprof run",
    ) -> None:
        self.run_dir = Path(run_dir)
        self.settings = settings
        self.job = job
        self.node_id = node_id
        self.layout = layout
        self.root = root
        self.tick_s = tick_s
        self.stream = stream
        self.prefix = prefix
        self.started_ns = time.time_ns()
        self.counts = ExporterCounts(self.started_ns)
        self.book = StepBook(settings.sampling)
        self.figures = FigureReader(run_dir, node_id, self.started_ns)
        self.feeds: dict[int, RankFeed] = {}
        self._foreign: set[int] = set()
        self._pending: dict[int, list[StepEvent]] = {}
        self._alerts_offset = 0
        self._unplaced: list[Alert] = []
        self._captures_done: set[str] = set()
        self._captures_forced: set[str] = set()
        self._next_scan = 0.0
        self._next_metrics = 0.0
        self._lock = threading.Lock()  # the counts (workers' threads) and polls
        self._warned: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.poll_failures = 0
        self.requests_sent = 0
        """Finished requests handed to the span worker."""
        self.sdk_log = SdkLog.install()
        self.resource = job_resource(job)
        self.info = SpanContextInfo(job.run_id, self.resource, scope())
        self.spans: ExportWorker | None = None
        self.metrics: ExportWorker | None = None
        self._exporters: list[Any] = []

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, thread: bool = True) -> OtlpAgent:
        """Build the SDK exporters and start the workers and (``thread``) the agent's thread
        (without it the caller polls: :meth:`poll`)."""
        s = self.settings
        if s.traces is not None:
            exp = span_exporter(s.traces)
            self._exporters.append(exp)

            def send_spans(batch: list[Any], exp: Any = exp) -> bool:
                return _ok(exp.export(batch))

            self.spans = ExportWorker(
                "traces",
                send_spans,
                capacity=s.span_queue,
                batch=s.span_batch,
                period_s=1.0,
                on_count=self._on_count,
                close=exp.shutdown,
            ).start()
        if s.metrics is not None:
            mexp = metric_exporter(s.metrics)
            self._exporters.append(mexp)

            def send_metrics(batch: list[Any], exp: Any = mexp) -> bool:
                return all(_ok(exp.export(md)) for md in batch)

            self.metrics = ExportWorker(
                "metrics",
                send_metrics,
                capacity=2,
                batch=1,
                period_s=1.0,
                keep_newest=True,
                size=point_count,
                on_count=self._on_count,
                close=mexp.shutdown,
            ).start()
        if thread:
            self._thread = threading.Thread(target=self._run, name="meshprof-otlp", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Send the steps still held and the last figures, within the settings' shutdown
        time; say what was sent and dropped (one line). Never raises."""
        try:
            self._stop_now()
        except Exception as e:  # the launcher's end (the manifest, the exit code) goes first
            self._warn("stop", f"the OTLP exporter failed to stop ({type(e).__name__}: {e})")

    def _stop_now(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.tick_s + 5.0)
        self._safe_poll(final=True)
        deadline = time.monotonic() + self.settings.shutdown_s
        workers = [w for w in (self.spans, self.metrics) if w is not None]
        for w in workers:
            w.request_stop(deadline)
        for w in workers:
            w.finish(deadline)
        self._say(f"{self.prefix}: OTLP: {self.summary()}")

    def summary(self) -> str:
        """What was sent and dropped, in words."""
        with self._lock:
            sent = dict(self.counts.exported)
            dropped = sum(self.counts.dropped.values())
        parts = []
        if self.spans is not None:
            parts.append(f"{sent.get('traces', 0):,} spans")
        if self.metrics is not None:
            parts.append(f"{sent.get('metrics', 0):,} metric points")
        text = "sent " + " and ".join(parts) + f" ({self.settings.describe()})"
        if dropped:
            text += f"; dropped {dropped:,} spans and metric points (meshprof.otel.dropped)"
        return text

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            self._safe_poll()

    def _safe_poll(self, final: bool = False) -> None:
        try:
            self.poll(final=final)
        except Exception as e:  # never into the launcher
            self.poll_failures += 1
            self._warn(
                "poll", f"the OTLP exporter failed to read the run ({type(e).__name__}: {e})"
            )

    # -- one look ------------------------------------------------------------------------------
    def poll(self, now: float | None = None, final: bool = False) -> None:
        """One look at the run directory (see the module docstring)."""
        mono = time.monotonic() if now is None else now
        scan = final or mono >= self._next_scan
        if scan:
            self._next_scan = mono + SCAN_S
            self._discover()
        traces = self.spans is not None
        for feed in list(self.feeds.values()) if traces else ():
            node = feed.node_id
            if node is None:
                continue  # no meta yet: whose it is is not known
            if self.node_id and node and node != self.node_id:
                self._foreign.add(feed.rank)
                del self.feeds[feed.rank]
                continue
            for rs in feed.poll(mono, final):
                self.book.add(rs, mono)
            self._send_requests(feed.take_requests())
        if self.root:
            self._read_alerts(traces)
            if traces:
                self._place_alerts(final)
                if scan:
                    self._read_captures(final)
        if traces:
            self._send_steps(mono, final)
        if self.metrics is not None and (final or mono >= self._next_metrics):
            self._next_metrics = mono + self.settings.metric_interval_s
            snap = self.figures.read()
            with self._lock:
                data = metrics_data(snap, self.resource, self.info.scope, _copy(self.counts))
            self.metrics.offer([data])

    def _send_requests(self, reqs: list[RequestRecord]) -> None:
        """One span per finished request, as many as the span queue has room for (the others
        dropped and counted: no span is built for them)."""
        if not reqs or self.spans is None:
            return
        room = max(self.spans.capacity - self.spans.queued(), 0)
        if len(reqs) > room:
            self._on_count("traces", QUEUE_FULL, len(reqs) - room)
            reqs = reqs[:room]
        self.requests_sent += len(reqs)
        if reqs:
            self.spans.offer([request_span(r, self.info) for r in reqs])

    def _discover(self) -> None:
        for r, path in rank_entries(self.run_dir):
            if r in self.feeds or r in self._foreign or not RANK_DIR_RE.match(path.name):
                continue
            self.feeds[r] = RankFeed(r, path, self.layout)

    def _read_alerts(self, place: bool) -> None:
        """Count the new alerts (``meshprof.alerts``); with ``place``, keep them to place as
        events of their steps."""
        alerts, self._alerts_offset = alerts_after(self.run_dir, self._alerts_offset)
        for alert in alerts:
            self.figures.count_alert(alert)
            if place and len(self._unplaced) < MAX_PENDING_EVENTS:
                self._unplaced.append(alert)

    def _place_alerts(self, final: bool) -> None:
        """The alerts whose step is known now: steps around them asked for, and each an event
        of its step (an alert comes while its step runs: it waits for the step's end)."""
        keep = []
        for alert in self._unplaced:
            s = self.book.step_at(alert.t_ns, final)
            if s is None and final:
                s = max(alert.since_step, 0)
            if s is None:
                keep.append(alert)
                continue
            k = self.settings.sampling.around_alert
            self.book.force(s - k, s + k, "alert")
            self._event(alert_event(alert, s))
        self._unplaced = keep

    def _read_captures(self, final: bool) -> None:
        now_ns = time.time_ns()
        for cap in list_captures(self.run_dir):
            if cap.id in self._captures_done or cap.request is None:
                continue
            start = capture_start_step(cap)
            if start >= 0 and cap.id not in self._captures_forced:
                self._captures_forced.add(cap.id)
                self.book.force(start, start + max(cap.request.steps, 1) - 1, "capture")
            late = now_ns > cap.request.deadline_ns + int(CAPTURE_GIVE_UP_S * 1e9)
            if capture_state(cap) == "running" and not (final or late):
                continue
            self._captures_done.add(cap.id)
            step = start if start >= 0 else self.book.step_at(cap.request.requested_ns, True)
            self._event(capture_event(cap, step if step is not None else 0))

    def _event(self, ev: StepEvent) -> None:
        """An event of its step: on the step's root when the step is still held, else a span
        of its own in the step's trace."""
        decided = self.book.decided(ev.step)
        if decided is None:
            if sum(map(len, self._pending.values())) < MAX_PENDING_EVENTS:
                self._pending.setdefault(ev.step, []).append(ev)
            return
        if self.spans is not None:
            self.spans.offer([event_span(ev, self.info, under_root=bool(decided))])

    def _send_steps(self, now: float, final: bool) -> None:
        out: list[Any] = []
        for job, first in self.book.due(now, final):
            events = self._pending.pop(job.step, []) if first and self.root else []
            out += step_spans(job, self.info, events, root=first and self.root)
        for s in [s for s in self._pending if final or self.book.decided(s) is not None]:
            sent = bool(self.book.decided(s))
            out += [event_span(ev, self.info, under_root=sent) for ev in self._pending.pop(s)]
        if out and self.spans is not None:
            self.spans.offer(out)

    # -- counting and saying -------------------------------------------------------------------
    def _on_count(self, signal: str, outcome: str, n: int) -> None:
        with self._lock:
            if outcome == "exported":
                self.counts.exported[signal] = self.counts.exported.get(signal, 0) + n
            else:
                key = (signal, outcome)
                self.counts.dropped[key] = self.counts.dropped.get(key, 0) + n
        if outcome == EXPORT_FAILED:
            target = getattr(self.settings, signal)
            why = self.sdk_log.last or "the backend refused it or could not be reached"
            self._warn(
                f"fail-{signal}",
                f"OTLP export of {signal} to {target.endpoint} failed ({why}); the job goes "
                "on, what cannot be sent is dropped and counted",
            )

    def _warn(self, key: str, text: str) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        self._say(f"{self.prefix}: warning: {text}")

    def _say(self, line: str) -> None:
        say(line, self.stream)


def _ok(result: Any) -> bool:
    """An SDK export result is a success (``SpanExportResult`` / ``MetricExportResult``)."""
    return getattr(result, "name", "") == "SUCCESS"


def _copy(c: ExporterCounts) -> ExporterCounts:
    return ExporterCounts(c.started_ns, dict(c.exported), dict(c.dropped))


__all__ = ["OtlpAgent"]

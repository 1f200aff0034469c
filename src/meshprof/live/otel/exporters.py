"""The OpenTelemetry SDK's pieces the exporter uses: the job's resource, meshprof's
instrumentation scope, the OTLP exporters (gRPC or HTTP/protobuf) and a quiet SDK log.

The SDK logs every failed export (a warning per retry of a dead endpoint) through ``logging``;
the launcher keeps its stderr for the job: those records are kept here (:class:`SdkLog`) and
the exporter says once, in one line, that sending fails and why.
"""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass
from typing import Any

from meshprof._version import __version__
from meshprof.live.otel.settings import SignalTarget


@dataclass(frozen=True, slots=True)
class JobIdentity:
    """What identifies the job's telemetry (the resource's attributes)."""

    run_id: str
    """The run's id (``meshprof.run.id``)."""
    world_size: int = -1
    """Ranks in the job (-1: unknown)."""
    layout: str = ""
    """The dp × tp × pp layout as given (``dp=2,tp=2,pp=1``; "" when none)."""
    node_id: str = ""
    """The launcher (node) sending."""
    node_rank: int = 0
    """That node's rank."""
    host: str = ""
    """The host sending ("" : this one)."""
    run_dir: str = ""
    """The run directory."""


def job_resource(job: JobIdentity) -> Any:
    """The SDK ``Resource``: ``service.name`` meshprof, ``service.instance.id`` (run id / node),
    ``host.name``, ``meshprof.run.id``, ``meshprof.run.world_size``, ``meshprof.run.layout``,
    ``meshprof.node.id``, ``meshprof.node.rank``, ``meshprof.run.dir``; then
    ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME`` over them (the user's word wins)."""
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource

    attrs: dict[str, Any] = {
        "service.name": "meshprof",
        "service.version": __version__,
        "service.instance.id": f"{job.run_id}/{job.node_id or job.node_rank}",
        "host.name": job.host or socket.gethostname(),
        "meshprof.run.id": job.run_id,
        "meshprof.node.rank": job.node_rank,
    }
    if job.world_size > 0:
        attrs["meshprof.run.world_size"] = job.world_size
    if job.layout:
        attrs["meshprof.run.layout"] = job.layout
    if job.node_id:
        attrs["meshprof.node.id"] = job.node_id
    if job.run_dir:
        attrs["meshprof.run.dir"] = job.run_dir
    return Resource.create(attrs).merge(OTELResourceDetector().detect())


def scope() -> Any:
    """meshprof's instrumentation scope (name and version)."""
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    return InstrumentationScope("meshprof", __version__)


def span_exporter(target: SignalTarget) -> Any:
    """The SDK's OTLP span exporter for ``target`` (headers, timeout, TLS from the
    environment, as the SDK reads them)."""
    if target.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=target.endpoint)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpSpanExporter,
    )

    return HttpSpanExporter(endpoint=target.endpoint)


def metric_exporter(target: SignalTarget) -> Any:
    """The SDK's OTLP metric exporter for ``target`` (cumulative temporality)."""
    if target.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        return OTLPMetricExporter(endpoint=target.endpoint)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
        OTLPMetricExporter as HttpMetricExporter,
    )

    return HttpMetricExporter(endpoint=target.endpoint)


class SdkLog(logging.Handler):
    """Keeps the SDK's log records instead of printing them: the last one says why an export
    failed. Installed on the ``opentelemetry`` logger (which then no longer propagates)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.last = ""
        self.records = 0
        self._guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
        except Exception:
            msg = str(record.msg)
        with self._guard:
            self.records += 1
            if record.levelno >= logging.WARNING:
                self.last = msg.splitlines()[0][:300] if msg else ""

    @classmethod
    def install(cls) -> SdkLog:
        """The one handler of the ``opentelemetry`` logger (installed once per process)."""
        log = logging.getLogger("opentelemetry")
        for h in log.handlers:
            if isinstance(h, SdkLog):
                return h
        h = cls()
        log.addHandler(h)
        log.propagate = False
        log.setLevel(logging.WARNING)
        return h


__all__ = [
    "JobIdentity",
    "SdkLog",
    "job_resource",
    "metric_exporter",
    "scope",
    "span_exporter",
]

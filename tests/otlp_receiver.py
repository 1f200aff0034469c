"""OTLP receivers for the tests: the protocol itself, decoded with the official
``opentelemetry-proto`` messages, not a mock of meshprof's exporter.

- :class:`HttpReceiver`: OTLP/HTTP (``POST /v1/traces``, ``/v1/metrics``, protobuf bodies,
  gzip or not), a ``http.server`` answering ``Export*ServiceResponse``; ``delay_s`` makes it a
  slow backend, ``status`` a refusing one.
- :class:`GrpcReceiver`: OTLP/gRPC, a ``grpcio`` server implementing the collector's
  ``TraceService`` and ``MetricsService``.

What came is flattened for assertions: :func:`spans` (one :class:`SpanView` per span, ids in
hex, attributes as Python values, the resource's attributes with it) and :func:`points` (one
:class:`PointView` per data point, with its metric's name, unit and type).
"""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as mpb
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as tpb


@dataclass
class Received:
    """Everything one receiver decoded, in arrival order."""

    traces: list[Any] = field(default_factory=list)
    """ExportTraceServiceRequest messages."""
    metrics: list[Any] = field(default_factory=list)
    """ExportMetricsServiceRequest messages."""
    headers: list[dict[str, str]] = field(default_factory=list)
    """Each request's headers (HTTP) or metadata (gRPC), lower-case keys."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, msg: Any, headers: dict[str, str]) -> None:
        with self.lock:
            (self.traces if kind == "traces" else self.metrics).append(msg)
            self.headers.append(headers)


class HttpReceiver:
    """OTLP/HTTP on 127.0.0.1 (see the module docstring). ``url`` is the base URL."""

    def __init__(self, delay_s: float = 0.0, status: int = 200) -> None:
        self.got = Received()
        self.delay_s = delay_s
        self.status = status
        got, rx = self.got, self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if rx.delay_s:
                    time.sleep(rx.delay_s)
                enc = (self.headers.get("Content-Encoding") or "").lower()
                if enc == "gzip":
                    body = gzip.decompress(body)
                elif enc == "deflate":
                    body = zlib.decompress(body)
                if self.path == "/v1/traces":
                    msg, resp = tpb.ExportTraceServiceRequest(), tpb.ExportTraceServiceResponse()
                    kind = "traces"
                elif self.path == "/v1/metrics":
                    msg, resp = (
                        mpb.ExportMetricsServiceRequest(),
                        mpb.ExportMetricsServiceResponse(),
                    )
                    kind = "metrics"
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                if rx.status != 200:
                    self.send_response(rx.status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                msg.ParseFromString(body)
                got.add(kind, msg, {k.lower(): v for k, v in self.headers.items()})
                out = resp.SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> HttpReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class GrpcReceiver:
    """OTLP/gRPC on 127.0.0.1 (see the module docstring). ``url`` is ``http://127.0.0.1:PORT``."""

    def __init__(self) -> None:
        import grpc
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as mgrpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as tgrpc

        self.got = got = Received()

        class Traces(tgrpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                got.add("traces", request, dict(context.invocation_metadata()))
                return tpb.ExportTraceServiceResponse()

        class Metrics(mgrpc.MetricsServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                got.add("metrics", request, dict(context.invocation_metadata()))
                return mpb.ExportMetricsServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        tgrpc.add_TraceServiceServicer_to_server(Traces(), self.server)
        mgrpc.add_MetricsServiceServicer_to_server(Metrics(), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> GrpcReceiver:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop(grace=None)


def value_of(v: Any) -> Any:
    """An OTLP ``AnyValue`` as a Python value (arrays as tuples)."""
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return tuple(value_of(x) for x in v.array_value.values)
    if kind is None:
        return None
    return getattr(v, kind)


def attrs_of(kvs: Any) -> dict[str, Any]:
    return {kv.key: value_of(kv.value) for kv in kvs}


@dataclass
class SpanView:
    """One received span."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, int, dict[str, Any]]]
    status: int
    resource: dict[str, Any]
    scope: str
    flags: int = 0
    """OTLP ``Span.flags``: bit 8 set when the exporter says whether the parent is remote, bit 9
    when it is."""


def spans(got: Received) -> list[SpanView]:
    """Every span received, in arrival order."""
    out = []
    with got.lock:
        reqs = list(got.traces)
    for req in reqs:
        for rs in req.resource_spans:
            res = attrs_of(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    out.append(
                        SpanView(
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex(),
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                            attributes=attrs_of(s.attributes),
                            events=[
                                (e.name, e.time_unix_nano, attrs_of(e.attributes)) for e in s.events
                            ],
                            status=s.status.code,
                            resource=res,
                            scope=ss.scope.name,
                            flags=s.flags,
                        )
                    )
    return out


@dataclass
class PointView:
    """One received data point."""

    name: str
    unit: str
    kind: str
    """``gauge``, ``sum`` or ``histogram``."""
    attributes: dict[str, Any]
    start_ns: int
    time_ns: int
    value: float | None = None
    monotonic: bool = False
    temporality: int = 0
    count: int = 0
    sum: float = 0.0
    bucket_counts: tuple[int, ...] = ()
    bounds: tuple[float, ...] = ()
    resource: dict[str, Any] = field(default_factory=dict)


def points(got: Received) -> list[PointView]:
    """Every data point received, in arrival order."""
    out = []
    with got.lock:
        reqs = list(got.metrics)
    for req in reqs:
        for rm in req.resource_metrics:
            res = attrs_of(rm.resource.attributes)
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    kind = m.WhichOneof("data")
                    data = getattr(m, kind)
                    for p in data.data_points:
                        pv = PointView(
                            name=m.name,
                            unit=m.unit,
                            kind=kind,
                            attributes=attrs_of(p.attributes),
                            start_ns=p.start_time_unix_nano,
                            time_ns=p.time_unix_nano,
                            resource=res,
                        )
                        if kind == "histogram":
                            pv.count, pv.sum = p.count, p.sum
                            pv.bucket_counts = tuple(p.bucket_counts)
                            pv.bounds = tuple(p.explicit_bounds)
                            pv.temporality = data.aggregation_temporality
                        else:
                            pv.value = (
                                p.as_double if p.WhichOneof("value") == "as_double" else p.as_int
                            )
                        if kind == "sum":
                            pv.monotonic = data.is_monotonic
                            pv.temporality = data.aggregation_temporality
                        out.append(pv)
    return out


def latest(pts: list[PointView]) -> dict[tuple[str, tuple[tuple[str, Any], ...]], PointView]:
    """The last point received of each (metric, attributes)."""
    out = {}
    for p in pts:
        out[(p.name, tuple(sorted(p.attributes.items())))] = p
    return out


def wait_until(pred: Any, timeout: float = 60.0) -> Any:
    """Poll ``pred`` until it returns something true (AssertionError on timeout)."""
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError("timed out")

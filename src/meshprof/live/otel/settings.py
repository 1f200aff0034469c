"""Where and how the OTLP exporter sends: :class:`OtlpSettings`, resolved from the command line
and the standard OpenTelemetry environment variables the way the SDK reads them.

Off unless configured: an endpoint must be given, by ``--otlp-endpoint`` (``meshprof run``),
``--endpoint`` (``meshprof export``) or ``OTEL_EXPORTER_OTLP_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT``. What the
command line gives wins; otherwise a signal's own variable wins over the general one:

- endpoint: a *base* URL (``--otlp-endpoint``, ``OTEL_EXPORTER_OTLP_ENDPOINT``): with
  ``http/protobuf`` the signal's path is appended (``/v1/traces``, ``/v1/metrics``); a signal's
  own variable is its full URL. With ``grpc`` the URL is the collector's (``http://`` means
  without TLS, ``https://`` with);
- protocol: ``--otlp-protocol``, ``OTEL_EXPORTER_OTLP_{TRACES,METRICS}_PROTOCOL``,
  ``OTEL_EXPORTER_OTLP_PROTOCOL``; ``http/protobuf`` when none says (the specification's
  default); ``grpc`` or ``http/protobuf`` (``http/json`` is not in the Python SDK);
- a signal is off with ``OTEL_TRACES_EXPORTER=none`` / ``OTEL_METRICS_EXPORTER=none``, both with
  ``OTEL_SDK_DISABLED=true``;
- the metrics' period: ``OTEL_METRIC_EXPORT_INTERVAL`` (ms; the SDK's default, 60000);
- headers, timeout, compression, certificates (``OTEL_EXPORTER_OTLP_HEADERS``, ``..._TIMEOUT``,
  ...): read by the SDK's exporters themselves, as in any OpenTelemetry program;
- the resource: ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME`` over meshprof's own
  attributes (:mod:`meshprof.live.otel.exporters`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlparse

from meshprof.errors import MeshprofError
from meshprof.live.otel.trace_sampling import TraceSampling

PROTOCOLS = ("grpc", "http/protobuf")
DEFAULT_PROTOCOL = "http/protobuf"
SIGNALS = ("traces", "metrics")
DEFAULT_METRIC_INTERVAL_S = 60.0
"""The SDK's default ``OTEL_METRIC_EXPORT_INTERVAL`` (60000 ms)."""

_MODULES = {
    "grpc": "opentelemetry.exporter.otlp.proto.grpc",
    "http/protobuf": "opentelemetry.exporter.otlp.proto.http",
}


@dataclass(frozen=True, slots=True)
class SignalTarget:
    """Where one signal goes."""

    signal: str
    """``traces`` or ``metrics``."""
    protocol: str
    """``grpc`` or ``http/protobuf``."""
    endpoint: str
    """The URL the SDK exporter is given (http: the signal's full URL)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OtlpSettings:
    """The exporter's configuration (see the module docstring)."""

    traces: SignalTarget | None
    """Where spans go (None: not sent)."""
    metrics: SignalTarget | None
    """Where metrics go (None: not sent)."""
    metric_interval_s: float = DEFAULT_METRIC_INTERVAL_S
    """Seconds between two metric exports."""
    sampling: TraceSampling = field(default_factory=TraceSampling)
    """Which steps are sent as traces (live)."""
    span_queue: int = 4096
    """Spans waiting to be sent at most; more are dropped and counted."""
    span_batch: int = 512
    """Spans per export request at most."""
    shutdown_s: float = 5.0
    """Seconds the exporter may still take to send what it holds when the job ends."""

    def describe(self) -> str:
        """One line: where each signal goes."""
        parts = [
            f"{t.signal} to {t.endpoint} ({t.protocol})"
            for t in (self.traces, self.metrics)
            if t is not None
        ]
        return ", ".join(parts)


def _check_url(url: str, what: str) -> str:
    u = urlparse(url)
    if u.scheme not in ("http", "https") or not u.netloc:
        raise MeshprofError(
            f"{what} {url!r}: expected a URL such as http://collector:4318 (http:// or https://)"
        )
    try:
        u.port  # noqa: B018  (a port that is not a number raises here)
    except ValueError:
        raise MeshprofError(f"{what} {url!r}: the port is not a number") from None
    return url


def _protocol(value: str, what: str) -> str:
    p = value.strip().lower()
    if p not in PROTOCOLS:
        raise MeshprofError(f"{what} {value!r}: expected grpc or http/protobuf")
    return p


def _exporter_on(env: Mapping[str, str], name: str) -> bool:
    """``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER``: off when ``none``; otlp when unset
    or ``otlp``; anything else (console, zipkin, prometheus) is not meshprof's to send."""
    value = env.get(name, "").strip().lower()
    if not value:
        return True
    names = {v.strip() for v in value.split(",")}
    if names == {"none"}:
        return False
    if "otlp" in names:
        return True
    raise MeshprofError(f"{name}={value}: meshprof sends otlp (or none)")


def resolve_settings(
    endpoint: str | None = None,
    protocol: str | None = None,
    env: Mapping[str, str] | None = None,
    sampling: TraceSampling | None = None,
    what: str = "--otlp-endpoint",
) -> OtlpSettings | None:
    """The settings from the command line (``endpoint``, ``protocol``; None: not given) and
    ``env`` (the environment); None when nothing configures OTLP. A bad value raises
    :class:`MeshprofError` naming it."""
    import os

    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if endpoint is not None:
        _check_url(endpoint, what)
    if protocol is not None:
        protocol = _protocol(protocol, what.replace("endpoint", "protocol"))
    general_url = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    general_proto = env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").strip()
    targets: dict[str, SignalTarget | None] = {}
    for sig in SIGNALS:
        var = f"OTEL_EXPORTER_OTLP_{sig.upper()}"
        proto = protocol or _protocol(
            env.get(f"{var}_PROTOCOL", "").strip() or general_proto or DEFAULT_PROTOCOL,
            f"{var}_PROTOCOL"
            if env.get(f"{var}_PROTOCOL", "").strip()
            else "OTEL_EXPORTER_OTLP_PROTOCOL",
        )
        own = env.get(f"{var}_ENDPOINT", "").strip()
        if endpoint is not None:
            url, base = endpoint, True
        elif own:
            url, base = _check_url(own, f"{var}_ENDPOINT"), False
        elif general_url:
            url, base = _check_url(general_url, "OTEL_EXPORTER_OTLP_ENDPOINT"), True
        else:
            targets[sig] = None
            continue
        if not _exporter_on(env, f"OTEL_{sig.upper()}_EXPORTER"):
            targets[sig] = None
            continue
        if base and proto == "http/protobuf":
            url = url.rstrip("/") + f"/v1/{sig}"
        targets[sig] = SignalTarget(sig, proto, url)
    if targets["traces"] is None and targets["metrics"] is None:
        return None
    interval = DEFAULT_METRIC_INTERVAL_S
    raw = env.get("OTEL_METRIC_EXPORT_INTERVAL", "").strip()
    if raw:
        try:
            interval = float(raw) / 1000.0
        except ValueError:
            raise MeshprofError(
                f"OTEL_METRIC_EXPORT_INTERVAL={raw}: expected milliseconds (a number)"
            ) from None
        if not interval > 0:
            raise MeshprofError(f"OTEL_METRIC_EXPORT_INTERVAL={raw}: must be above 0")
    return OtlpSettings(
        traces=targets["traces"],
        metrics=targets["metrics"],
        metric_interval_s=interval,
        sampling=sampling or TraceSampling(),
    )


def check_installed(settings: OtlpSettings) -> None:
    """The OpenTelemetry SDK and the exporter of each protocol used are installed (the
    ``otel`` extra); else a :class:`MeshprofError` naming the extra."""
    needed = {"opentelemetry.sdk"} | {
        _MODULES[t.protocol] for t in (settings.traces, settings.metrics) if t is not None
    }
    for mod in sorted(needed):
        try:
            found = importlib.util.find_spec(mod) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise MeshprofError(f"OTLP export needs {mod} (pip install 'meshprof[otel]')")


__all__ = [
    "DEFAULT_PROTOCOL",
    "PROTOCOLS",
    "OtlpSettings",
    "SignalTarget",
    "check_installed",
    "resolve_settings",
]

"""``meshprof run``'s OpenTelemetry options and the
:class:`~meshprof.live.otel.settings.OtlpSettings` they make with the ``OTEL_*`` variables. A
bad value is a :class:`MeshprofError`: one line, exit code 2."""

from __future__ import annotations

import argparse
import sys

from meshprof.commands.arguments import option_number
from meshprof.errors import MeshprofError
from meshprof.live.otel.settings import OtlpSettings, check_installed, resolve_settings
from meshprof.live.otel.trace_sampling import TraceSampling


def add_otlp_options(p: argparse.ArgumentParser) -> None:
    """The OTLP options (:mod:`meshprof.live.otel`)."""
    g = p.add_argument_group(
        "OpenTelemetry",
        "push the live figures (metrics) and steps (traces) over OTLP from each node's "
        "launcher; off unless an endpoint is given here or in OTEL_EXPORTER_OTLP_ENDPOINT "
        "(the standard OTEL_* variables are honoured: headers, protocol, resource, service name)",
    )
    g.add_argument(
        "--otlp-endpoint",
        default=None,
        metavar="URL",
        help="OTLP collector or backend, e.g. http://collector:4318 (http/protobuf) or "
        "http://collector:4317 (--otlp-protocol grpc)",
    )
    g.add_argument(
        "--otlp-protocol",
        default=None,
        metavar="PROTOCOL",
        help="grpc or http/protobuf (default: $OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf)",
    )
    g.add_argument(
        "--otlp-every",
        default="100",
        metavar="N",
        help="send every Nth step as a trace (default 100; 1: every step; 0: none by number); "
        "slow steps and the steps around an alert or a capture are sent too",
    )
    g.add_argument(
        "--otlp-slow",
        default="1.5",
        metavar="X",
        help="send a step that lasted more than X times the median of the rank's previous "
        "steps (default 1.5; 0: off)",
    )


def otlp_settings_from_args(args: argparse.Namespace) -> OtlpSettings | None:
    """The OTLP settings of ``meshprof run``'s arguments and the environment (None: off)."""
    sampling = TraceSampling(
        every=option_number(args.otlp_every, "--otlp-every", int),
        slow=option_number(args.otlp_slow, "--otlp-slow"),
    )
    settings = resolve_settings(args.otlp_endpoint, args.otlp_protocol, sampling=sampling)
    if settings is not None and args.otlp_endpoint is None:
        # configured by the environment alone (perhaps for the script's own telemetry): without
        # the SDK, say so and run without it; --otlp-endpoint without it is an error
        try:
            check_installed(settings)
        except MeshprofError as e:
            print(f"meshprof run: warning: {e}; the job runs without OTLP export", file=sys.stderr)
            return None
    return settings


__all__ = ["add_otlp_options", "otlp_settings_from_args"]

"""``meshprof run``'s live alert and capture options, and the configurations they make
(:class:`~meshprof.analyze.live.alert_config.AlertConfig`,
:class:`~meshprof.analyze.live.capture_targets.CaptureConfig`). A bad value is a
:class:`MeshprofError`: one line, exit code 2."""

from __future__ import annotations

import argparse

from meshprof.analyze.live.alert_config import AlertConfig
from meshprof.analyze.live.capture_targets import CaptureConfig
from meshprof.commands.arguments import option_number
from meshprof.errors import MeshprofError


def add_alert_options(p: argparse.ArgumentParser) -> None:
    """The live alert options (rules in :mod:`meshprof.analyze.live.alerts`)."""
    g = p.add_argument_group(
        "live alerts",
        "rules the launcher evaluates every second on the live state (a threshold of 0 turns "
        "its rule off); each alert is a line on stderr, a line in DIR/live/alerts.jsonl and, "
        "with --alert-cmd, a command",
    )
    g.add_argument(
        "--alert-cmd",
        default=None,
        metavar="CMD",
        help="shell command run for an alert, with the alert as JSON on stdin",
    )
    g.add_argument(
        "--alert-interval",
        default="60",
        metavar="SECONDS",
        help="at most one --alert-cmd per rule and rank per this many seconds (default 60)",
    )
    g.add_argument(
        "--alert-step-regression",
        default="20",
        metavar="PCT",
        help="a rank's recent step time above its own early steps' by more than PCT %% "
        "and more than 3 times their spread (default 20)",
    )
    g.add_argument(
        "--alert-throughput-drop",
        default="30",
        metavar="PCT",
        help="tokens/s (or steps/s) below the rank's early rate by more than PCT %% and more "
        "than 3 times its spread (default 30)",
    )
    g.add_argument(
        "--alert-memory",
        default="90",
        metavar="PCT",
        help="memory above PCT %% of the device's (or host's) capacity (default 90)",
    )
    g.add_argument(
        "--alert-memory-growth",
        default="50",
        metavar="PCT",
        help="a rank's memory above its own early records' by more than PCT %% and 256 MiB "
        "(a leak; default 50)",
    )
    g.add_argument(
        "--alert-inflight",
        default="60",
        metavar="SECONDS",
        help="a collective in flight longer than this (default 60)",
    )
    g.add_argument(
        "--alert-stall",
        default="10",
        metavar="K",
        help="a rank's step has not advanced for more than K times its median step time and "
        "more than --alert-stall-floor, with or without a collective in flight (default 10)",
    )
    g.add_argument(
        "--alert-stall-floor",
        default="120",
        metavar="SECONDS",
        help="... and for more than this many seconds (default 120: evaluation or a "
        "checkpoint between steps is no stall)",
    )
    g.add_argument(
        "--alert-hang-floor",
        default="5",
        metavar="SECONDS",
        help="... or only this many when every running rank waits in a collective (none "
        "computes, loads data or checkpoints: a hang; default 5)",
    )
    g.add_argument(
        "--alert-noise-k",
        default="3",
        metavar="K",
        help="a step regression or throughput drop must also exceed K times the spread of "
        "the rank's own baseline (default 3; 0: the percentages alone)",
    )
    g.add_argument(
        "--alert-hold-looks",
        default="3",
        metavar="N",
        help="a step regression, throughput drop or memory growth holds in N consecutive "
        "records (default 3) ...",
    )
    g.add_argument(
        "--alert-hold-seconds",
        default="3",
        metavar="SECONDS",
        help="... and, a step regression or throughput drop, for this many seconds (default 3)",
    )
    g.add_argument(
        "--alert-memory-growth-floor",
        default="256M",
        metavar="SIZE",
        help="memory growth must also exceed this size (default 256M)",
    )
    g.add_argument(
        "--alert-straggler",
        default="20",
        metavar="PCT",
        help="a rank computes more than PCT %% longer per step than the others' median "
        "(default 20)",
    )
    g.add_argument(
        "--alert-straggler-looks",
        default="3",
        metavar="N",
        help="a rank is a live straggler in N consecutive records (default 3)",
    )
    g.add_argument(
        "--alert-decode-straggler",
        default="20",
        metavar="PCT",
        help="a serving rank's compute in its recent decode steps above its peers' by more "
        "than PCT %% (default 20)",
    )
    g.add_argument(
        "--alert-slo-attainment",
        default="90",
        metavar="PCT",
        help="a serving rank's share of recent requests meeting --slo below PCT %% (default 90)",
    )
    g.add_argument("--no-alerts", action="store_true", help="no live alerts")


def add_capture_options(p: argparse.ArgumentParser) -> None:
    """Captures on alerts (:mod:`meshprof.live.capture_trigger`) and the ranks' capture agent."""
    g = p.add_argument_group(
        "captures",
        "torch.profiler traces of a few steps on the culprit and a healthy peer with the same "
        "role, compared (meshprof capture RUN_DIR takes one by hand)",
    )
    g.add_argument(
        "--capture-on",
        default=None,
        metavar="TRIGGERS",
        help="capture when an alert is raised: straggler, slow-step, hang (or alert rule "
        "names), comma-separated; the --alert-cmd JSON then carries the capture",
    )
    g.add_argument(
        "--capture-steps", default="3", metavar="K", help="steps each capture traces (default 3)"
    )
    g.add_argument(
        "--capture-max-per-hour",
        default="4",
        metavar="N",
        help="at most N captures start in any hour (default 4)",
    )
    g.add_argument(
        "--capture-max-bytes",
        default="2G",
        metavar="SIZE",
        help="disk budget of RUN_DIR/captures (default 2G): no capture past it",
    )
    g.add_argument(
        "--capture-timeout",
        default="60",
        metavar="SECONDS",
        help="how long a capture waits for its ranks (default 60; 10 on a forming hang)",
    )
    g.add_argument(
        "--no-capture",
        action="store_true",
        help="the ranks run no capture agent: meshprof capture and meshprof stacks get no answer",
    )
    g.add_argument(
        "--requests-from-any-user",
        action="store_true",
        help="the ranks take capture and stacks requests from any user who can write the run "
        "directory (default: only from the job's own user; see docs/security.md)",
    )


def capture_config_from_args(args: argparse.Namespace) -> CaptureConfig:
    """The :class:`CaptureConfig` of ``meshprof run``'s capture options."""
    from meshprof.rundir.sampling import parse_bytes

    try:
        max_bytes = parse_bytes(args.capture_max_bytes)
    except MeshprofError:
        raise MeshprofError(
            f"--capture-max-bytes {args.capture_max_bytes!r}: expected a size such as 2G or 500M"
        ) from None
    on = tuple(t.strip() for t in (args.capture_on or "").split(",") if t.strip())
    return CaptureConfig(
        on=on,
        steps=option_number(args.capture_steps, "--capture-steps", int),
        max_per_hour=option_number(args.capture_max_per_hour, "--capture-max-per-hour", int),
        max_bytes=max_bytes,
        timeout_s=option_number(args.capture_timeout, "--capture-timeout"),
    )


def alert_config_from_args(args: argparse.Namespace) -> AlertConfig:
    """The :class:`AlertConfig` of ``meshprof run``'s alert options."""
    return AlertConfig(
        enabled=not args.no_alerts,
        command=args.alert_cmd or None,
        command_interval_s=option_number(args.alert_interval, "--alert-interval"),
        step_regression_pct=option_number(args.alert_step_regression, "--alert-step-regression"),
        throughput_drop_pct=option_number(args.alert_throughput_drop, "--alert-throughput-drop"),
        memory_pct=option_number(args.alert_memory, "--alert-memory"),
        memory_growth_pct=option_number(args.alert_memory_growth, "--alert-memory-growth"),
        inflight_s=option_number(args.alert_inflight, "--alert-inflight"),
        stall_factor=option_number(args.alert_stall, "--alert-stall"),
        stall_floor_s=option_number(args.alert_stall_floor, "--alert-stall-floor"),
        hang_floor_s=option_number(args.alert_hang_floor, "--alert-hang-floor"),
        noise_k=option_number(args.alert_noise_k, "--alert-noise-k"),
        hold_looks=option_number(args.alert_hold_looks, "--alert-hold-looks", int),
        hold_s=option_number(args.alert_hold_seconds, "--alert-hold-seconds"),
        memory_growth_floor_bytes=_size(
            args.alert_memory_growth_floor, "--alert-memory-growth-floor"
        ),
        straggler_pct=option_number(args.alert_straggler, "--alert-straggler"),
        straggler_looks=option_number(args.alert_straggler_looks, "--alert-straggler-looks", int),
        decode_straggler_pct=option_number(args.alert_decode_straggler, "--alert-decode-straggler"),
        slo_attainment_pct=option_number(args.alert_slo_attainment, "--alert-slo-attainment"),
    )


def _size(value: str, option: str) -> int:
    from meshprof.rundir.sampling import parse_bytes

    try:
        return parse_bytes(value)
    except MeshprofError:
        raise MeshprofError(f"{option} {value!r}: expected a size such as 256M or 1G") from None


__all__ = [
    "add_alert_options",
    "add_capture_options",
    "alert_config_from_args",
    "capture_config_from_args",
]

"""``meshprof run [options] (script.py | -m module) [args]``: profile an unmodified script under torchrun."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from meshprof.commands.arguments import option_number
from meshprof.commands.run_alert_options import (
    add_alert_options,
    add_capture_options,
    alert_config_from_args,
    capture_config_from_args,
)
from meshprof.commands.run_otlp_options import add_otlp_options, otlp_settings_from_args
from meshprof.config import native_from_env
from meshprof.errors import MeshprofError
from meshprof.launch.launcher import LaunchResult, launch
from meshprof.launch.native_prep import ENV_PREPARE, prepare_native
from meshprof.launch.run_options import RunOptions
from meshprof.records.serving import ServiceLevels

#: torchrun options passed through as they are (name without the leading dashes).
PASSTHROUGH = (
    "rdzv-backend",
    "rdzv-endpoint",
    "rdzv-id",
    "rdzv-conf",
    "master-addr",
    "master-port",
    "max-restarts",
    "monitor-interval",
    "local-addr",
    "log-dir",
    "redirects",
    "tee",
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="run a training script under torchrun with meshprof on in every worker",
        description="Run an unmodified training script under torchrun (torch.distributed.run) with "
        "the collective recorder, the step monitor (steps detected from optimizer steps, or forward calls in a script without an optimizer) and the "
        "per-rank writer on in every worker; write a run directory and print its summary. "
        "Options go before the script; everything after it is the script's.",
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="DIR",
        help="run directory (default ./meshprof-runs/<rdzv id or timestamp>)",
    )
    p.add_argument(
        "--nproc-per-node",
        "--nproc_per_node",
        default="1",
        help="workers per node: N, gpu, cpu or auto (default 1)",
    )
    p.add_argument("--nnodes", default="1", help="nodes: N or MIN:MAX (default 1)")
    p.add_argument("--node-rank", "--node_rank", default="0", help="this node's rank (default 0)")
    p.add_argument(
        "--standalone",
        action="store_true",
        default=None,
        help="single-node rendezvous on a free port (the default for one node)",
    )
    for name in PASSTHROUGH:
        p.add_argument(
            f"--{name}",
            f"--{name.replace('-', '_')}",
            dest=f"tr_{name.replace('-', '_')}",
            metavar="VALUE",
            help=argparse.SUPPRESS,
        )
    p.add_argument(
        "--flush-interval",
        default="30",
        metavar="SECONDS",
        help="seconds between periodic writes of the rank files (default 30)",
    )
    p.add_argument(
        "--live-interval",
        default="1",
        metavar="SECONDS",
        help="seconds between two live-state records of each rank, read by meshprof top/serve "
        "and the metrics exporter (default 1; 0: off)",
    )
    add_alert_options(p)
    add_capture_options(p)
    p.add_argument(
        "--metrics-port",
        default=None,
        metavar="PORT",
        help="serve Prometheus /metrics for this node's ranks on PORT (needs prometheus-client)",
    )
    p.add_argument(
        "--metrics-addr",
        default="127.0.0.1",
        metavar="ADDR",
        help="address the metrics endpoint binds (default 127.0.0.1; 0.0.0.0: every interface)",
    )
    add_otlp_options(p)
    p.add_argument(
        "--hang-timeout",
        default="300",
        metavar="SECONDS",
        help="watchdog: a collective in flight this long is a hang (default 300; 0 turns it off)",
    )
    p.add_argument(
        "--hang-action",
        default="kill",
        help="after a hang dump: kill (end the job, exit non-zero) or wait (default kill)",
    )
    p.add_argument(
        "--step-detect",
        default="auto",
        help="automatic step detection: auto (optimizer steps when the script steps an "
        "optimizer, else each outermost module forward call is a step: per-request latency), "
        "optimizer, forward or off (default auto)",
    )
    p.add_argument(
        "--max-events",
        default=None,
        metavar="N",
        help="per-rank ring-buffer capacity of the recorder (default 262144: the segments on "
        "disk hold the run)",
    )
    p.add_argument(
        "--slo",
        default="",
        metavar="NAME=TIME,...",
        help="service levels of a serving job (ttft, tpot, itl, e2e; e.g. ttft=200ms,tpot=50ms): "
        "the live goodput, SLO attainment and its alert count against them",
    )
    p.add_argument(
        "--retain",
        default="0",
        metavar="DURATION",
        help="delete each rank's segments older than this (e.g. 6h, 2d, 90m; default 0: no "
        "age bound); per-step totals are kept for the whole run",
    )
    p.add_argument(
        "--max-disk",
        default="1G",
        metavar="SIZE",
        help="keep each rank's files under SIZE by deleting its oldest segments (e.g. 2G, "
        "500M; default 1G; 0: no bound); per-step totals are kept for the whole run",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the result (run dir, exit code, manifest, statistics) as JSON",
    )
    p.add_argument(
        "--layout",
        default=None,
        metavar="dp=N,tp=N,pp=N",
        help="the job's 3D-parallel layout, to attribute communication to dimensions "
        "(default: $MESHPROF_LAYOUT, else pure data parallelism over all ranks)",
    )
    p.add_argument(
        "--native",
        action="store_true",
        help="require the native (C++) recorder (the default wherever it can be built: "
        "a failed build is then an error instead of a fallback to the Python recorder)",
    )
    p.add_argument("--no-summary", action="store_true", help="do not print the summary at the end")
    p.add_argument(
        "--no-report",
        action="store_true",
        help="print the ranks' table but not the cross-rank report at the end (only node 0 "
        "prints it in any case)",
    )
    p.add_argument(
        "-m",
        dest="module",
        nargs=argparse.REMAINDER,
        metavar="MODULE ...",
        help="run a module (as python -m) instead of a script",
    )
    p.add_argument(
        "target",
        nargs=argparse.REMAINDER,
        metavar="script.py [args]",
        help="the training script and its arguments",
    )
    p.set_defaults(func=run)


_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_s(value: str, option: str) -> float:
    """``"6h"``, ``"90m"``, ``"2d"``, ``"3600"`` (seconds) -> seconds."""
    text = value.strip().lower()
    scale = _UNITS_S.get(text[-1:], 0) if text else 0
    try:
        return float(text[:-1] if scale else text) * (scale or 1)
    except ValueError:
        raise MeshprofError(
            f"{option} {value!r}: expected a duration such as 6h, 90m, 2d or 3600 (seconds)"
        ) from None


def size_bytes(value: str, option: str) -> int:
    """``"2G"``, ``"500M"``, ``"2GB"``, ``"0"`` -> bytes (powers of 1024)."""
    from meshprof.rundir.sampling import parse_bytes

    try:
        return parse_bytes(value)
    except MeshprofError:
        raise MeshprofError(
            f"{option} {value!r}: expected a size such as 2G, 500M or 1.5GiB (0: no bound)"
        ) from None


def options_from_args(args: argparse.Namespace, argv: list[str] | None = None) -> RunOptions:
    """Turn the parsed command line into validated :class:`RunOptions`."""
    target = list(args.target or [])
    if target and target[0] == "--":
        target = target[1:]
    module = None
    script = None
    if args.module is not None:
        if not args.module:
            raise MeshprofError(
                "-m needs a module name (meshprof run [options] -m package.module [args])"
            )
        module, script_args = args.module[0], args.module[1:]
    elif target:
        if target[0].startswith("-"):
            raise MeshprofError(f"{target[0]}: unknown option (options go before the script)")
        script, script_args = target[0], target[1:]
    else:
        raise MeshprofError(
            "no training script given (meshprof run [options] script.py [args], or -m module)"
        )
    torchrun = {name: getattr(args, f"tr_{name.replace('-', '_')}") for name in PASSTHROUGH}
    return RunOptions(
        script=script,
        module=module,
        args=script_args,
        run_dir=Path(args.output) if args.output else None,
        nproc_per_node=str(args.nproc_per_node),
        nnodes=str(args.nnodes),
        node_rank=option_number(args.node_rank, "--node-rank", int),
        torchrun={k: str(v) for k, v in torchrun.items() if v is not None},
        standalone=args.standalone,
        flush_interval_s=option_number(args.flush_interval, "--flush-interval"),
        hang_timeout_s=option_number(args.hang_timeout, "--hang-timeout"),
        live_interval_s=option_number(args.live_interval, "--live-interval"),
        alerts=alert_config_from_args(args),
        capture=capture_config_from_args(args),
        capture_agent=not args.no_capture,
        requests_from_any_user=args.requests_from_any_user,
        hang_action=args.hang_action,
        step_detect=args.step_detect,
        max_events=option_number(args.max_events, "--max-events", int)
        if args.max_events is not None
        else None,
        metrics_port=option_number(args.metrics_port, "--metrics-port", int)
        if args.metrics_port is not None
        else None,
        metrics_addr=args.metrics_addr,
        otlp=otlp_settings_from_args(args),
        retain_s=duration_s(args.retain, "--retain"),
        max_disk_bytes=size_bytes(args.max_disk, "--max-disk"),
        slo=ServiceLevels.parse(args.slo).text() if args.slo else "",
        report=not args.no_report,
        command=["meshprof", *(argv if argv is not None else sys.argv[1:])],
    )


def run(args: argparse.Namespace) -> int:
    if args.native:
        prepare_native(force=True)  # here: a failed build is an error before anything starts
    elif native_from_env() is not False:
        os.environ[ENV_PREPARE] = "1"  # torchrun prepares it (torch is imported there anyway)
    if args.layout:
        from meshprof.launch.launcher import ENV_LAYOUT
        from meshprof.layout import parse_layout

        parse_layout(
            args.layout, f"{ENV_LAYOUT}={args.layout!r}"
        )  # a bad value is one line and exit code 2
        os.environ[ENV_LAYOUT] = args.layout
    opts = options_from_args(args)
    result = launch(opts)
    if result.hang is not None:
        _print_hang(result)
    if args.json:
        print(json.dumps(run_result_dict(result)))
    elif not args.no_summary:
        report = opts.report and result.node_rank == 0
        try:
            print_run_summary(result.run_dir, report=report)
        except MeshprofError as e:
            print(f"meshprof run: no summary: {e}", file=sys.stderr)
        if opts.report and not report:
            print(
                f"meshprof run: node {result.node_rank}: the job's report is node 0's "
                f"(or: meshprof report {result.run_dir})",
                file=sys.stderr,
            )
    return result.exit_code


def run_result_dict(result: LaunchResult) -> dict[str, Any]:
    """The ``--json`` output: where the run is, how it ended, and its merged statistics."""
    from meshprof.rundir import load_run

    out: dict[str, Any] = {
        "run_dir": str(result.run_dir),
        "exit_code": result.exit_code,
        "torchrun_exit_code": result.torchrun_exit_code,
        "hang": result.hang,
    }
    try:
        run_ = load_run(result.run_dir)
        out["manifest"] = run_.manifest.to_dict()
        out["ranks"] = _rank_rows(run_)
        out["problems"] = {_rank_key(e.first, e.last): e.reason for e in run_.problems.entries()}
        out["stats"] = _merged_stats(run_).to_dict()
    except MeshprofError as e:
        out["error"] = str(e)
    return out


def _print_hang(result: LaunchResult) -> None:
    """The hang diagnosis from the dumps in DIR/hang (``meshprof hang DIR`` prints the same)."""
    from meshprof.analyze.hang.diagnose import diagnose_hang
    from meshprof.render.hang import render_hang_text
    from meshprof.rundir.schema import HANG_DIR

    try:
        print(render_hang_text(diagnose_hang(result.run_dir / HANG_DIR)))
    except Exception as e:
        hang = result.hang or {}
        print(
            f"meshprof run: hang dumps in {result.run_dir / HANG_DIR} ({', '.join(hang.get('dumps', []))}); "
            f"could not diagnose them: {type(e).__name__}: {e}",
            file=sys.stderr,
        )


def _rank_rows(run_: Any) -> list[dict[str, Any]]:
    rows = []
    for r, rd in sorted(run_.ranks.items()):
        m = rd.meta
        steps = int((rd.spans["kind"] == 0).sum()) if len(rd.spans) else int(m.steps_detected or 0)
        total = m.total_events
        rows.append(
            {
                "rank": r,
                "hostname": m.hostname if m.hostname is not None else "",
                "events": len(rd.events),
                "total_events": int(total if total is not None else len(rd.events)),
                "steps": steps,
                "exit": m.exit.to_dict() if m.exit is not None else None,
            }
        )
    return rows


def _merged_stats(run_: Any) -> Any:
    from meshprof.stats import Accumulator, compute_stats

    acc: Accumulator | None = None
    for _r, rd in sorted(run_.ranks.items()):
        part = Accumulator.from_dict(rd.meta.stats or {})
        if acc is None:
            acc = part
        else:
            acc.merge(part)
    return compute_stats(acc or Accumulator(), None)


def print_run_summary(run_dir: Path, report: bool = True) -> None:
    """Print the run's summary: one line per rank (events, steps, how it ended), then (with
    ``report``) the cross-rank report of ``meshprof report DIR`` (or, if that analysis fails,
    the collective statistics merged over all ranks). The run is loaded as ``meshprof report``
    loads it: the report's columns only, a consistent sample when the whole run would need more
    than half of the available memory."""
    from rich.console import Console
    from rich.table import Table

    from meshprof.rundir import load_run
    from meshprof.rundir.sampling import choose_fraction, default_budget, events_on_disk

    fraction = choose_fraction(events_on_disk(run_dir), default_budget())
    reason = "the run's events would not fit in half of the available memory"
    run_ = load_run(run_dir, lean=True, sample=fraction, sample_reason=reason)
    console = Console(width=None if sys.stdout.isatty() else 140)
    m = run_.manifest
    console.print(
        f"[bold]meshprof run[/]: {run_dir} — world size {run_.world_size}, exit code {m.exit_code}, hosts {', '.join(m.hosts or [])}"
    )
    nodes = m.nodes or []
    if len(nodes) > 1:
        for n in nodes:
            console.print(
                f"  node {n.node_rank} ({n.host}): ranks {n.ranks}, "
                f"{n.status}, exit code {n.exit_code}"
            )
    t = Table(title="ranks", title_justify="left")
    for col in ("rank", "host", "events", "steps", "exit"):
        t.add_column(col, justify="left" if col in ("host", "exit") else "right")
    for row in _rank_rows(run_):
        ex = row["exit"] or {}
        t.add_row(
            str(row["rank"]),
            row["hostname"],
            str(row["total_events"]),
            str(row["steps"]),
            f"{ex.get('how', '?')} {ex.get('code', '')}".strip(),
        )
    console.print(t)
    for e in run_.problems.entries():
        console.print(f"[yellow]rank {_rank_key(e.first, e.last)}: {e.reason}[/]")
    if not report:
        return
    try:
        from meshprof.render.report_brief import print_brief
        from meshprof.report.analysis import analyze_run

        print_brief(analyze_run(run_), console)
    except Exception as e:
        from meshprof.render.stats_text import print_stats

        console.print(
            f"[yellow]cross-rank report unavailable ({type(e).__name__}: {e}); merged statistics:[/]"
        )
        print_stats(_merged_stats(run_), console, header="all ranks")


def _rank_key(first: int, last: int) -> str:
    """``"3"`` for one rank, ``"4-99"`` for consecutive ranks."""
    return str(first) if last == first else f"{first}-{last}"

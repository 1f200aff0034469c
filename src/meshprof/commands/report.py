"""``meshprof report DIR``: analyze a run directory across ranks and show it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console

from meshprof.analyze.stragglers import DEFAULT_THRESHOLD
from meshprof.errors import MeshprofError
from meshprof.report import analyze_run_parts
from meshprof.rundir import load_run


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report", help="cross-rank report of a run directory (stragglers, waits, clocks)"
    )
    p.add_argument("dir", help="run directory (manifest.json + rankNNNNN.npz files)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--html", metavar="FILE", help="write a self-contained HTML report")
    p.add_argument("--trace", metavar="FILE", help="write a merged Perfetto/Chrome JSON trace")
    p.add_argument(
        "--trace-max-events",
        type=int,
        default=None,
        metavar="N",
        help="collectives the trace keeps: beyond N, only the last whole steps that fit "
        "(default 250000; 0 keeps everything)",
    )
    p.add_argument(
        "--threshold",
        type=float,
        default=DEFAULT_THRESHOLD,
        help="straggler score threshold (fraction, default 0.05)",
    )
    p.set_defaults(func=run)


def _merge_kineto(trace: dict[str, Any], loaded: Any, clock: Any) -> None:
    """Link the run's torch.profiler traces into the merged timeline: each rank's trace events
    join that rank's process, moved onto the aligned clock."""
    from meshprof.analyze.kineto import find_traces, kineto_events, load_trace, trace_rank

    origin = int(trace.get("metadata", {}).get("t0_ns", 0))
    merged = 0
    for path in find_traces(loaded.path):
        try:
            rank = trace_rank(load_trace(path), path)
            trace["traceEvents"] += kineto_events(path, rank, clock.offset(rank), origin_ns=origin)
            merged += 1
        except Exception as e:  # a damaged trace is named, never fatal
            trace.setdefault("metadata", {}).setdefault("kineto_errors", []).append(f"{path}: {e}")
    trace.setdefault("metadata", {})["kineto_traces_merged"] = merged


def run(args: argparse.Namespace) -> int:
    if not (0.0 < args.threshold < 10.0):
        raise MeshprofError(f"--threshold must be a fraction in (0, 10), got {args.threshold}")
    for opt in ("html", "trace"):
        target = getattr(args, opt)
        if target and Path(target).is_dir():
            raise MeshprofError(f"--{opt} {target}: is a directory (give a file name)")
    if args.trace_max_events is not None and args.trace_max_events < 0:
        raise MeshprofError(f"--trace-max-events must be >= 0, got {args.trace_max_events}")
    loaded = load_run(Path(args.dir))
    # nothing below reads the raw event rows: the analysis lets them go once tabled
    parts = analyze_run_parts(loaded, threshold=args.threshold, release_events=True)
    rep = parts.report
    written = []
    if args.html:
        from meshprof.render.html import write_html

        written.append(write_html(Path(args.html), rep))
    if args.trace:
        from meshprof.analyze.merged_timeline import DEFAULT_MAX_EVENTS
        from meshprof.render.perfetto import build_trace, write_trace

        cap = DEFAULT_MAX_EVENTS if args.trace_max_events is None else args.trace_max_events
        trace = build_trace(loaded, parts.table, parts.clock, parts.match, max_events=cap)
        _merge_kineto(trace, loaded, parts.clock)
        written.append(write_trace(Path(args.trace), trace))
    if args.json:
        print(json.dumps(rep.to_dict(), default=str))
        return 0
    from meshprof.render.report_text import print_report

    console = Console()
    print_report(rep, console)
    for w in written:
        console.print(f"wrote {w}", highlight=False)
    return 0

"""``meshprof report DIR``: analyze a run directory across ranks and show it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from meshprof.analyze.crossrank import analyze_run
from meshprof.analyze.stragglers import DEFAULT_THRESHOLD
from meshprof.errors import MeshprofError
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
        "--threshold",
        type=float,
        default=DEFAULT_THRESHOLD,
        help="straggler score threshold (fraction, default 0.05)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not (0.0 < args.threshold < 10.0):
        raise MeshprofError(f"--threshold must be a fraction in (0, 10), got {args.threshold}")
    for opt in ("html", "trace"):
        target = getattr(args, opt)
        if target and Path(target).is_dir():
            raise MeshprofError(f"--{opt} {target}: is a directory (give a file name)")
    loaded = load_run(Path(args.dir))
    rep = analyze_run(loaded, threshold=args.threshold)
    written = []
    if args.html:
        from meshprof.render.html import write_html

        written.append(write_html(Path(args.html), rep))
    if args.trace:
        from meshprof.analyze.clock import align_clocks
        from meshprof.analyze.match import match_collectives
        from meshprof.analyze.table import build_event_table
        from meshprof.render.perfetto import build_trace, write_trace

        table = build_event_table(loaded)
        clock = align_clocks(loaded, table)
        written.append(
            write_trace(
                Path(args.trace), build_trace(loaded, table, clock, match_collectives(table, clock))
            )
        )
    if args.json:
        print(json.dumps(rep.to_dict(), default=str))
        return 0
    from meshprof.render.report_console import print_report

    console = Console()
    print_report(rep, console)
    for w in written:
        console.print(f"wrote {w}", highlight=False)
    return 0

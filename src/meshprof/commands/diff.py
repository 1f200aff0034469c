"""``meshprof diff RUN_A RUN_B``: what changed between two run directories (every delta B − A)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from meshprof.analyze.diff.compare import RunSide, check_side, diff_runs
from meshprof.commands.arguments import add_json_option
from meshprof.errors import MeshprofError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "diff",
        help="compare two run directories: step, phases, ranks, collectives, memory, bottlenecks",
    )
    p.add_argument(
        "run_a",
        metavar="RUN_A",
        help="the run before (the baseline); DIR1,DIR2,...: the node-local directories of one run",
    )
    p.add_argument("run_b", metavar="RUN_B", help="the run after; every delta is B − A")
    add_json_option(p, "the comparison")
    p.add_argument("--html", metavar="FILE", help="write a self-contained HTML page")
    p.set_defaults(func=run)


def run_dirs(arg: str) -> list[Path]:
    """A RUN argument as directories: one directory, or a comma-separated list of the
    node-local directories of one run (a directory whose own name has a comma is one)."""
    if Path(arg).is_dir() or "," not in arg:
        return [Path(arg)]
    return [Path(p) for p in arg.split(",") if p]


def _side(path: str) -> RunSide:
    """One run's figures; its report and events are let go before the other run is read."""
    from meshprof.report.analysis import analyze_run
    from meshprof.report.diff_input import side_of
    from meshprof.report.workers import default_workers
    from meshprof.rundir import load_run

    loaded = load_run(run_dirs(path))
    # (the per-rank step analyses on worker processes from 64 ranks on, as in `report`)
    workers = default_workers(len(loaded.ranks))
    report = analyze_run(loaded, release_events=True, workers=workers)
    side = side_of(report, loaded.layout())
    check_side(side)
    return side


def run(args: argparse.Namespace) -> int:
    if args.html and Path(args.html).is_dir():
        raise MeshprofError(f"--html {args.html}: is a directory (give a file name)")
    for arg in (args.run_a, args.run_b):  # both named before either is analysed
        for path in run_dirs(arg):
            if not path.is_dir():
                why = "no such directory" if not path.exists() else "not a directory"
                raise MeshprofError(f"{path}: {why} (expected a meshprof run directory)")
    d = diff_runs(_side(args.run_a), _side(args.run_b))
    written = []
    if args.html:
        from meshprof.render.diff_html import write_diff_html

        written.append(write_diff_html(Path(args.html), d))
    if args.json:
        print(json.dumps(d.to_dict()))
        return 0
    from rich.console import Console

    from meshprof.render.diff_text import print_diff

    console = Console()
    print_diff(d, console)
    for w in written:
        console.print(f"wrote {w}", highlight=False)
    return 0

"""``meshprof summary FILE.json``: print a recorder export as tables."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console

from meshprof.export import load_export
from meshprof.render.console import print_stats


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("summary", help="print an export_json() file as tables")
    p.add_argument("file", help="a JSON file written by CommProfiler.export_json()")
    p.add_argument("--json", action="store_true", help="print the statistics as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    export = load_export(Path(args.file))
    if args.json:
        out: dict[str, Any] = {"meta": export.meta, "stats": export.stats.to_dict()}
        print(json.dumps(out))
        return 0
    meta = export.meta
    console = Console()
    console.print(
        f"[bold]{args.file}[/]: rank {meta.get('rank')} of {meta.get('world_size')}, "
        f"{meta.get('total_events', len(export.events))} events "
        f"({meta.get('evicted_events', 0)} evicted), meshprof {meta.get('meshprof_version', '?')}"
    )
    print_stats(export.stats, console)
    if meta.get("internal_errors"):
        console.print(
            f"[yellow]meshprof internal errors: {meta['internal_errors']} (first: {meta.get('first_internal_error')})[/]"
        )
    return 0

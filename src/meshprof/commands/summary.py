"""``meshprof summary FILE.json``: print a recorder export as tables."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from meshprof.render.stats_text import print_stats
from meshprof.rundir.json_export import load_export


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("summary", help="print an export_json() file as tables")
    p.add_argument("file", help="a JSON file written by CommProfiler.export_json()")
    p.add_argument("--json", action="store_true", help="print the statistics as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    export = load_export(Path(args.file))
    if args.json:
        out: dict[str, Any] = {"meta": export.meta.to_dict(), "stats": export.stats.to_dict()}
        print(json.dumps(out))
        return 0
    meta = export.meta
    # piped output gets a width the 12-column table fits in, not rich's default of 80
    console = Console(width=None if sys.stdout.isatty() else 160)
    rank = meta.rank if meta.rank is not None else -1
    world = meta.world_size if meta.world_size is not None else -1
    where = f"rank {rank} of {world}" if rank >= 0 else "no process group"
    total = meta.total_events if meta.total_events is not None else len(export.events)
    flying = f", {meta.inflight_events} in flight" if meta.inflight_events else ""
    console.print(
        f"[bold]{args.file}[/]: {where}, {total} events "
        f"({meta.evicted_events or 0} evicted{flying}), meshprof {meta.meshprof_version or '?'}"
    )
    cpu = meta.recorder_cpu
    if cpu is not None and cpu.total_ns is not None:
        per = cpu.per_collective_ns
        per_txt = f", {per / 1e3:.2f} µs per collective" if per is not None else ""
        console.print(
            f"recorder threads: {cpu.total_ns / 1e6:.1f} ms CPU{per_txt}, "
            f"{cpu.per_second_ms or 0.0:.2f} ms per second"
        )
    print_stats(export.stats, console)
    if meta.internal_errors:
        console.print(
            f"[yellow]meshprof internal errors: {meta.internal_errors} (first: {meta.first_internal_error})[/]"
        )
    return 0

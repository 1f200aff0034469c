"""``meshprof top RUN_DIR``: a live terminal view of a running (or finished) job, from the live
state its ranks publish (``RUN_DIR/live/``); ``--once`` / ``--json`` print one snapshot."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console, RenderableType

from meshprof.analyze.live.snapshot import read_snapshot, snapshot_to_dict
from meshprof.analyze.live.top_table import SORT_KEYS, build_top_table
from meshprof.commands.arguments import add_json_option, option_number
from meshprof.errors import MeshprofError
from meshprof.records.live import LiveSnapshot
from meshprof.render.live_top import render_top, render_waiting
from meshprof.rundir.live import live_dir
from meshprof.rundir.schema import MANIFEST, rank_entries

#: Lines of a frame that are not rank rows (header, stragglers, table head, alerts, keys).
FRAME_OVERHEAD = 13


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "top",
        help="live view of a running job: one row per rank, stragglers, alerts",
        description="Show a running (or finished) meshprof run's live state: per rank the step, "
        "recent step time with a sparkline, throughput, communication and exposed shares, "
        "memory and the collective in flight; stale ranks, live stragglers and the last "
        "alerts. Keys: "
        + ", ".join(f"{k} sort by {v}" for k, v in SORT_KEYS.items())
        + ", q quit.",
    )
    p.add_argument("dir", help="the run directory (meshprof run -o DIR; shared across nodes)")
    p.add_argument("--once", action="store_true", help="print one snapshot and exit")
    add_json_option(p, "one snapshot")
    p.add_argument(
        "--interval", default="1", metavar="SECONDS", help="seconds between refreshes (default 1)"
    )
    p.add_argument(
        "--rows",
        default=None,
        metavar="N",
        help="show the top N ranks by the sort key (default: what fits the terminal; all when "
        "the output is not a terminal)",
    )
    p.add_argument(
        "--sort",
        default="cost",
        metavar="KEY",
        help=f"initial sort: {', '.join(SORT_KEYS.values())} (default cost: the worst rank "
        "first — stale, dead or stuck, then the highest straggler score)",
    )
    p.set_defaults(func=run)


def check_run_dir(path: Path) -> None:
    """Raise :class:`MeshprofError` unless ``path`` looks like a run directory (live state, a
    manifest or rank files)."""
    if not path.is_dir():
        raise MeshprofError(f"{path}: no such directory")
    if live_dir(path).is_dir() or (path / MANIFEST).is_file():
        return
    if rank_entries(path):
        return
    raise MeshprofError(
        f"{path}: not a meshprof run directory (no live/, {MANIFEST} or rank files)"
    )


def _positive(value: str, option: str, kind: type = float) -> float:
    v = option_number(value, option, kind)
    if not v > 0:
        raise MeshprofError(f"{option} {value}: must be > 0")
    return float(v)


def run(args: argparse.Namespace) -> int:
    path = Path(args.dir)
    interval = _positive(args.interval, "--interval")
    rows = int(_positive(args.rows, "--rows", int)) if args.rows is not None else None
    if args.sort not in SORT_KEYS.values():
        raise MeshprofError(f"--sort {args.sort!r}: expected {', '.join(SORT_KEYS.values())}")
    check_run_dir(path)
    if args.json or args.once:
        snap = read_snapshot(path)
        if not snap.ranks:
            raise MeshprofError(_no_live_state(path))
        if args.json:
            print(json.dumps(snapshot_to_dict(snap)))
            return 0
        console = Console(width=None if sys.stdout.isatty() else 160)
        console.print(render_top(build_top_table(snap, args.sort, rows), str(path)))
        return 0
    return _live(path, interval, rows, args.sort)


def _no_live_state(path: Path) -> str:
    return (
        f"{path}: no live state yet ({live_dir(path)} holds no rank records: the run predates "
        "live monitoring, ran with --live-interval 0, or its ranks have not started)"
    )


def _live(path: Path, interval: float, rows: int | None, sort: str) -> int:
    """The refreshing view until q (or Ctrl-C); without a terminal on stdin, until the job ends."""
    from rich.live import Live

    console = Console(width=None if sys.stdout.isatty() else 160)
    interactive = sys.stdin.isatty()
    with (
        _cbreak(interactive),
        Live(
            console=console,
            screen=console.is_terminal,
            auto_refresh=False,
            vertical_overflow="ellipsis" if console.is_terminal else "visible",
        ) as live,
    ):
        try:
            while True:
                snap = read_snapshot(path)
                live.update(_frame(snap, path, console, rows, sort, interactive), refresh=True)
                if snap.ended and not interactive:
                    return 0
                key = _read_key(interval) if interactive else _sleep(interval)
                if key == "q":
                    return 0
                if key in SORT_KEYS:
                    sort = SORT_KEYS[key]
        except KeyboardInterrupt:
            return 0


def _frame(
    snap: LiveSnapshot, path: Path, console: Console, rows: int | None, sort: str, keys: bool
) -> RenderableType:
    if not snap.ranks:
        return render_waiting(str(path))
    limit = rows
    if limit is None and console.is_terminal:
        limit = max(console.height - FRAME_OVERHEAD, 3)
    return render_top(build_top_table(snap, sort, limit), str(path), interactive=keys)


@contextlib.contextmanager
def _cbreak(on: bool) -> Iterator[None]:
    """The terminal on stdin in cbreak mode (keys without Enter, no echo) for the block."""
    if not on:
        yield
        return
    import termios
    import tty

    fd = sys.stdin.fileno()
    old = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, old)


def _read_key(timeout: float) -> str:
    """One key pressed within ``timeout`` seconds ("" when none)."""
    ready, _, _ = select.select([sys.stdin], [], [], timeout)
    if not ready:
        return ""
    return os.read(sys.stdin.fileno(), 1).decode("utf-8", "replace").lower()


def _sleep(seconds: float) -> str:
    time.sleep(seconds)
    return ""

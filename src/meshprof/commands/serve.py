"""``meshprof serve DIR``: a live web dashboard of a run directory (while the job runs and after)."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from meshprof.errors import MeshprofError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="live web dashboard of a run directory (step time, throughput, communication, "
        "memory, stragglers, alerts; /metrics; the full report once the run ends)",
    )
    p.add_argument("dir", help="the run directory (meshprof run -o DIR)")
    p.add_argument("--port", type=int, default=8050, help="TCP port (default 8050; 0: any free)")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1; 0.0.0.0 serves every interface)",
    )
    p.set_defaults(func=run)


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    from meshprof.live.server import LiveServer, is_run_dir, make_server, serve_until_interrupted

    run_dir = Path(args.dir)
    if not is_run_dir(run_dir):
        raise MeshprofError(
            f"{run_dir}: not a meshprof run directory (no manifest.json, live/ or rank files)"
        )
    live = LiveServer(run_dir)
    try:
        server = make_server(live, args.host, args.port)
    except MeshprofError:
        live.stop()
        raise
    host, port = str(server.server_address[0]), int(server.server_address[1])
    shown = f"[{host}]" if ":" in host else host
    print(f"meshprof serve: http://{shown}:{port}/ ({run_dir}; Ctrl-C stops)", flush=True)
    old = {}
    if threading.current_thread() is threading.main_thread():
        # SIGINT too: a process started in the background by a non-interactive shell inherits
        # SIGINT ignored, and Python then leaves it so (Ctrl-C, kill -INT would not stop it)
        old = {s: signal.signal(s, _interrupt) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        live.start()
        serve_until_interrupted(server)
    finally:
        for s, h in old.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(s, h)
    print("meshprof serve: stopped", file=sys.stderr)
    return 0

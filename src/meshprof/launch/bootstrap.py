"""The worker side of ``meshprof run``: ``python -m meshprof.launch.bootstrap (script.py | -m module) [args]``.

torchrun starts this in every worker. It turns meshprof on, then runs the user's unmodified
script as ``__main__`` with the ``sys.argv`` the script expects:

1. the collective recorder (:func:`meshprof.enable`);
2. the step monitor, with automatic step detection (``step_detect``, default auto):
   every step of the first optimizer that steps ends a training step, or, in a script that does
   not train, each outermost module forward call is a step (see ``RecordingSession``);
3. the rank writer (:class:`meshprof.rundir.writer.RankWriter`): the rank file is written every
   ``flush_interval_s`` seconds, at exit, on an unhandled exception and on SIGTERM;
4. the hang watchdog (``hang_timeout_s`` > 0), dumping into ``RUN_DIR/hang``;
5. a wrapper around ``torch.distributed.init_process_group`` that, once the default group
   exists, runs the clock synchronization exchange and writes a first rank file.

All of it is one :class:`meshprof.session.recording.RecordingSession` configured from the
launcher's :class:`~meshprof.records.worker_settings.WorkerSettings` (:func:`session_config`). Setup problems are reported on stderr and never stop the script; the
script's exit code and exceptions pass through unchanged.
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any

from meshprof.layout import parse_layout
from meshprof.records.worker_settings import WorkerSettings
from meshprof.session.recording import RecordingSession, SessionConfig, warn_part_failed

USAGE = "usage: python -m meshprof.launch.bootstrap (script.py | -m module) [args]"


def session_config(target: dict[str, Any]) -> SessionConfig:
    """The worker's recording session, from the launcher's :class:`WorkerSettings` and
    torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``GROUP_RANK``)."""
    settings = WorkerSettings.from_env(os.environ) or WorkerSettings(run_dir="meshprof-runs/worker")
    meta: dict[str, Any] = {
        "target": target,
        "local_rank": int(os.environ.get("LOCAL_RANK", "0") or 0),
        "node_rank": int(os.environ.get("GROUP_RANK", "0") or 0),
        "node_id": settings.node_id,
        "torchrun_restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0),
        "bootstrap_start_ns": time.time_ns(),
    }
    world = os.environ.get("WORLD_SIZE", "")
    if world.isdigit():
        meta["world_size"] = int(world)
    layout: dict[str, int] | None = None
    if settings.layout:
        try:
            layout = parse_layout(settings.layout, f"--layout {settings.layout!r}")
        except Exception as e:
            warn_part_failed("reading the layout", e)
    elif world.isdigit():
        # no layout given: assume pure data parallelism over all ranks (said in the meta)
        layout = {"dp": int(world), "tp": 1, "pp": 1}
        meta["layout_assumed"] = True
    profiler = None
    if settings.max_events is not None:
        from meshprof.config import ProfilerConfig

        profiler = ProfilerConfig(max_events=settings.max_events)
    return SessionConfig(
        run_dir=Path(settings.run_dir),
        flush_interval_s=settings.flush_interval_s,
        live_interval_s=settings.live_interval_s,
        profiler=profiler,
        layout=layout,
        step_detection=settings.step_detect or "auto",
        wrap_init_process_group=True,
        hang_timeout_s=settings.hang_timeout_s,
        capture=settings.capture,
        meta=meta,
    )


def _exit_code(code: Any) -> int:
    """The process exit status Python gives ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    return 1


def run_target(session: RecordingSession, target: dict[str, Any]) -> None:
    """Run the script or module as ``__main__``; record how it ended; re-raise what it raised."""
    args = list(target["args"])
    try:
        if target["kind"] == "module":
            sys.argv = [target["name"], *args]
            runpy.run_module(target["name"], run_name="__main__", alter_sys=True)
        else:
            script = target["name"]
            sys.argv = [script, *args]
            sys.path[0] = str(Path(script).resolve().parent)
            runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = _exit_code(e.code)
        session.set_exit("normal" if code == 0 else "exit", code)
        raise
    except BaseException as e:
        session.set_exit("exception", 1, f"{type(e).__name__}: {e}")
        raise
    session.set_exit("normal", 0)


def parse_argv(argv: list[str]) -> dict[str, Any]:
    """``[script, args...]`` or ``["-m", module, args...]`` -> target dict."""
    if not argv or (argv[0] == "-m" and len(argv) < 2):
        print(USAGE, file=sys.stderr)
        raise SystemExit(2)
    if argv[0] == "-m":
        return {"kind": "module", "name": argv[1], "args": argv[2:]}
    return {"kind": "script", "name": argv[0], "args": argv[1:]}


def main() -> None:
    target = parse_argv(sys.argv[1:])
    session = RecordingSession()  # stays off if the setup itself fails
    try:
        session = RecordingSession(session_config(target)).start()
    except Exception as e:
        warn_part_failed("meshprof setup", e)
    run_target(session, target)


if __name__ == "__main__":
    main()

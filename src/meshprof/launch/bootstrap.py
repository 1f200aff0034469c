"""The worker side of ``meshprof run``: ``python -m meshprof.launch.bootstrap (script.py | -m module) [args]``.

torchrun starts this in every worker. It turns meshprof on, then runs the user's unmodified
script as ``__main__`` with the ``sys.argv`` the script expects:

1. the collective recorder (:func:`meshprof.enable`);
2. the step monitor, with automatic step detection (``step_detect``, default auto):
   every step of the first optimizer that steps ends a training step, or, in a script that does
   not train, each outermost module forward call is a step (see ``RecordingSession``);
3. the rank writer (:class:`meshprof.rundir.writer.RankWriter`): what is new is appended to
   the rank's segments every half second, its meta refreshed every ``flush_interval_s``
   seconds, at exit, on an unhandled exception and on SIGTERM; the recorder's ring
   (:data:`RING_EVENTS` unless ``--max-events``) and the step monitor's rows
   (:data:`MONITOR_ROWS`) stay small, the segments holding the run;
4. the hang watchdog (``hang_timeout_s`` > 0), dumping into ``RUN_DIR/hang``;
5. a wrapper around ``torch.distributed.init_process_group`` that, once the default group
   exists, runs the clock synchronization exchange and writes a first rank file.

All of it is one :class:`meshprof.session.recording.RecordingSession` configured from the
launcher's :class:`~meshprof.records.worker_settings.WorkerSettings` (:func:`session_config`).
With several nodes the worker first waits for the run directory its launcher agreed on with the
others (:func:`await_decision`); a worker whose launcher is gone ends itself
(:func:`watch_launcher`). Setup problems are reported on stderr and never stop the script; the
script's exit code and exceptions pass through unchanged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import runpy
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from meshprof.launch.process_identity import start_time, still_running
from meshprof.layout import parse_layout
from meshprof.records.worker_settings import WorkerSettings
from meshprof.session.recording import RecordingSession, SessionConfig, warn_part_failed

USAGE = "usage: python -m meshprof.launch.bootstrap (script.py | -m module) [args]"
RING_EVENTS = 1 << 18
"""The recorder's ring under ``meshprof run`` without ``--max-events`` (14 MB): the segments
hold the run, the ring only what a tick has not appended yet (and, on a full disk, the newest
events in memory)."""
MONITOR_ROWS = 16_384
"""Spans and memory samples the step monitor keeps in memory under ``meshprof run``."""
DECISION_WAIT_S = 300.0
"""Seconds a worker waits for its launcher's run decision (several nodes) before it writes to
the directory it was started with."""
LAUNCHER_CHECK_S = 1.0


def await_decision(settings: WorkerSettings, timeout_s: float = DECISION_WAIT_S) -> WorkerSettings:
    """``settings`` with the run directory and id the launchers agreed on (several nodes: the
    launcher writes them into ``decision_file`` once agreed; the workers write nothing before).
    Unchanged when there is no decision to wait for, or none came in time (said on stderr)."""
    if not settings.decision_file:
        return settings
    path = Path(settings.decision_file)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            got = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(got, dict) and got.get("run_dir"):
                return dataclasses.replace(
                    settings,
                    run_dir=str(got["run_dir"]),
                    run_id=str(got.get("run_id") or ""),
                    decision_file="",
                )
        time.sleep(0.05)
    warn_part_failed(
        "agreeing on the run directory", TimeoutError(f"no decision in {path} after {timeout_s} s")
    )
    return settings


def watch_launcher(pid: int, every_s: float = LAUNCHER_CHECK_S) -> threading.Thread | None:
    """End this worker (SIGTERM to itself: the rank writer writes its final data first) once
    the ``meshprof run`` launcher ``pid`` is gone (killed: nothing supervises the job any
    more). None when there is no launcher to watch."""
    if pid <= 0:
        return None
    created = start_time(pid)
    if created is None:
        return None

    def run() -> None:
        while still_running(pid, created):
            time.sleep(every_s)
        with contextlib.suppress(Exception):
            print(
                f"meshprof: the launcher (pid {pid}) is gone; ending this worker", file=sys.stderr
            )
        os.kill(os.getpid(), signal.SIGTERM)

    t = threading.Thread(target=run, name="meshprof-launcher-watch", daemon=True)
    t.start()
    return t


def session_config(target: dict[str, Any], settings: WorkerSettings | None = None) -> SessionConfig:
    """The worker's recording session, from the launcher's :class:`WorkerSettings` and
    torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``GROUP_RANK``)."""
    if settings is None:
        settings = WorkerSettings.from_env(os.environ)
    settings = settings or WorkerSettings(run_dir="meshprof-runs/worker")
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
    from meshprof.config import ProfilerConfig
    from meshprof.rundir.segment_writer import StorageLimits

    profiler = ProfilerConfig(max_events=settings.max_events or RING_EVENTS)
    slo = None
    if settings.slo:
        from meshprof.records.serving import ServiceLevels

        try:
            slo = ServiceLevels.parse(settings.slo)
        except Exception as e:
            warn_part_failed("reading the service levels", e)
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
        capture_limits=settings.capture_limits,
        meta=meta,
        storage=StorageLimits(
            retain_s=settings.retain_s,
            max_disk_bytes=settings.max_disk_bytes,
            fsync_interval_s=settings.flush_interval_s,
        ),
        run_id=settings.run_id or None,
        monitor_rows=MONITOR_ROWS,
        serving_hooks=True,
        slo=slo,
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
        settings = WorkerSettings.from_env(os.environ)
        if settings is not None:
            settings = await_decision(settings)
            watch_launcher(settings.launcher_pid)
        session = RecordingSession(session_config(target, settings)).start()
    except Exception as e:
        warn_part_failed("meshprof setup", e)
    run_target(session, target)


if __name__ == "__main__":
    main()

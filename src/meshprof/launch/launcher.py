"""``meshprof run``'s launcher: start torchrun with the worker bootstrap, watch it, keep its code.

The launcher runs ``python -m meshprof.launch.torchrun <torchrun options> -m meshprof.launch.bootstrap
<script.py | -m module> <args>``: torchrun (the real launcher, ``torch.distributed.run`` run by
:mod:`meshprof.launch.torchrun`, which also keeps how failed workers ended; multi-node included)
starts the workers, and each worker runs :mod:`meshprof.launch.bootstrap`, which turns the recorder, the step
monitor and the rank writer on before running the user's unmodified script. Settings reach the
workers as one JSON record in one environment variable
(:class:`~meshprof.records.worker_settings.WorkerSettings`). The launcher writes the run directory's
manifest at start and again at the end (:mod:`meshprof.launch.run_record`), and, when a worker's watchdog writes a dump into ``DIR/hang/``, asks the other local
workers to dump too (SIGUSR1), ends the job and reports the hang.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshprof.errors import MeshprofError
from meshprof.launch.run_options import RunOptions
from meshprof.launch.run_record import (
    EXIT_HANG,
    finish_manifest,
    node_id,
    node_record,
    start_manifest,
    write_merged_manifest,
)
from meshprof.records.worker_settings import WORKER_ENV, WorkerSettings
from meshprof.rundir.hang_dumps import dump_files
from meshprof.rundir.manifest import write_node_record
from meshprof.rundir.schema import HANG_DIR
from meshprof.rundir.worker_exits import read_worker_exits, worker_exits_path

ENV_LAYOUT = "MESHPROF_LAYOUT"
"""The job's dp × tp × pp layout when ``--layout`` is not given (``dp=2,tp=4,pp=2`` or
``2x4x2``); the workers get it in their :class:`~meshprof.records.worker_settings.WorkerSettings`."""

#: Seconds to wait for the other workers' dumps after the first one appears.
HANG_DUMP_WAIT_S = 15.0


def torchrun_command(opts: RunOptions) -> list[str]:
    """The torchrun command line that runs the bootstrap in every worker (torchrun through
    :mod:`meshprof.launch.torchrun`, which keeps how failed workers ended)."""
    cmd = [sys.executable, "-m", "meshprof.launch.torchrun"]
    cmd += ["--nproc-per-node", opts.nproc_per_node, "--nnodes", opts.nnodes]
    given = set(opts.torchrun)
    standalone = opts.standalone
    if standalone is None:
        standalone = opts.nnodes == "1" and not given & {
            "rdzv-endpoint",
            "rdzv-backend",
            "master-addr",
            "master-port",
        }
    if standalone:
        cmd.append("--standalone")
    else:
        cmd += ["--node-rank", str(opts.node_rank)]
    for name, value in opts.torchrun.items():
        cmd += [f"--{name}", value]
    cmd += ["-m", "meshprof.launch.bootstrap"]
    if opts.module is not None:
        cmd += ["-m", opts.module]
    else:
        assert opts.script is not None
        cmd.append(opts.script)
    return cmd + list(opts.args)


def worker_env(
    opts: RunOptions, run_dir: Path, base: dict[str, str] | None = None
) -> dict[str, str]:
    """The environment of torchrun and its workers: the caller's, plus meshprof's settings."""
    env = dict(os.environ if base is None else base)
    settings = WorkerSettings(
        run_dir=str(run_dir),
        node_id=node_id(),
        worker_exits=str(worker_exits_path(run_dir, node_id())),
        flush_interval_s=float(opts.flush_interval_s),
        hang_timeout_s=float(opts.hang_timeout_s),
        step_detect=opts.step_detect,
        live_interval_s=float(opts.live_interval_s),
        capture=opts.capture_agent,
        max_events=opts.max_events,
        layout=env.get(ENV_LAYOUT, ""),
    )
    env[WORKER_ENV] = settings.to_env()
    # Workers import meshprof from wherever this launcher did (a checkout without install works).
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _local_workers(proc: subprocess.Popen[bytes]) -> list[Any]:
    """The worker processes torchrun started on this node (psutil.Process objects)."""
    import psutil

    try:
        return [
            p
            for p in psutil.Process(proc.pid).children(recursive=True)
            if "meshprof.launch.bootstrap" in " ".join(p.cmdline())
        ]
    except (psutil.Error, OSError):
        return []


def _hang_dumps(run_dir: Path) -> list[Path]:
    """The watchdog dumps in ``RUN_DIR/hang`` so far, sorted by name."""
    return dump_files(run_dir / HANG_DIR)


def _handle_hang(
    proc: subprocess.Popen[bytes], opts: RunOptions, run_dir: Path, first: list[Path]
) -> dict[str, Any]:
    """A worker dumped: ask the others to dump (SIGUSR1), wait for their dumps, maybe end the job."""
    workers = _local_workers(proc)
    signalled = []
    for w in workers:
        try:
            w.send_signal(signal.SIGUSR1)
            signalled.append(w.pid)
        except Exception:
            pass
    print(
        f"meshprof run: a rank reported a hang ({first[0].name}); asked {len(signalled)} local worker(s) to dump",
        file=sys.stderr,
    )
    deadline = time.monotonic() + HANG_DUMP_WAIT_S
    while time.monotonic() < deadline and proc.poll() is None:
        if len(_hang_dumps(run_dir)) >= max(len(workers), 1):
            break
        time.sleep(0.2)
    info: dict[str, Any] = {
        "first_dump": first[0].name,
        "dumps": [p.name for p in _hang_dumps(run_dir)],
        "signalled": signalled,
        "killed": False,
    }
    if opts.hang_action == "kill" and proc.poll() is None:
        print("meshprof run: ending the hung job (--hang-action kill)", file=sys.stderr)
        _terminate(proc)
        info["killed"] = True
    return info


def _terminate(proc: subprocess.Popen[bytes], grace_s: float = 30.0) -> None:
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    except OSError:
        pass


@dataclass(slots=True)
class LaunchResult:
    """What ``meshprof run`` did."""

    run_dir: Path
    """The run directory (absolute)."""
    exit_code: int
    """The code ``meshprof run`` exits with (the script's, see
    :func:`meshprof.launch.run_record.finish_manifest`)."""
    torchrun_exit_code: int
    hang: dict[str, Any] | None
    """Set when a hang dump appeared: dumps seen, workers signalled, whether the job was ended."""


def launch(opts: RunOptions) -> LaunchResult:
    """Run the job under torchrun and wait for it; write the manifest; keep the exit code."""
    run_dir = opts.resolved_run_dir()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MeshprofError(f"{run_dir}: cannot create the run directory ({e.strerror})") from None
    cmd = torchrun_command(opts)
    manifest = start_manifest(opts, run_dir, cmd, os.environ.get(ENV_LAYOUT, ""), ENV_LAYOUT)
    node = node_record(opts, cmd, manifest.start_ns or time.time_ns())
    write_node_record(run_dir, node_id(), node)
    write_merged_manifest(run_dir, manifest)
    if opts.node_rank == 0:  # a run directory used again: the last run's live state is not ours
        from meshprof.rundir.live import clear_live

        clear_live(run_dir)
    exporter = None
    if opts.metrics_port is not None:
        from meshprof.live.metrics import start_exporter

        exporter = start_exporter(run_dir, opts.metrics_port, opts.metrics_addr, node_id())
    proc = subprocess.Popen(cmd, env=worker_env(opts, run_dir))

    def forward(signum: int, _frame: Any) -> None:
        with contextlib.suppress(OSError):
            proc.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    hang: dict[str, Any] | None = None
    watch = opts.hang_timeout_s > 0 and _watchdog_available()
    alerts = _start_alerts(opts, run_dir)
    try:
        while True:
            try:
                rc = proc.wait(0.5)
                break
            except subprocess.TimeoutExpired:
                pass
            if watch and hang is None:
                dumps = _hang_dumps(run_dir)
                if dumps:
                    hang = _handle_hang(proc, opts, run_dir, dumps)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if alerts is not None:
            alerts.stop()
        if exporter is not None:
            exporter.stop()
    if watch and hang is None and _hang_dumps(run_dir):
        hang = {
            "first_dump": _hang_dumps(run_dir)[0].name,
            "dumps": [p.name for p in _hang_dumps(run_dir)],
            "signalled": [],
            "killed": False,
        }
    exits_file = worker_exits_path(run_dir, node_id())
    exits = read_worker_exits(exits_file)
    with contextlib.suppress(OSError):
        exits_file.unlink()
    code = finish_manifest(manifest, node, run_dir, rc, hang, exits)
    return LaunchResult(run_dir=run_dir, exit_code=code, torchrun_exit_code=rc, hang=hang)


def _start_alerts(opts: RunOptions, run_dir: Path) -> Any:
    """The alert watcher (:mod:`meshprof.live.watch`), or None: alerts off, no live state, or
    not node 0 (one launcher watches the whole job's shared live state)."""
    if not (opts.alerts.enabled and opts.live_interval_s > 0 and opts.node_rank == 0):
        return None
    from meshprof.live.watch import AlertWatcher

    capture = None
    if opts.capture.enabled:
        from meshprof.layout import Layout
        from meshprof.live.capture_trigger import CaptureTrigger

        layout = Layout.from_any(os.environ.get(ENV_LAYOUT) or None)
        capture = CaptureTrigger(run_dir, opts.capture, layout)
    return AlertWatcher(run_dir, opts.alerts, capture=capture).start()


def _watchdog_available() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("meshprof.session.watchdog") is not None
    except (ImportError, ValueError):
        return False


__all__ = [
    "ENV_LAYOUT",
    "EXIT_HANG",
    "LaunchResult",
    "RunOptions",
    "launch",
    "torchrun_command",
    "worker_env",
]

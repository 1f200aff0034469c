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
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshprof.errors import MeshprofError
from meshprof.launch.agreement import Agreement, store_endpoint
from meshprof.launch.job_versions import ENV_VERSIONS, read_versions, versions_here
from meshprof.launch.live_relay import LiveRelay, mirrors, relay_interval
from meshprof.launch.private_dir import make_private_dir
from meshprof.launch.run_dirs import check_writable, choose_run_dir, new_run_id, other_run
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
from meshprof.rundir.schema import HANG_DIR, Manifest
from meshprof.rundir.worker_exits import WorkerExit, read_worker_exits, worker_exits_path

ENV_LAYOUT = "MESHPROF_LAYOUT"
"""The job's dp × tp × pp layout when ``--layout`` is not given (``dp=2,tp=4,pp=2`` or
``2x4x2``); the workers get it in their :class:`~meshprof.records.worker_settings.WorkerSettings`."""

#: Seconds to wait for the other workers' dumps after the first one appears.
HANG_DUMP_WAIT_S = 15.0
#: Seconds between two heartbeats of the launcher's node record (``MESHPROF_HEARTBEAT_S``).
HEARTBEAT_S = 10.0


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
    opts: RunOptions,
    run_dir: Path,
    base: dict[str, str] | None = None,
    *,
    run_id: str = "",
    private: Path | None = None,
    decision_file: str = "",
) -> dict[str, str]:
    """The environment of torchrun and its workers: the caller's, plus meshprof's settings
    (``private``: this launcher's node-local folder, for torchrun's record of failed workers;
    ``decision_file``: where the workers wait for the agreed run, several nodes)."""
    env = dict(os.environ if base is None else base)
    exits = (
        (private / "workers.json") if private is not None else worker_exits_path(run_dir, node_id())
    )
    settings = WorkerSettings(
        run_dir=str(run_dir),
        node_id=node_id(),
        worker_exits=str(exits),
        flush_interval_s=float(opts.flush_interval_s),
        hang_timeout_s=float(opts.hang_timeout_s),
        step_detect=opts.step_detect,
        live_interval_s=float(opts.live_interval_s),
        capture=opts.capture_agent,
        capture_limits=opts.capture_limits,
        max_events=opts.max_events,
        layout=env.get(ENV_LAYOUT, ""),
        run_id=run_id,
        decision_file=decision_file,
        retain_s=float(opts.retain_s),
        max_disk_bytes=int(opts.max_disk_bytes),
        launcher_pid=os.getpid(),
        slo=opts.slo,
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
    node_rank: int = 0
    """This node's rank in the job (the rendezvous' when it chose): node 0 writes the report."""
    run_id: str = ""
    """The run's id (agreed by the launchers of the job)."""


def heartbeat_s() -> float:
    """Seconds between two heartbeats of a launcher's node record (``MESHPROF_HEARTBEAT_S``)."""
    try:
        return max(float(os.environ.get("MESHPROF_HEARTBEAT_S", "") or HEARTBEAT_S), 0.1)
    except ValueError:
        return HEARTBEAT_S


class _RunFiles:
    """The launcher's writes into the run directory. A failure (a full or read-only disk after
    the launch) is said once on stderr and never ends the launcher: the job's own exit code
    matters more than its record."""

    def __init__(self) -> None:
        self.failed = False

    def attempt(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except OSError as e:
            if not self.failed:
                self.failed = True
                print(
                    f"meshprof run: could not write {what} ({e.strerror or e}); the job goes on",
                    file=sys.stderr,
                )
            return None


def launch(opts: RunOptions) -> LaunchResult:
    """Run the job under torchrun and wait for it; write the manifest; keep the exit code.

    One node: the run directory is chosen (and checked: writable, holding no other run) before
    anything starts. Several nodes: torchrun starts first, the launchers agree on the run through
    its rendezvous store (:mod:`meshprof.launch.agreement`), and the workers wait for that
    decision before they write anything."""
    multi = opts.nnodes != "1"
    run_id = new_run_id()
    default_name = opts.default_name() or run_id
    if multi:
        base = opts.resolved_run_dir(default_name)
        if opts.run_dir is not None:
            other = other_run(base)
            if other is not None and other.ended:
                raise MeshprofError(
                    f"{base} holds {other.describe()}: give another -o (or remove it); runs "
                    "are never mixed in one directory"
                )
        check_writable(base if opts.run_dir is not None else base.parent)
        run_dir, note = base, ""
    else:
        run_dir, note = choose_run_dir(opts.run_dir, default_name, run_id)
    if note:
        print(f"meshprof run: {note}", file=sys.stderr)
    private = make_private_dir()  # (and the folders of launchers killed before are removed)
    decision = private / "run.json"
    cmd = torchrun_command(opts)
    env = worker_env(
        opts,
        run_dir,
        run_id=run_id if not multi else "",
        private=private,
        decision_file=str(decision) if multi else "",
    )
    versions_file = private / "versions.json"
    env[ENV_VERSIONS] = str(versions_file)  # torchrun says them: no torch import here
    files = _RunFiles()
    manifest: Manifest | None = None
    node: dict[str, Any] = {}
    started_ns = time.time_ns()

    def begin(final_dir: Path, final_id: str) -> None:
        nonlocal manifest, node, run_dir, run_id
        run_dir, run_id = final_dir, final_id
        manifest = start_manifest(opts, run_dir, cmd, os.environ.get(ENV_LAYOUT, ""), ENV_LAYOUT)
        manifest = manifest.updated(run_id=run_id, start_ns=started_ns)
        node = node_record(opts, cmd, started_ns)
        node.update(run_id=run_id, heartbeat_ns=time.time_ns(), heartbeat_s=heartbeat_s())
        files.attempt("the node record", write_node_record, run_dir, node_id(), node)
        files.attempt("the manifest", write_merged_manifest, run_dir, manifest)
        if opts.node_rank == 0:  # (an old run's live state is never ours: runs do not mix)
            from meshprof.rundir.live import clear_live

            files.attempt("the live state", clear_live, run_dir)

    if not multi:
        begin(run_dir, run_id)
    proc = subprocess.Popen(cmd, env=env)
    agreement = None
    if multi:
        proposal = {"run_id": run_id, "name": default_name}
        agreement = Agreement(store_endpoint(opts.torchrun), proposal).start()

    def forward(signum: int, _frame: Any) -> None:
        with contextlib.suppress(OSError):
            proc.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    hang: dict[str, Any] | None = None
    watch = opts.hang_timeout_s > 0 and _watchdog_available()
    alerts: Any = None
    exporter: Any = None
    otlp: Any = None
    relay: LiveRelay | None = None
    watching = False
    every = heartbeat_s()
    next_beat = time.monotonic() + every
    try:
        while True:
            if manifest is None and agreement is not None and agreement.result is not None:
                final_dir, final_id = _agreed_dir(opts, agreement.result, run_dir)
                files.attempt("the run decision", _write_decision, decision, final_dir, final_id)
                begin(final_dir, final_id)
            if manifest is not None and manifest.versions is None:
                said = read_versions(versions_file)
                if said is not None:
                    manifest = manifest.updated(versions=said)
                    files.attempt("the manifest", write_merged_manifest, run_dir, manifest)
            if manifest is not None and not watching:
                watching = True
                alerts = _start_alerts(opts, run_dir)
                exporter = _start_exporter(opts, run_dir)
                relay = _start_relay(opts, run_dir)
                otlp = _start_otlp(opts, run_dir, run_id)
            try:
                rc = proc.wait(0.5)
                break
            except subprocess.TimeoutExpired:
                pass
            if manifest is not None and time.monotonic() >= next_beat:
                next_beat = time.monotonic() + every
                node["heartbeat_ns"] = time.time_ns()
                files.attempt("the node record", write_node_record, run_dir, node_id(), node)
            if watch and hang is None and manifest is not None:
                dumps = _hang_dumps(run_dir)
                if dumps:
                    hang = _handle_hang(proc, opts, run_dir, dumps)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if agreement is not None:
            agreement.stop()
        if relay is not None:
            relay.stop()
        if alerts is not None:
            alerts.stop(_died(read_worker_exits(private / "workers.json")))
        if exporter is not None:
            exporter.stop()
        if otlp is not None:
            otlp.stop()  # (after the alerts' last word: it is sent too)
    if manifest is None:  # several nodes, and the job ended before the launchers agreed
        if agreement is not None and agreement.error:
            print(f"meshprof run: no agreement on the run ({agreement.error})", file=sys.stderr)
        begin(run_dir, run_id)
    assert manifest is not None
    if watch and hang is None and _hang_dumps(run_dir):
        hang = {
            "first_dump": _hang_dumps(run_dir)[0].name,
            "dumps": [p.name for p in _hang_dumps(run_dir)],
            "signalled": [],
            "killed": False,
        }
    if manifest.versions is None:  # torchrun ended before it said them (or could not)
        manifest = manifest.updated(versions=read_versions(versions_file) or versions_here())
    exits = read_worker_exits(private / "workers.json")
    shutil.rmtree(private, ignore_errors=True)
    try:
        code, node_rank = finish_manifest(manifest, node, run_dir, rc, hang, exits)
    except OSError as e:  # (finish_manifest already tolerates failed writes; belt and braces)
        print(f"meshprof run: could not complete the run record: {e}", file=sys.stderr)
        code, node_rank = (rc if rc >= 0 else 128 - rc), opts.node_rank
    return LaunchResult(
        run_dir=run_dir,
        exit_code=code,
        torchrun_exit_code=rc,
        hang=hang,
        node_rank=node_rank,
        run_id=run_id,
    )


def _agreed_dir(opts: RunOptions, agreed: dict[str, Any], provisional: Path) -> tuple[Path, str]:
    """The run directory and id once the launchers agreed: ``-o``, or
    ``./meshprof-runs/<agreed name>``; its ``<run id>`` subdirectory when it holds another run
    (said)."""
    run_id = str(agreed["run_id"])
    path = provisional if opts.run_dir is not None else opts.resolved_run_dir(str(agreed["name"]))
    other = other_run(path, run_id)
    if other is not None:
        print(
            f"meshprof run: {path} holds {other.describe()}: writing to {path / run_id}",
            file=sys.stderr,
        )
        path = path / run_id
    return path, run_id


def _write_decision(path: Path, run_dir: Path, run_id: str) -> None:
    """Tell this node's workers the agreed run (they wait for the file)."""
    import json

    from meshprof.rundir.atomic import atomic_write_text

    atomic_write_text(path, json.dumps({"run_dir": str(run_dir), "run_id": run_id}), fsync=False)


def _start_relay(opts: RunOptions, run_dir: Path) -> LiveRelay | None:
    """The job-wide live view through the rendezvous store (several nodes, live state on)."""
    endpoint = store_endpoint(opts.torchrun)
    if opts.nnodes == "1" or endpoint is None or opts.live_interval_s <= 0:
        return None
    mirror = mirrors(opts.node_rank, opts.nnodes)
    every = relay_interval(opts.live_interval_s)
    return LiveRelay(endpoint, run_dir, node_id(), mirror, every).start()


def _start_exporter(opts: RunOptions, run_dir: Path) -> Any:
    if opts.metrics_port is None:
        return None
    from meshprof.live.metrics import start_exporter

    return start_exporter(run_dir, opts.metrics_port, opts.metrics_addr, node_id())


def _start_otlp(opts: RunOptions, run_dir: Path, run_id: str) -> Any:
    """The OTLP exporter of this node's ranks (:mod:`meshprof.live.otel.agent`), or None:
    not configured, or it could not start (one line on stderr; the job runs without it)."""
    if opts.otlp is None:
        return None
    try:
        from meshprof.layout import Layout
        from meshprof.live.otel.agent import OtlpAgent
        from meshprof.live.otel.exporters import JobIdentity

        layout_text = os.environ.get(ENV_LAYOUT, "")
        job = JobIdentity(
            run_id=run_id,
            world_size=opts.world_size or -1,
            layout=layout_text,
            node_id=node_id(),
            node_rank=opts.node_rank,
            run_dir=str(run_dir),
        )
        return OtlpAgent(
            run_dir,
            opts.otlp,
            job,
            node_id=node_id(),
            layout=Layout.from_any(layout_text or None),
            root=opts.node_rank == 0,
        ).start()
    except Exception as e:
        print(
            f"meshprof run: warning: cannot start the OTLP exporter ({type(e).__name__}: {e}); "
            "the job runs without it",
            file=sys.stderr,
        )
        return None


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


def _died(exits: dict[int, WorkerExit]) -> dict[int, str]:
    """rank -> how it ended, for the alert watcher's last word (a rank killed without a word)."""
    return {
        r: f"killed by {e.signal}" if e.signal else f"exit code {e.exit_code}"
        for r, e in exits.items()
    }


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

"""``meshprof run``'s launcher: start torchrun with the worker bootstrap, watch it, keep its code.

The launcher runs ``python -m torch.distributed.run <torchrun options> -m meshprof._bootstrap
<script.py | -m module> <args>``: torchrun (the real launcher, multi-node included) starts the
workers, and each worker runs :mod:`meshprof._bootstrap`, which turns the recorder, the step
monitor and the rank writer on before running the user's unmodified script. Settings reach the
workers through environment variables (:data:`ENV_*`). The launcher writes the run directory's
manifest at start and again at the end (end time, exit code, hosts and world size from the rank
files), and, when a worker's watchdog writes a dump into ``DIR/hang/``, asks the other local
workers to dump too (SIGUSR1), ends the job and reports the hang.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshprof.errors import MeshprofError
from meshprof.rundir import (
    MANIFEST,
    load_run,
    merge_node_records,
    read_node_records,
    write_manifest,
    write_node_record,
)

ENV_RUN_DIR = "MESHPROF_RUN_DIR"
ENV_FLUSH_INTERVAL = "MESHPROF_FLUSH_INTERVAL"
ENV_HANG_TIMEOUT = "MESHPROF_HANG_TIMEOUT"
ENV_HANG_ACTION = "MESHPROF_HANG_ACTION"
ENV_STEP_DETECT = "MESHPROF_STEP_DETECT"
ENV_LAYOUT = "MESHPROF_LAYOUT"
ENV_MAX_EVENTS = "MESHPROF_MAX_EVENTS"
ENV_NODE_ID = "MESHPROF_NODE_ID"

HANG_DIR = "hang"
#: Exit code of ``meshprof run`` when it ended a hung job (the script never got to exit).
EXIT_HANG = 3
#: Seconds to wait for the other workers' dumps after the first one appears.
HANG_DUMP_WAIT_S = 15.0

_NNODES_RE = re.compile(r"^\d+(:\d+)?$")
_LAYOUT_RE = re.compile(r"^\s*[A-Za-z_]\w*\s*=\s*\d+\s*$")


@dataclass(kw_only=True, slots=True)
class RunOptions:
    """What ``meshprof run`` was asked to do. Validated on construction (bad values raise
    :class:`MeshprofError`)."""

    script: str | None = None
    """Path of the training script (exclusive with ``module``)."""
    module: str | None = None
    """Module to run as ``python -m module`` (exclusive with ``script``)."""
    args: list[str] = field(default_factory=list)
    """Arguments passed to the script (its ``sys.argv[1:]``)."""
    run_dir: Path | None = None
    """Run directory; None picks ./meshprof-runs/<rdzv id or timestamp>."""
    nproc_per_node: str = "1"
    """Workers per node: a count, or torchrun's "gpu", "cpu", "auto"."""
    nnodes: str = "1"
    """Number of nodes, "N" or "MIN:MAX"."""
    node_rank: int = 0
    """This node's rank (static rendezvous)."""
    torchrun: dict[str, str] = field(default_factory=dict)
    """Other torchrun options passed through, name (e.g. "rdzv-endpoint") -> value."""
    standalone: bool | None = None
    """torchrun --standalone; None: on for a single node with no rendezvous/master given."""
    flush_interval_s: float = 30.0
    """Seconds between two periodic writes of each rank file."""
    hang_timeout_s: float = 300.0
    """Seconds a collective may stay in flight before the watchdog dumps (0: no watchdog)."""
    hang_action: str = "kill"
    """What the launcher does after a hang dump: "kill" ends the job, "wait" lets it run on."""
    step_detect: str = "optimizer"
    """Automatic step detection: "optimizer" (every optimizer step ends a step) or "off"."""
    max_events: int | None = None
    """Ring-buffer capacity of each rank's recorder (None: the recorder's default)."""
    command: list[str] = field(default_factory=list)
    """The command line as typed (for the manifest)."""

    def __post_init__(self) -> None:
        if (self.script is None) == (self.module is None):
            raise MeshprofError(
                "give a training script (meshprof run [options] script.py [args]) or -m module"
            )
        if self.script is not None and not Path(self.script).is_file():
            raise MeshprofError(f"{self.script}: no such script file")
        if self.module is not None and not re.match(r"^[A-Za-z_][\w.]*$", self.module):
            raise MeshprofError(f"-m {self.module!r}: not a module name")
        npn = self.nproc_per_node
        if not (npn in ("gpu", "cpu", "auto") or (npn.isdigit() and int(npn) >= 1)):
            raise MeshprofError(
                f"--nproc-per-node {npn!r}: expected a positive integer, gpu, cpu or auto"
            )
        if not _NNODES_RE.match(self.nnodes) or int(self.nnodes.split(":")[0]) < 1:
            raise MeshprofError(
                f"--nnodes {self.nnodes!r}: expected N or MIN:MAX (positive integers)"
            )
        if self.node_rank < 0:
            raise MeshprofError(f"--node-rank {self.node_rank}: must be >= 0")
        if not self.flush_interval_s > 0:
            raise MeshprofError(f"--flush-interval {self.flush_interval_s}: must be > 0 seconds")
        if not self.hang_timeout_s >= 0:
            raise MeshprofError(
                f"--hang-timeout {self.hang_timeout_s}: must be >= 0 seconds (0 turns the watchdog off)"
            )
        if self.hang_action not in ("kill", "wait"):
            raise MeshprofError(f"--hang-action {self.hang_action!r}: expected kill or wait")
        if self.step_detect not in ("optimizer", "off"):
            raise MeshprofError(f"--step-detect {self.step_detect!r}: expected optimizer or off")
        if self.max_events is not None and self.max_events < 1:
            raise MeshprofError(f"--max-events {self.max_events}: must be >= 1")

    @property
    def world_size(self) -> int | None:
        """nnodes × nproc_per_node when both are known numbers (the maximum for MIN:MAX)."""
        if not self.nproc_per_node.isdigit():
            return None
        return int(self.nnodes.split(":")[-1]) * int(self.nproc_per_node)

    def resolved_run_dir(self) -> Path:
        if self.run_dir is not None:
            return Path(self.run_dir).absolute()
        rdzv_id = self.torchrun.get("rdzv-id")
        # With several nodes each launcher must pick the same name: the rendezvous id is shared.
        name = (
            rdzv_id
            if rdzv_id and rdzv_id != "none"
            else _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        )
        base = Path("meshprof-runs").absolute() / name
        path, n = base, 1
        while rdzv_id is None and path.exists():
            n += 1
            path = base.with_name(f"{base.name}-{n}")
        return path


def parse_layout(text: str) -> dict[str, int]:
    """``"dp=2,tp=1,pp=2"`` -> ``{"dp": 2, "tp": 1, "pp": 2}``."""
    parts = [p for p in text.split(",") if p.strip()]
    if not parts or not all(_LAYOUT_RE.match(p) for p in parts):
        raise MeshprofError(
            f"{ENV_LAYOUT}={text!r}: expected name=size pairs such as dp=2,tp=1,pp=2"
        )
    out: dict[str, int] = {}
    for p in parts:
        k, v = p.split("=")
        out[k.strip()] = int(v)
    return out


def torchrun_command(opts: RunOptions) -> list[str]:
    """The torchrun command line that runs the bootstrap in every worker."""
    cmd = [sys.executable, "-m", "torch.distributed.run"]
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
    cmd += ["-m", "meshprof._bootstrap"]
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
    env[ENV_RUN_DIR] = str(run_dir)
    env[ENV_NODE_ID] = node_id()
    env[ENV_FLUSH_INTERVAL] = repr(float(opts.flush_interval_s))
    env[ENV_HANG_TIMEOUT] = repr(float(opts.hang_timeout_s))
    env[ENV_HANG_ACTION] = opts.hang_action
    env[ENV_STEP_DETECT] = opts.step_detect
    if opts.max_events is not None:
        env[ENV_MAX_EVENTS] = str(opts.max_events)
    # Workers import meshprof from wherever this launcher did (a checkout without install works).
    src = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def node_id() -> str:
    """This launcher's id in the run directory (host and pid: unique across the nodes of a job
    and across launchers restarted on one host). Its workers write it into their rank files."""
    return f"{socket.gethostname()}-{os.getpid()}"


def node_record(opts: RunOptions, cmd: list[str], start_ns: int) -> dict[str, Any]:
    """This node's record as known before the workers start (finish_manifest completes it)."""
    return {
        "node_id": node_id(),
        "node_rank": opts.node_rank,
        "host": socket.gethostname(),
        "hosts": [socket.gethostname()],
        "pid": os.getpid(),
        "nproc_per_node": opts.nproc_per_node,
        "torchrun_command": cmd,
        "cwd": os.getcwd(),
        "ranks": [],
        "rank_exit_codes": {},
        "start_ns": start_ns,
        "end_ns": None,
        "torchrun_exit_code": None,
        "exit_code": None,
        "status": "running",
    }


def _versions() -> dict[str, Any]:
    try:
        from meshprof.commands.version import versions

        return versions()
    except Exception as e:  # a manifest without versions beats no run at all
        return {"error": f"{type(e).__name__}: {e}"}


def start_manifest(opts: RunOptions, run_dir: Path, cmd: list[str]) -> dict[str, Any]:
    """The manifest as known before the workers start."""
    layout_text = os.environ.get(ENV_LAYOUT, "")
    manifest: dict[str, Any] = {
        "command": list(opts.command),
        "torchrun_command": cmd,
        "target": {
            "kind": "module" if opts.module else "script",
            "name": opts.module or opts.script,
            "args": list(opts.args),
        },
        "world_size": opts.world_size,
        "nnodes": opts.nnodes,
        "nproc_per_node": opts.nproc_per_node,
        "node_rank": opts.node_rank,
        "hosts": [socket.gethostname()],
        "launcher_host": socket.gethostname(),
        "cwd": os.getcwd(),
        "versions": _versions(),
        "layout": parse_layout(layout_text) if layout_text else None,
        "settings": {
            "flush_interval_s": opts.flush_interval_s,
            "hang_timeout_s": opts.hang_timeout_s,
            "hang_action": opts.hang_action,
            "step_detect": opts.step_detect,
            "max_events": opts.max_events,
        },
        "start_ns": time.time_ns(),
        "start_time": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "end_ns": None,
        "end_time": None,
        "exit_code": None,
        "status": "running",
    }
    old = _read_manifest(run_dir)
    if old.get("hosts"):  # another node's launcher wrote it first (shared file system)
        manifest["hosts"] = sorted(set(old["hosts"]) | set(manifest["hosts"]))
    return manifest


def _read_manifest(run_dir: Path) -> dict[str, Any]:
    import json

    try:
        return dict(json.loads((run_dir / MANIFEST).read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return {}


def write_merged_manifest(run_dir: Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest`` merged with every node record in ``run_dir``.

    Launchers that finish together race: one can write a manifest merged from records read
    before another node's final record landed, after that node wrote its own. So the records
    are read again after the write, and the manifest rewritten while they changed: the last
    writer's view is then complete (load_run merges again in any case)."""
    records = read_node_records(run_dir)
    for _ in range(10):
        write_manifest(run_dir, merge_node_records(manifest, records))
        again = read_node_records(run_dir)
        if again == records:
            return
        records = again


def finish_manifest(
    manifest: dict[str, Any],
    node: dict[str, Any],
    run_dir: Path,
    torchrun_rc: int,
    hang: dict[str, Any] | None,
) -> int:
    """Write this node's record and the merged manifest; return the exit code ``meshprof run``
    keeps.

    The code is the script's on this node: when torchrun failed, the lowest local rank that
    recorded a non-zero exit code of its own (not a signal torchrun sent) gives it, else the
    lowest local rank with any non-zero code; when no rank recorded one (killed hard), torchrun's
    own code. Local ranks are those whose rank file names this launcher's :func:`node_id`.
    """
    code = torchrun_rc
    own_failures: list[int] = []  # codes of ranks that ended by themselves, not by a signal
    me = node_id()
    rec = dict(node)
    manifest = dict(manifest)
    hosts = {socket.gethostname()}
    try:
        run = load_run(run_dir)
    except MeshprofError:
        run = None
    if run is not None:
        manifest["world_size"] = run.world_size
        layout = next(
            (rd.meta["layout"] for rd in run.ranks.values() if rd.meta.get("layout")), None
        )
        if layout and not manifest.get("layout"):
            manifest["layout"] = layout
        tagged = any(rd.meta.get("node_id") for rd in run.ranks.values())
        local = {
            r: rd
            for r, rd in sorted(run.ranks.items())
            if rd.meta.get("node_id") == me or not tagged
        }
        hosts |= {str(rd.meta["hostname"]) for rd in local.values() if rd.meta.get("hostname")}
        node_ranks = {rd.meta.get("node_rank") for rd in local.values()}
        if len(node_ranks) == 1 and isinstance(next(iter(node_ranks)), int):
            rec["node_rank"] = next(iter(node_ranks))  # the rendezvous' choice (GROUP_RANK)
        rank_codes: dict[int, int] = {}
        for r, rd in local.items():
            ex = rd.meta.get("exit") or {}
            if isinstance(ex.get("code"), int):
                rank_codes[r] = ex["code"]
                if ex["code"] != 0 and ex.get("how") != "signal":
                    own_failures.append(ex["code"])
        rec["ranks"] = sorted(local)
        rec["rank_exit_codes"] = {str(r): c for r, c in rank_codes.items()}
        if torchrun_rc != 0:
            # torchrun ends the other workers with SIGTERM after the first failure: the root
            # cause is a rank that failed by itself.
            failed = own_failures or [c for c in rank_codes.values() if c != 0]
            if failed:
                code = failed[0]
        manifest["missing_ranks"] = {str(r): why for r, why in sorted(run.problems.items())}
    if hang is not None:
        rec["hang"] = hang
        if hang.get("killed"):  # the ranks died of our SIGTERM: the hang is the cause
            code = own_failures[0] if own_failures else EXIT_HANG
    rec["hosts"] = sorted(hosts)
    rec["end_ns"] = time.time_ns()
    rec["torchrun_exit_code"] = torchrun_rc
    rec["exit_code"] = code
    rec["status"] = "hang" if hang and hang.get("killed") else ("ok" if code == 0 else "failed")
    write_node_record(run_dir, me, rec)
    manifest["end_time"] = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    write_merged_manifest(run_dir, manifest)
    return code


def _local_workers(proc: subprocess.Popen[bytes]) -> list[Any]:
    """The worker processes torchrun started on this node (psutil.Process objects)."""
    import psutil

    try:
        return [
            p
            for p in psutil.Process(proc.pid).children(recursive=True)
            if "meshprof._bootstrap" in " ".join(p.cmdline())
        ]
    except (psutil.Error, OSError):
        return []


def _hang_dumps(run_dir: Path) -> list[Path]:
    d = run_dir / HANG_DIR
    try:
        return sorted(
            p for p in d.iterdir() if p.name.startswith("rank") and p.name.endswith(".json")
        )
    except OSError:
        return []


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
    """The code ``meshprof run`` exits with (the script's, see :func:`finish_manifest`)."""
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
    manifest = start_manifest(opts, run_dir, cmd)
    node = node_record(opts, cmd, manifest["start_ns"])
    write_node_record(run_dir, node_id(), node)
    write_merged_manifest(run_dir, manifest)
    proc = subprocess.Popen(cmd, env=worker_env(opts, run_dir))

    def forward(signum: int, _frame: Any) -> None:
        with contextlib.suppress(OSError):
            proc.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    hang: dict[str, Any] | None = None
    watch = opts.hang_timeout_s > 0 and _watchdog_available()
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
    if watch and hang is None and _hang_dumps(run_dir):
        hang = {
            "first_dump": _hang_dumps(run_dir)[0].name,
            "dumps": [p.name for p in _hang_dumps(run_dir)],
            "signalled": [],
            "killed": False,
        }
    code = finish_manifest(manifest, node, run_dir, rc, hang)
    return LaunchResult(run_dir=run_dir, exit_code=code, torchrun_exit_code=rc, hang=hang)


def _watchdog_available() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("meshprof.tools.watchdog") is not None
    except (ImportError, ValueError):
        return False


__all__ = [
    "ENV_FLUSH_INTERVAL",
    "ENV_HANG_ACTION",
    "ENV_HANG_TIMEOUT",
    "ENV_LAYOUT",
    "ENV_MAX_EVENTS",
    "ENV_NODE_ID",
    "ENV_RUN_DIR",
    "ENV_STEP_DETECT",
    "EXIT_HANG",
    "LaunchResult",
    "RunOptions",
    "launch",
    "parse_layout",
    "torchrun_command",
    "worker_env",
]

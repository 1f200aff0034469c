"""The launcher's record of a ``meshprof run`` job in its run directory.

At start, the launcher writes its node record (``DIR/nodes/NODE.json``) and the manifest
(:func:`start_manifest`); at the end it completes both from the rank files: which ranks ran on
this node, how each ended, and the exit code ``meshprof run`` keeps (:func:`finish_manifest`).
The torchrun wrapper itself is :mod:`meshprof.launch.launcher`. Times are ns since the epoch.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import socket
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshprof.errors import MeshprofError
from meshprof.layout import parse_layout
from meshprof.rundir.crashsafe import finalize_crashsafe
from meshprof.rundir.loader import load_run
from meshprof.rundir.manifest import (
    merge_node_records,
    read_manifest,
    read_node_records,
    write_manifest,
    write_node_record,
)
from meshprof.rundir.rankfile import RankData
from meshprof.rundir.schema import ExitStatus, Manifest
from meshprof.rundir.segment_reader import finalize_rank_dirs
from meshprof.rundir.worker_exits import WorkerExit

if TYPE_CHECKING:
    from meshprof.launch.run_options import RunOptions

#: Exit code of ``meshprof run`` when it ended a hung job (the script never got to exit).
EXIT_HANG = 3


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


def start_manifest(
    opts: RunOptions,
    run_dir: Path,
    cmd: list[str],
    layout_text: str = "",
    layout_env: str = "",
    versions: dict[str, Any] | None = None,
) -> Manifest:
    """The manifest as known before the workers start. ``layout_text`` is the job's layout
    ("dp=2,tp=1,pp=2", from ``layout_env``; "" for none); ``versions`` come later when not
    known yet (:mod:`meshprof.launch.job_versions`)."""
    layout = parse_layout(layout_text, f"{layout_env}={layout_text!r}") if layout_text else None
    manifest = Manifest.from_dict(
        {
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
            "versions": versions,
            "layout": layout,
            "settings": {
                "flush_interval_s": opts.flush_interval_s,
                "hang_timeout_s": opts.hang_timeout_s,
                "hang_action": opts.hang_action,
                "step_detect": opts.step_detect,
                "max_events": opts.max_events,
                "retain_s": opts.retain_s,
                "max_disk_bytes": opts.max_disk_bytes,
            },
            "start_ns": time.time_ns(),
            "start_time": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "end_ns": None,
            "end_time": None,
            "exit_code": None,
            "status": "running",
        }
    )
    old = read_manifest(run_dir, strict=False)
    if old.hosts:  # another node's launcher wrote it first (shared file system)
        manifest = manifest.updated(hosts=sorted(set(old.hosts) | set(manifest.hosts or [])))
    return manifest


def write_merged_manifest(run_dir: Path, manifest: Manifest) -> None:
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
    manifest: Manifest,
    node: dict[str, Any],
    run_dir: Path,
    torchrun_rc: int,
    hang: dict[str, Any] | None,
    worker_exits: dict[int, WorkerExit] | None = None,
) -> tuple[int, int]:
    """Write this node's record and the merged manifest; return the exit code ``meshprof run``
    keeps and this node's rank (the rendezvous' choice when the ranks say it).

    First the ranks that died without their final write get their last tick recorded as
    ``recovered``, with the exit torchrun saw (``worker_exits``,
    :mod:`meshprof.rundir.worker_exits`; :func:`~meshprof.rundir.segment_reader.finalize_rank_dirs`,
    and :func:`~meshprof.rundir.crashsafe.finalize_crashsafe` for older versions' files). Each local rank's exit
    code goes into ``rank_exit_codes`` (negative: died of that signal, as torchrun reports it;
    a rank that wrote "signal" itself, e.g. torchrun's SIGTERM, gets -signum too) and the
    signal's name into ``rank_signals``.

    The code is the script's on this node: when torchrun failed, that of the local rank whose
    failure came first (a signal death torchrun saw, or an exit / exception the rank recorded;
    not torchrun's SIGTERM of the others), by time: the exit's time, or for a killed rank the
    last crash-safe tick before its death. A signal death gives 128 + signum (137 for SIGKILL),
    as a shell would. With no such rank, the lowest rank with any non-zero code; when none
    recorded one, torchrun's own code. Local ranks are those whose rank file names this
    launcher's :func:`node_id`. The time of the failure that decided the code goes into the
    record as ``cause_ns`` (several nodes: the job's code is that of the node that failed
    first). A write that fails (a full disk) is said once and skipped.
    """
    exits = dict(worker_exits or {})
    code = torchrun_rc
    me = node_id()
    statuses = {r: _exit_status(w) for r, w in exits.items()}
    pids = {r: w.pid for r, w in exits.items() if w.pid > 0}
    with contextlib.suppress(OSError):
        finalize_rank_dirs(run_dir, statuses, me, pids=pids)
        finalize_crashsafe(run_dir, statuses, me, pids=pids)
    rec = dict(node)
    changes: dict[str, Any] = {}
    hosts = {socket.gethostname()}
    causes: list[tuple[int, int, int]] = []  # (time ns, rank, code) of failures not torchrun's
    try:
        run = load_run(run_dir, meta_only=True)  # (the metas: no rank's rows are read)
    except MeshprofError:
        run = None
    rank_codes: dict[int, int] = {}
    signals: dict[int, str] = {}
    if run is not None:
        changes["world_size"] = run.world_size
        layout = next((rd.meta.layout for rd in run.ranks.values() if rd.meta.layout), None)
        if layout and not manifest.layout:
            changes["layout"] = layout
        tagged = any(rd.meta.node_id for rd in run.ranks.values())
        local = {
            r: rd for r, rd in sorted(run.ranks.items()) if rd.meta.node_id == me or not tagged
        }
        hosts |= {str(rd.meta.hostname) for rd in local.values() if rd.meta.hostname}
        node_ranks = {rd.meta.node_rank for rd in local.values()}
        if len(node_ranks) == 1 and isinstance(next(iter(node_ranks)), int):
            rec["node_rank"] = next(iter(node_ranks))  # the rendezvous' choice (GROUP_RANK)
        for r, rd in local.items():
            ex = rd.meta.exit
            if ex is None or not isinstance(ex.code, int):
                continue
            rank_codes[r] = signed_exit_code(ex.how, ex.code)
            if ex.how == "signal" and ex.error:
                signals[r] = ex.error
            if ex.code != 0 and ex.how != "signal":
                causes.append((ex.t_ns, r, ex.code))
        for r, w in exits.items():
            rank_codes[r] = w.exit_code
            name = w.signal
            got = run.ranks.get(r)
            if name:
                signals[r] = name
                # a signal other than the SIGTERM torchrun sends the others after the first
                # failure: a cause, at its last sign of life (a SIGTERMed rank's last sign of life
                # may well precede the root cause's, so it must not compete with it)
                if name != "SIGTERM":
                    seen = _last_seen_ns(got) if got is not None else 0
                    causes.append((seen or w.time_ns, r, 128 - w.exit_code))
            elif w.exit_code != 0 and all(c[1] != r for c in causes):
                causes.append((w.time_ns, r, w.exit_code))
        rec["ranks"] = sorted(set(local) | set(exits))
        if torchrun_rc != 0:
            # torchrun ends the other workers with SIGTERM after the first failure: the root
            # cause is the rank that failed first by itself.
            if causes:
                code = min(causes)[2]
                if min(causes)[0] > 0:
                    rec["cause_ns"] = min(causes)[0]
            else:
                failed = [c for _, c in sorted(rank_codes.items()) if c != 0]
                if failed:
                    code = failed[0] if failed[0] > 0 else 128 - failed[0]
        changes["missing_ranks"] = {
            str(e.first) if e.last == e.first else f"{e.first}-{e.last}": e.reason
            for e in run.problems.entries()
        }
    else:
        rank_codes = {r: w.exit_code for r, w in exits.items()}
        signals = {r: n for r, w in exits.items() if (n := w.signal)}
    rec["rank_exit_codes"] = {str(r): c for r, c in sorted(rank_codes.items())}
    rec["rank_signals"] = {str(r): n for r, n in sorted(signals.items())}
    if exits:
        rec["worker_failures"] = [asdict(w) for _, w in sorted(exits.items())]
    own_failures = [c for _, _, c in sorted(causes)]
    if hang is not None:
        rec["hang"] = hang
        if hang.get("killed"):  # the ranks died of our SIGTERM: the hang is the cause
            code = own_failures[0] if own_failures else EXIT_HANG
    rec["hosts"] = sorted(hosts)
    rec["end_ns"] = time.time_ns()
    rec["torchrun_exit_code"] = torchrun_rc
    rec["exit_code"] = code
    rec["status"] = "hang" if hang and hang.get("killed") else ("ok" if code == 0 else "failed")
    rec["heartbeat_ns"] = rec["end_ns"]
    changes["end_time"] = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    try:
        write_node_record(run_dir, me, rec)
        write_merged_manifest(run_dir, manifest.updated(**changes))
    except OSError as e:
        print(
            f"meshprof run: could not write the run record in {run_dir} ({e.strerror or e})",
            file=sys.stderr,
        )
    node_rank = rec.get("node_rank")
    return code, int(node_rank) if isinstance(node_rank, int) else 0


def signed_exit_code(how: str, code: int) -> int:
    """A rank's own exit record as torchrun would report it: a death by signal N (recorded as
    128 + N) is -N; any other code is itself."""
    if how == "signal" and code > 128:
        return 128 - code
    return code


def _exit_status(w: WorkerExit) -> ExitStatus:
    """The exit torchrun saw, as a rank file's exit record (for a rank recovered from its
    crash-safe files: it could not record its own)."""
    name = w.signal
    if name:
        return ExitStatus("signal", 128 - w.exit_code, name, w.time_ns)
    return ExitStatus("exit", w.exit_code, w.message, w.time_ns)


def _last_seen_ns(rd: RankData) -> int:
    """When a rank was last seen alive (wall clock ns): its last crash-safe tick when it was
    recovered from them, else its rank file's last write."""
    rec = rd.meta.recovered
    return int((rec.tick_ns if rec is not None else None) or rd.meta.exported_ns or 0)


__all__ = [
    "EXIT_HANG",
    "finish_manifest",
    "node_id",
    "node_record",
    "signed_exit_code",
    "start_manifest",
    "write_merged_manifest",
]

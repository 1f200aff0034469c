"""The launcher's record of a ``meshprof run`` job in its run directory.

At start, the launcher writes its node record (``DIR/nodes/NODE.json``) and the manifest
(:func:`start_manifest`); at the end it completes both from the rank files: which ranks ran on
this node, how each ended, and the exit code ``meshprof run`` keeps (:func:`finish_manifest`).
The torchrun wrapper itself is :mod:`meshprof.launch`. Times are ns since the epoch.
"""

from __future__ import annotations

import datetime as _dt
import os
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshprof.errors import MeshprofError
from meshprof.layout import parse_layout
from meshprof.rundir.loader import load_run
from meshprof.rundir.manifest import (
    merge_node_records,
    read_manifest,
    read_node_records,
    write_manifest,
    write_node_record,
)
from meshprof.rundir.schema import Manifest

if TYPE_CHECKING:
    from meshprof.launch import RunOptions

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


def _versions() -> dict[str, Any]:
    try:
        from meshprof.commands.version import versions

        return versions()
    except Exception as e:  # a manifest without versions beats no run at all
        return {"error": f"{type(e).__name__}: {e}"}


def start_manifest(
    opts: RunOptions, run_dir: Path, cmd: list[str], layout_text: str = "", layout_env: str = ""
) -> Manifest:
    """The manifest as known before the workers start. ``layout_text`` is the job's layout
    ("dp=2,tp=1,pp=2", from ``layout_env``; "" for none)."""
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
            "versions": _versions(),
            "layout": layout,
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
    changes: dict[str, Any] = {}
    hosts = {socket.gethostname()}
    try:
        run = load_run(run_dir)
    except MeshprofError:
        run = None
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
        rank_codes: dict[int, int] = {}
        for r, rd in local.items():
            ex = rd.meta.exit
            if ex is not None and isinstance(ex.code, int):
                rank_codes[r] = ex.code
                if ex.code != 0 and ex.how != "signal":
                    own_failures.append(ex.code)
        rec["ranks"] = sorted(local)
        rec["rank_exit_codes"] = {str(r): c for r, c in rank_codes.items()}
        if torchrun_rc != 0:
            # torchrun ends the other workers with SIGTERM after the first failure: the root
            # cause is a rank that failed by itself.
            failed = own_failures or [c for c in rank_codes.values() if c != 0]
            if failed:
                code = failed[0]
        changes["missing_ranks"] = {str(r): why for r, why in sorted(run.problems.items())}
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
    changes["end_time"] = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    write_merged_manifest(run_dir, manifest.updated(**changes))
    return code


__all__ = [
    "EXIT_HANG",
    "finish_manifest",
    "node_id",
    "node_record",
    "start_manifest",
    "write_merged_manifest",
]

"""How torchrun saw this node's workers end: ``DIR/nodes/NODE.workers`` (JSON).

``meshprof run`` starts torchrun as ``python -m meshprof.launch.torchrun`` (torchrun itself, in that
process). When workers fail, torchrun raises ``ChildFailedError`` with one ``ProcessFailure``
per failed worker: global rank, local rank, pid and exit code, negative for a signal (-9: killed
by SIGKILL). :func:`write_worker_exits` keeps them here for the launcher, which puts them into its
node record (:func:`meshprof.launch.run_record.finish_manifest`): that is how a rank that died without a
word (SIGKILL, the OOM killer, a segfault) gets its exit code. Workers that torchrun ended itself
(SIGTERM after the first failure) are not in it: they write their own exit into their rank file.
"""

from __future__ import annotations

import json
import signal
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from meshprof.rundir.atomic import atomic_write_text
from meshprof.rundir.schema import node_record_path


@dataclass(frozen=True, slots=True)
class WorkerExit:
    """One failed worker as torchrun reported it."""

    rank: int
    """Global rank."""
    local_rank: int
    pid: int
    exit_code: int
    """The process exit code; negative: killed by that signal (-9 = SIGKILL)."""
    time_ns: int
    """When torchrun noticed it (wall clock; torchrun keeps whole seconds)."""
    message: str = ""
    """torchrun's text, e.g. "Signal 9 (SIGKILL) received by PID 1234"."""

    @property
    def signal(self) -> str | None:
        """The signal's name for a signal death (e.g. "SIGKILL"), else None."""
        return signal_name(self.exit_code)


def signal_name(exit_code: int | None) -> str | None:
    """ "SIGKILL" for exit code -9 (torchrun's convention for a signal death); None for a
    non-negative code or an unknown signal number."""
    if exit_code is None or exit_code >= 0:
        return None
    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return None


def worker_exits_path(run_dir: str | Path, node_id: str) -> Path:
    """``DIR/nodes/<node>.workers`` (not ``.json``: it is not a node record)."""
    return node_record_path(run_dir, node_id).with_suffix(".workers")


def write_worker_exits(path: str | Path, exits: list[WorkerExit]) -> None:
    atomic_write_text(path, json.dumps({"failures": [asdict(e) for e in exits]}, indent=2))


def read_worker_exits(path: str | Path) -> dict[int, WorkerExit]:
    """Global rank -> how it failed; empty when the file is missing or damaged."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        items: list[Any] = raw.get("failures") or []
        return {
            int(d["rank"]): WorkerExit(
                rank=int(d["rank"]),
                local_rank=int(d.get("local_rank", -1)),
                pid=int(d.get("pid", -1)),
                exit_code=int(d["exit_code"]),
                time_ns=int(d.get("time_ns", 0)),
                message=str(d.get("message", "")),
            )
            for d in items
            if isinstance(d, dict)
        }
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}


__all__ = [
    "WorkerExit",
    "read_worker_exits",
    "signal_name",
    "worker_exits_path",
    "write_worker_exits",
]

"""The launcher's private folder (``meshprof-launch-*`` in the temporary folder), and the
removal of those that launchers killed by SIGKILL left behind.

A ``meshprof run`` launcher keeps node-local files in a folder of its own while the job runs
(torchrun's record of failed workers, the versions torchrun reports, the multi-node decision)
and removes it when the job ends. A launcher killed by SIGKILL (the OOM killer, a scheduler's
``kill -9``) cannot: its folder stays. So every new launcher first removes the folders whose
launcher is certainly gone, as an ``owner.json`` written at creation tells: the same machine
boot and PID namespace as this process (else a live launcher elsewhere, sharing the folder
through a mount, could not be told from a dead one), and its process gone or its PID now
another process' (a different start time). A folder without that record (another tool's,
an older meshprof's), of another user, or not a directory is never touched; nothing here
raises.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from meshprof.launch.process_identity import start_time, still_running

PREFIX = "meshprof-launch-"
"""The folders' name prefix (``tempfile.mkdtemp`` adds a random suffix)."""
OWNER = "owner.json"
"""The record of the launcher that made the folder."""


def _boot_id() -> str:
    """This boot of the machine (Linux; "" elsewhere)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _pid_namespace() -> str:
    """This process' PID namespace (Linux, ``pid:[4026531836]``; "" elsewhere)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def owner_record() -> dict[str, Any]:
    """This process as a folder's owner: pid, start time, boot and PID namespace."""
    return {
        "pid": os.getpid(),
        "start_time": start_time(os.getpid()),
        "boot_id": _boot_id(),
        "pid_ns": _pid_namespace(),
    }


def owner_gone(owner: dict[str, Any]) -> bool:
    """Whether the launcher of ``owner`` (an :func:`owner_record`) has certainly ended: same
    boot and PID namespace as this process (known on both sides), and no process with its PID
    or one that started at another time."""
    boot, ns = _boot_id(), _pid_namespace()
    if not boot or not ns or owner.get("boot_id") != boot or owner.get("pid_ns") != ns:
        return False
    pid, started = owner.get("pid"), owner.get("start_time")
    if not isinstance(pid, int) or pid <= 0 or not isinstance(started, (int, float)):
        return False
    return not still_running(pid, float(started))


def sweep_stale(base: str | os.PathLike[str] | None = None) -> list[Path]:
    """Remove the ``meshprof-launch-*`` folders in ``base`` (the temporary folder) that belong
    to this user and whose launcher has certainly ended (:func:`owner_gone`). Returns the
    folders removed; never raises."""
    removed: list[Path] = []
    with contextlib.suppress(Exception):
        folder = Path(base if base is not None else tempfile.gettempdir())
        uid = os.getuid() if hasattr(os, "getuid") else None
        for entry in os.scandir(folder):
            with contextlib.suppress(Exception):
                if not entry.name.startswith(PREFIX) or not entry.is_dir(follow_symlinks=False):
                    continue
                if uid is not None and entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                owner = json.loads((Path(entry.path) / OWNER).read_text())
                if isinstance(owner, dict) and owner_gone(owner):
                    shutil.rmtree(entry.path)
                    removed.append(Path(entry.path))
    return removed


def make_private_dir() -> Path:
    """A new private folder for this launcher, with its :data:`OWNER` record, after removing
    the stale ones (:func:`sweep_stale`). Raises ``OSError`` when no folder can be made; a
    failure to write the record only means a later launcher will not remove the folder."""
    sweep_stale()
    private = Path(tempfile.mkdtemp(prefix=PREFIX))
    with contextlib.suppress(OSError):
        (private / OWNER).write_text(json.dumps(owner_record()))
    return private


__all__ = ["OWNER", "PREFIX", "make_private_dir", "owner_gone", "owner_record", "sweep_stale"]

"""Which directory a ``meshprof run`` job writes, and that runs never mix there.

Every job gets a run id (:func:`new_run_id`; with several nodes the one the launchers agreed on,
:mod:`meshprof.launch.agreement`). A directory already holding another run (its manifest names
another run id, or it has rank data and no run id) is never written into: with ``-o`` the
launcher refuses before it starts anything (one line, exit code 2); without ``-o`` it writes into
a fresh subdirectory named by the run id, and says so. Before the launch, the directory must
also be writable: a read-only or full file system is one line and exit code 2, not a traceback
once training runs.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from meshprof.errors import MeshprofError
from meshprof.rundir.manifest import node_status, read_manifest, read_node_records
from meshprof.rundir.schema import MANIFEST, rank_entries

PROBE_BYTES = 64 << 10
"""Bytes written (and removed) to check that a run directory takes data."""


def new_run_id() -> str:
    """A fresh run id: the local time and a random suffix (``20250102-030405-a1b2c3``)."""
    return f"{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def check_writable(path: Path) -> None:
    """Create ``path`` (and its parents) and write a probe file into it; an unwritable place
    (read-only, full, not a directory, no permission) raises :class:`MeshprofError`."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".meshprof-probe-{os.getpid()}"
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"\0" * PROBE_BYTES)
            os.fsync(fd)
        finally:
            os.close(fd)
            with contextlib.suppress(OSError):
                probe.unlink()
    except OSError as e:
        raise MeshprofError(
            f"{path}: cannot write the run directory ({e.strerror or e}); give a writable -o"
        ) from None


@dataclass(frozen=True, slots=True)
class OtherRun:
    """A run found in a directory that is not this one."""

    run_id: str
    """Its run id ("" for a run of an older version, or one not written by ``meshprof run``)."""
    status: str
    """ok, failed, hang, stale, running, or "" when unknown (rank data without a manifest)."""

    @property
    def ended(self) -> bool:
        """Finished, or its launcher is gone: certainly not another node of this job."""
        return self.status in ("ok", "failed", "hang", "stale", "")

    def describe(self) -> str:
        who = f"run {self.run_id}" if self.run_id else "another run"
        if self.status == "running":
            return f"{who}, still running"
        return f"{who}, {self.status}" if self.status else who


def other_run(path: Path, run_id: str | None = None) -> OtherRun | None:
    """The run ``path`` holds when it is not ``run_id`` (None: empty, absent, or this run)."""
    if not path.is_dir():
        return None
    has_manifest = (path / MANIFEST).exists()
    has_ranks = bool(rank_entries(path))
    if not has_manifest and not has_ranks:
        return None
    m = read_manifest(path, strict=False)
    if run_id and m.run_id == run_id:
        return None
    records = read_node_records(path)
    statuses = [node_status(r) for r in records]
    order = ("hang", "failed", "stale", "running", "ok")
    status = min(statuses, key=order.index) if statuses and set(statuses) <= set(order) else ""
    if not records and has_manifest:
        status = str(m.status or "")
    return OtherRun(str(m.run_id or ""), status)


def choose_run_dir(given: Path | None, default_name: str, run_id: str) -> tuple[Path, str]:
    """The run directory of a single-node job and a note to print ("" for none): ``-o``
    (refused when it holds another run) or ``./meshprof-runs/<default_name>`` (a subdirectory
    named by the run id when that holds another run). Checked writable."""
    if given is not None:
        path = Path(given).absolute()
        other = other_run(path, run_id)
        if other is not None:
            raise MeshprofError(
                f"{path} holds {other.describe()}: give another -o (or remove it); runs are "
                "never mixed in one directory"
            )
        check_writable(path)
        return path, ""
    path = Path("meshprof-runs").absolute() / default_name
    note = ""
    other = other_run(path, run_id)
    if other is not None:
        path, note = path / run_id, f"{path} holds {other.describe()}: writing to {path / run_id}"
    check_writable(path)
    return path, note


__all__ = ["OtherRun", "check_writable", "choose_run_dir", "new_run_id", "other_run"]

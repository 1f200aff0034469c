"""The launcher's private folder: a launcher killed by SIGKILL leaves its ``meshprof-launch-*``
folder behind; the next launcher removes those whose launcher has certainly ended, and nothing
else (a live launcher's, another tool's, another boot's or PID namespace's, a file).

The ended launchers here are real processes that ran and exited (their PID and start time as
psutil saw them while they ran); the end-to-end case, a real launcher killed by SIGKILL, is in
``test_storage_run::test_a_killed_launcher_ends_its_workers_and_reads_as_stale``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

from meshprof.launch.private_dir import OWNER, PREFIX, make_private_dir, owner_record, sweep_stale


def _ended_process() -> dict[str, Any]:
    """The owner record of a process that ran and has ended."""
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                         stdin=subprocess.PIPE)  # fmt: skip
    started = psutil.Process(p.pid).create_time()
    p.communicate(b"")
    return {**owner_record(), "pid": p.pid, "start_time": started}


def _folder(base: Path, name: str, owner: dict[str, Any] | None) -> Path:
    d = base / f"{PREFIX}{name}"
    d.mkdir()
    (d / "workers.json").write_text("[]")
    if owner is not None:
        (d / OWNER).write_text(json.dumps(owner))
    return d


def test_only_the_folders_of_ended_launchers_are_removed(tmp_path: Path) -> None:
    me = owner_record()
    assert me["pid"] == os.getpid() and me["start_time"] and me["boot_id"] and me["pid_ns"]
    ended = _ended_process()
    dead = _folder(tmp_path, "dead", ended)
    reused = _folder(tmp_path, "reused", {**me, "start_time": me["start_time"] - 100.0})
    kept = [
        _folder(tmp_path, "alive", me),
        _folder(tmp_path, "no-record", None),
        _folder(tmp_path, "other-boot", {**ended, "boot_id": "another-boot"}),
        _folder(tmp_path, "other-namespace", {**ended, "pid_ns": "pid:[1]"}),
        _folder(tmp_path, "no-start-time", {**ended, "start_time": None}),
    ]
    (kept[1] / OWNER).write_text("{not json")
    (tmp_path / f"{PREFIX}a-file").write_text("")
    other_tool = tmp_path / "other-tool-dir"
    other_tool.mkdir()
    (other_tool / OWNER).write_text(json.dumps(ended))

    assert sorted(sweep_stale(tmp_path)) == sorted([dead, reused])
    assert not dead.exists() and not reused.exists()
    assert all(d.is_dir() for d in kept) and other_tool.is_dir()
    assert (tmp_path / f"{PREFIX}a-file").is_file()
    assert sweep_stale(tmp_path / "missing") == []  # never raises


def test_a_new_private_folder_records_its_owner(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    stale = _folder(tmp_path, "stale", _ended_process())
    d = make_private_dir()
    assert d.parent == tmp_path and d.name.startswith(PREFIX)
    assert json.loads((d / OWNER).read_text())["pid"] == os.getpid()
    assert not stale.exists()  # made after removing the stale ones

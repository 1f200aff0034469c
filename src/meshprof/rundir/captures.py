"""Captures in the run directory: ``RUN_DIR/captures/<id>/`` holds the request
(``request.json``), each rank's status (``rank{R:05d}.json``, a
:class:`~meshprof.records.captures.CaptureRankStatus`) and each rank's Kineto trace
(``rank{R:05d}.pt.trace.json.gz``). Requests reach the ranks through
:mod:`meshprof.rundir.requests`."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from meshprof.records.captures import CaptureRankStatus, CaptureRequest
from meshprof.records.codec import RecordError
from meshprof.rundir.confine import confined_write
from meshprof.rundir.json_file import read_json

CAPTURES_DIR = "captures"
REQUEST_FILE = "request.json"
_STATUS_RE = re.compile(r"^rank(\d+)\.json$")
TRACE_SUFFIX = ".pt.trace.json.gz"
MAX_STATUS_BYTES = 16 << 20
"""A status (or request copy) larger than this (bytes) is not read: a status with every
thread's stack is tens of kB."""


def captures_root(run_dir: str | os.PathLike[str]) -> Path:
    """``RUN_DIR/captures``."""
    return Path(run_dir) / CAPTURES_DIR


def capture_dir(run_dir: str | os.PathLike[str], capture_id: str) -> Path:
    """``RUN_DIR/captures/<id>``."""
    return captures_root(run_dir) / capture_id


def status_path(run_dir: str | os.PathLike[str], capture_id: str, rank: int) -> Path:
    """Where rank ``rank`` keeps its status of capture ``capture_id``."""
    return capture_dir(run_dir, capture_id) / f"rank{int(rank):05d}.json"


def trace_name(rank: int) -> str:
    """The file name of rank ``rank``'s trace in a capture's folder."""
    return f"rank{int(rank):05d}{TRACE_SUFFIX}"


def write_status(run_dir: str | os.PathLike[str], status: CaptureRankStatus) -> Path:
    """Write a rank's status atomically (the asker polls it), inside the run directory
    whatever links it holds (:mod:`meshprof.rundir.confine`)."""
    data = json.dumps(status.to_dict()).encode("utf-8")
    name = status_path(run_dir, status.id, status.rank).name
    return confined_write(run_dir, (CAPTURES_DIR, status.id), name, data)


def write_request_copy(run_dir: str | os.PathLike[str], req: CaptureRequest) -> Path:
    """Keep the request in the capture's folder (the report reads it: trigger, ranks, steps)."""
    data = json.dumps(req.to_dict()).encode("utf-8")
    return confined_write(run_dir, (CAPTURES_DIR, req.id), REQUEST_FILE, data)


def read_statuses(run_dir: str | os.PathLike[str], capture_id: str) -> dict[int, CaptureRankStatus]:
    """Every rank's status of a capture so far, by rank (unreadable files are skipped)."""
    return _statuses(capture_dir(run_dir, capture_id))


def _statuses(folder: Path) -> dict[int, CaptureRankStatus]:
    out: dict[int, CaptureRankStatus] = {}
    try:
        names = os.listdir(folder)
    except OSError:
        return out
    for name in names:
        if not _STATUS_RE.match(name):
            continue
        try:
            st = CaptureRankStatus.from_dict(read_json(folder / name, MAX_STATUS_BYTES))
        except (OSError, ValueError, TypeError, RecordError):
            continue
        out[st.rank] = st
    return dict(sorted(out.items()))


def captures_bytes(run_dir: str | os.PathLike[str]) -> int:
    """Bytes on disk under ``RUN_DIR/captures`` (what the disk budget counts)."""
    total = 0
    for root, _dirs, files in os.walk(captures_root(run_dir)):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_size
            except OSError:
                continue
    return total


@dataclass(frozen=True, slots=True)
class LoadedCapture:
    """One capture's folder, read."""

    id: str
    """The capture's id (its folder's name)."""
    path: Path
    """Its folder."""
    request: CaptureRequest | None
    """The request (None when ``request.json`` is missing or damaged)."""
    statuses: dict[int, CaptureRankStatus]
    """Each rank's status, by rank."""
    traces: dict[int, Path]
    """Each rank's trace file that exists, by rank."""
    problems: tuple[str, ...] = ()
    """What could not be read."""


def load_capture(folder: str | os.PathLike[str]) -> LoadedCapture:
    """Read one capture's folder (never raises for a damaged file: it is named in ``problems``)."""
    d = Path(folder)
    problems: list[str] = []
    request = None
    try:
        request = CaptureRequest.from_dict(read_json(d / REQUEST_FILE, MAX_STATUS_BYTES))
    except FileNotFoundError:
        problems.append(f"{d.name}: no {REQUEST_FILE}")
    except (OSError, ValueError, TypeError, RecordError) as e:
        problems.append(f"{d.name}/{REQUEST_FILE}: unreadable ({e})")
    statuses = _statuses(d)
    traces: dict[int, Path] = {}
    for r, st in statuses.items():
        if st.trace and (d / st.trace).is_file():
            traces[r] = d / st.trace
    return LoadedCapture(d.name, d, request, statuses, traces, tuple(problems))


def list_captures(run_dir: str | os.PathLike[str]) -> list[LoadedCapture]:
    """Every capture of a run, oldest request first."""
    root = captures_root(run_dir)
    try:
        folders = [p for p in root.iterdir() if p.is_dir()]
    except OSError:
        return []
    caps = [load_capture(p) for p in folders]
    return sorted(caps, key=lambda c: (c.request.requested_ns if c.request else 0, c.id))


def capture_traces(run_dir: str | os.PathLike[str]) -> list[Path]:
    """Every capture trace of a run (for the merged Perfetto timeline)."""
    return [p for c in list_captures(run_dir) for _, p in sorted(c.traces.items())]


__all__ = [
    "CAPTURES_DIR",
    "REQUEST_FILE",
    "TRACE_SUFFIX",
    "LoadedCapture",
    "capture_dir",
    "capture_traces",
    "captures_bytes",
    "captures_root",
    "list_captures",
    "load_capture",
    "read_statuses",
    "status_path",
    "trace_name",
    "write_request_copy",
    "write_status",
]

"""Requests to the ranks of a running job, through the run directory (no port): the asker writes
one file in ``RUN_DIR/requests/`` (atomically), every rank's capture agent
(:mod:`meshprof.session.capture_agent`) looks at the folder about twice a second, answers the
requests that name it, and the asker removes the file once it has its answers.

``capture-<id>.json`` is a :class:`~meshprof.records.captures.CaptureRequest`,
``stacks-<id>.json`` a :class:`~meshprof.records.stacks.StacksRequest`. Anyone who can write the
run directory can post one, so a rank reads them as hostile input (:func:`scan_requests`): the
id in the file must be the id of its name (:data:`~meshprof.records.names.ID_PATTERN`, checked
by the record when read), a file is read only when it is a regular file of at most
:data:`MAX_REQUEST_BYTES`, and its owner is said (the agent ignores other users' requests
unless the job accepts them). A request the ranks refuse gets one
:class:`~meshprof.records.captures.RequestRefusal` in ``RUN_DIR/requests/refused/``, which the
asker reads (:func:`read_refusal`)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from meshprof.records.captures import CaptureRequest, RequestRefusal
from meshprof.records.codec import RecordError
from meshprof.records.names import ID_PATTERN
from meshprof.records.stacks import StacksRequest
from meshprof.rundir.atomic import atomic_write_text
from meshprof.rundir.confine import confined_write
from meshprof.rundir.json_file import read_json

REQUESTS_DIR = "requests"
REFUSED_DIR = "refused"
_REQUEST_RE = re.compile(rf"(capture|stacks)-({ID_PATTERN})\.json")
MAX_REQUEST_BYTES = 64 << 10
"""A request file larger than this (bytes) is not read: a request is a few hundred bytes."""
MAX_SCANNED = 64
"""The most request files one look reads (the newest): a folder flooded with requests costs a
rank a bounded time per look."""

Request = CaptureRequest | StacksRequest


@dataclass(frozen=True, slots=True)
class PostedRequest:
    """One file of ``RUN_DIR/requests``, read (or why it could not be)."""

    name: str
    """Its file name (``<kind>-<id>.json``)."""
    kind: str
    """``"capture"`` or ``"stacks"`` (from the name)."""
    request: Request | None
    """The request; None when the file is not one (``problem`` says why)."""
    problem: str
    """Why the file is not a request the ranks may take, in words ("" when it is)."""
    owner: int
    """The file's owner (user id; -1 where the platform has none)."""
    mtime_ns: int
    """When it was written."""


def requests_dir(run_dir: str | os.PathLike[str]) -> Path:
    """``RUN_DIR/requests``."""
    return Path(run_dir) / REQUESTS_DIR


def new_request_id(now_ns: int | None = None) -> str:
    """A fresh id: the UTC time to the second and a random suffix (``20260101-120000-3fa2``)."""
    t = time.gmtime((time.time_ns() if now_ns is None else now_ns) // 1_000_000_000)
    return time.strftime("%Y%m%d-%H%M%S", t) + "-" + secrets.token_hex(2)


def request_path(run_dir: str | os.PathLike[str], req: Request) -> Path:
    """Where ``req`` is written: ``RUN_DIR/requests/<kind>-<id>.json``."""
    return requests_dir(run_dir) / request_name(req)


def write_request(run_dir: str | os.PathLike[str], req: Request) -> Path:
    """Post ``req`` to the ranks (atomically: a rank never reads half a request)."""
    return atomic_write_text(request_path(run_dir, req), json.dumps(req.to_dict()), fsync=False)


def remove_request(run_dir: str | os.PathLike[str], req: Request) -> None:
    """Withdraw ``req`` (the asker has its answers, or gave up; a refusal stays)."""
    with contextlib.suppress(OSError):
        request_path(run_dir, req).unlink()


def scan_requests(run_dir: str | os.PathLike[str], limit: int = MAX_SCANNED) -> list[PostedRequest]:
    """The request files posted now (the ``limit`` newest), oldest first, each read or with
    the reason it is not a request (never raises)."""
    folder = requests_dir(run_dir)
    found: list[tuple[int, str, str, int]] = []
    try:
        with os.scandir(folder) as it:
            for entry in it:
                m = _REQUEST_RE.fullmatch(entry.name)
                if m is None:
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                found.append((st.st_mtime_ns, entry.name, m.group(1), getattr(st, "st_uid", -1)))
    except OSError:
        return []
    found.sort(reverse=True)
    out = [_read_posted(folder, *x) for x in found[: max(limit, 0)]]
    return out[::-1]


def _read_posted(folder: Path, mtime_ns: int, name: str, kind: str, owner: int) -> PostedRequest:
    file_id = name[len(kind) + 1 : -len(".json")]
    req: Request | None = None
    try:
        data = read_json(folder / name, MAX_REQUEST_BYTES, follow=False)
        if not isinstance(data, dict):
            raise RecordError("not a JSON object")
        req = CaptureRequest.from_dict(data) if kind == "capture" else StacksRequest.from_dict(data)
        problem = "" if req.id == file_id else f"its id {req.id!r} is not the file's ({file_id})"
    except (OSError, ValueError, RecordError) as e:
        req, problem = None, f"not a {kind} request ({_short(e)})"
    return PostedRequest(name, kind, None if problem else req, problem, owner, mtime_ns)


def _short(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def read_requests(run_dir: str | os.PathLike[str]) -> list[Request]:
    """The readable requests posted now, oldest first (:func:`scan_requests` without the
    files that are not requests)."""
    got = [p.request for p in scan_requests(run_dir) if p.request is not None]
    return sorted(got, key=lambda r: r.requested_ns)


def request_name(req: Request) -> str:
    """The file name of ``req`` in ``RUN_DIR/requests``."""
    return f"{req.kind}-{req.id}.json"


def refusal_path(run_dir: str | os.PathLike[str], name: str) -> Path:
    """Where the refusal of the request file ``name`` is: ``RUN_DIR/requests/refused/<name>``."""
    return requests_dir(run_dir) / REFUSED_DIR / name


def write_refusal(run_dir: str | os.PathLike[str], refusal: RequestRefusal) -> bool:
    """Say why a request was refused, once: the first rank's refusal stays (False when one was
    there). Written inside the run directory whatever links it holds."""
    data = json.dumps(refusal.to_dict()).encode("utf-8")
    path = refusal_path(run_dir, refusal.request)
    if path.exists():
        return False
    confined_write(run_dir, (REQUESTS_DIR, REFUSED_DIR), refusal.request, data, replace=False)
    return True


def read_refusal(run_dir: str | os.PathLike[str], req: Request) -> RequestRefusal | None:
    """The ranks' refusal of ``req`` (None while there is none)."""
    path = refusal_path(run_dir, request_name(req))
    try:
        data = read_json(path, MAX_REQUEST_BYTES, follow=False)
        return RequestRefusal.from_dict(data) if isinstance(data, dict) else None
    except (OSError, ValueError, RecordError):
        return None


__all__ = [
    "MAX_REQUEST_BYTES",
    "MAX_SCANNED",
    "REFUSED_DIR",
    "REQUESTS_DIR",
    "PostedRequest",
    "Request",
    "new_request_id",
    "read_refusal",
    "read_requests",
    "refusal_path",
    "remove_request",
    "request_name",
    "request_path",
    "requests_dir",
    "scan_requests",
    "write_refusal",
    "write_request",
]

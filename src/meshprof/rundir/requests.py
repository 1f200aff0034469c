"""Requests to the ranks of a running job, through the run directory (no port): the asker writes
one file in ``RUN_DIR/requests/`` (atomically), every rank's capture agent
(:mod:`meshprof.session.capture_agent`) looks at the folder about twice a second, answers the
requests that name it, and the asker removes the file once it has its answers.

``capture-<id>.json`` is a :class:`~meshprof.records.captures.CaptureRequest`,
``stacks-<id>.json`` a :class:`~meshprof.records.stacks.StacksRequest`."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import time
from pathlib import Path

from meshprof.records.captures import CaptureRequest
from meshprof.records.codec import RecordError
from meshprof.records.stacks import StacksRequest
from meshprof.rundir.atomic import atomic_write_text

REQUESTS_DIR = "requests"
_REQUEST_RE = re.compile(r"^(capture|stacks)-([A-Za-z0-9_.-]+)\.json$")

Request = CaptureRequest | StacksRequest


def requests_dir(run_dir: str | os.PathLike[str]) -> Path:
    """``RUN_DIR/requests``."""
    return Path(run_dir) / REQUESTS_DIR


def new_request_id(now_ns: int | None = None) -> str:
    """A fresh id: the UTC time to the second and a random suffix (``20260101-120000-3fa2``)."""
    t = time.gmtime((time.time_ns() if now_ns is None else now_ns) // 1_000_000_000)
    return time.strftime("%Y%m%d-%H%M%S", t) + "-" + secrets.token_hex(2)


def request_path(run_dir: str | os.PathLike[str], req: Request) -> Path:
    """Where ``req`` is written: ``RUN_DIR/requests/<kind>-<id>.json``."""
    return requests_dir(run_dir) / f"{req.kind}-{req.id}.json"


def write_request(run_dir: str | os.PathLike[str], req: Request) -> Path:
    """Post ``req`` to the ranks (atomically: a rank never reads half a request)."""
    return atomic_write_text(request_path(run_dir, req), json.dumps(req.to_dict()), fsync=False)


def remove_request(run_dir: str | os.PathLike[str], req: Request) -> None:
    """Withdraw ``req`` (the asker has its answers, or gave up)."""
    with contextlib.suppress(OSError):
        request_path(run_dir, req).unlink()


def read_requests(run_dir: str | os.PathLike[str]) -> list[Request]:
    """The requests posted now, oldest first; files that cannot be read are skipped."""
    out: list[Request] = []
    try:
        names = sorted(os.listdir(requests_dir(run_dir)))
    except OSError:
        return out
    for name in names:
        m = _REQUEST_RE.match(name)
        if not m:
            continue
        try:
            data = json.loads((requests_dir(run_dir) / name).read_text("utf-8"))
            if m.group(1) == "capture":
                out.append(CaptureRequest.from_dict(data))
            else:
                out.append(StacksRequest.from_dict(data))
        except (OSError, ValueError, TypeError, RecordError):
            continue
    return sorted(out, key=lambda r: r.requested_ns)


__all__ = [
    "REQUESTS_DIR",
    "Request",
    "new_request_id",
    "read_requests",
    "remove_request",
    "request_path",
    "requests_dir",
    "write_request",
]

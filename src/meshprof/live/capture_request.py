"""Asking the ranks of a running job, and waiting for their answers: a capture
(:func:`run_capture`) or every rank's stacks (:func:`take_stacks`). The requests travel through
the run directory (:mod:`meshprof.rundir.requests`); the ranks' capture agents answer
(:mod:`meshprof.session.capture_agent`). Used by ``meshprof capture``, ``meshprof stacks`` and
the launcher's ``--capture-on``."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from meshprof.analyze.live.snapshot import read_snapshot
from meshprof.analyze.traces.capture_diff import CaptureComparison, compare_capture
from meshprof.errors import MeshprofError
from meshprof.records.captures import CaptureRankStatus, CaptureRequest, CaptureState
from meshprof.records.live import LiveSnapshot
from meshprof.records.stacks import RankStacks, StacksRequest
from meshprof.rundir.captures import (
    capture_dir,
    load_capture,
    read_statuses,
    write_request_copy,
)
from meshprof.rundir.live import read_rank_lives
from meshprof.rundir.requests import (
    Request,
    new_request_id,
    read_refusal,
    refusal_path,
    remove_request,
    request_name,
    write_request,
)
from meshprof.rundir.stacks import read_rank_stacks

#: Seconds between two looks at the answers.
POLL_S = 0.1
#: Seconds a rank has after the timeout to say it timed out (its agent looks twice a second).
GRACE_S = 2.0
#: Seconds more to wait for a trace being written when the timeout passes.
WRITING_GRACE_S = 30.0


class RequestRefusedError(MeshprofError):
    """The ranks refused the request (its refusal file says why)."""


def check_refused(run_dir: Path, req: Request) -> None:
    """:class:`RequestRefusedError` when a rank refused ``req`` (one line: the file and why)."""
    ref = read_refusal(run_dir, req)
    if ref is not None:
        raise RequestRefusedError(
            f"{refusal_path(run_dir, request_name(req))}: rank {ref.rank} refused the "
            f"{req.kind} request: {ref.reason}"
        )


def _gone(run_dir: Path, ranks: Iterable[int]) -> set[int]:
    """Ranks whose live record says they ended (they will not answer)."""
    wanted = set(ranks)
    lives = read_rank_lives(run_dir, only=lambda r: r in wanted)
    return {r for r, x in lives.items() if x.status != "running"}


def wait_for_capture(
    run_dir: str | os.PathLike[str],
    req: CaptureRequest,
    on_status: Callable[[CaptureRankStatus], None] | None = None,
    poll_s: float = POLL_S,
) -> dict[int, CaptureRankStatus]:
    """Wait until every asked rank's status is final, the ranks not final have ended, or the
    timeout (plus :data:`GRACE_S`; plus :data:`WRITING_GRACE_S` while a trace is being written)
    has passed. ``on_status`` sees each new status. Returns the last statuses;
    :class:`RequestRefusedError` when the ranks refused the request."""
    run = Path(run_dir)
    seen: dict[int, tuple[str, int]] = {}
    statuses: dict[int, CaptureRankStatus] = {}
    end = req.deadline_ns + int(GRACE_S * 1e9)
    while True:
        statuses = read_statuses(run, req.id)
        for r, st in statuses.items():
            if seen.get(r) != (st.state, st.updated_ns):
                seen[r] = (st.state, st.updated_ns)
                if on_status is not None:
                    on_status(st)
        open_ = [r for r in req.ranks if r not in statuses or not statuses[r].state.final]
        if not open_:
            return statuses
        check_refused(run, req)
        now = time.time_ns()
        writing = any(statuses.get(r) and statuses[r].state is CaptureState.WRITING for r in open_)
        if now > end + (int(WRITING_GRACE_S * 1e9) if writing else 0):
            return statuses
        if set(open_) <= _gone(run, open_):
            return statuses
        time.sleep(poll_s)


def run_capture(
    run_dir: str | os.PathLike[str],
    req: CaptureRequest,
    on_status: Callable[[CaptureRankStatus], None] | None = None,
) -> CaptureComparison:
    """Post ``req``, wait for the ranks (:func:`wait_for_capture`), withdraw it and compare
    what came back."""
    run = Path(run_dir)
    write_request_copy(run, req)
    write_request(run, req)
    try:
        wait_for_capture(run, req, on_status)
    finally:
        remove_request(run, req)
    return compare_capture(load_capture(capture_dir(run, req.id)))


def take_stacks(
    run_dir: str | os.PathLike[str],
    expected: Iterable[int],
    timeout_s: float = 5.0,
    ranks: tuple[int, ...] = (),
    poll_s: float = POLL_S,
) -> tuple[str, dict[int, RankStacks]]:
    """Ask for the stacks of ``ranks`` (empty: every rank) and wait until every rank of
    ``expected`` has answered or ``timeout_s`` passed: (request id, answers by rank);
    :class:`RequestRefusedError` when the ranks refused it and none answered."""
    run = Path(run_dir)
    req = StacksRequest(
        id=new_request_id(), ranks=ranks, requested_ns=time.time_ns(), timeout_s=timeout_s
    )
    want = set(expected)
    write_request(run, req)
    end = time.monotonic() + timeout_s
    try:
        while True:
            got = read_rank_stacks(run, req.id)
            if want <= set(got):
                return req.id, got
            if not got:
                check_refused(run, req)
            if time.monotonic() >= end:
                return req.id, got
            time.sleep(poll_s)
    finally:
        remove_request(run, req)


def running_job(run_dir: str | os.PathLike[str]) -> tuple[LiveSnapshot, int]:
    """The live snapshot of a job running under ``meshprof run`` and its world size;
    :class:`MeshprofError` (one line, exit code 2) for a missing directory, a run with no live
    state (not under ``meshprof run``, or ``--live-interval 0``) or a job that has ended."""
    run = Path(run_dir)
    if not run.is_dir():
        raise MeshprofError(f"{run}: no such run directory")
    snap = read_snapshot(run)
    if not snap.ranks:
        raise MeshprofError(
            f"{run}: no live state in {run / 'live'}: not a job running under meshprof run "
            "(or it runs with --live-interval 0)"
        )
    if snap.ended:
        raise MeshprofError(
            f"{run}: the job has ended (its ranks' live state says so): nothing to ask; "
            "meshprof report shows its earlier captures"
        )
    world = snap.world_size if snap.world_size > 0 else max(snap.ranks) + 1
    return snap, world


__all__ = [
    "RequestRefusedError",
    "check_refused",
    "run_capture",
    "running_job",
    "take_stacks",
    "wait_for_capture",
]

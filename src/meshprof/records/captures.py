"""Captures: torch.profiler traces of a few steps, taken on chosen ranks of a running job at a
step boundary (``meshprof capture``, ``meshprof run --capture-on``).

A requester writes a :class:`CaptureRequest` (``RUN_DIR/requests/capture-<id>.json``); every
named rank's capture agent answers with a :class:`CaptureRankStatus` (``RUN_DIR/captures/<id>/
rank{R}.json``, rewritten as the capture proceeds) and, when it traced, its Kineto trace beside
it. The files are read and written by :mod:`meshprof.rundir.captures`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from meshprof.records.codec import CodedRecord, RecordError
from meshprof.records.finding import StrEnum
from meshprof.records.members import check_ranks
from meshprof.records.names import check_id
from meshprof.records.stacks import RankStacks

CAPTURE_FORMAT = "meshprof-capture/1"

MAX_CAPTURE_STEPS = 50
"""The most steps one capture traces (torch.profiler keeps every event in memory until it
stops)."""

ACTIVITIES = ("cpu", "cuda")
"""What a capture can trace (torch.profiler's activities)."""

MAX_TIMEOUT_S = 3600.0
"""The longest timeout a request may carry (s): a rank armed for a capture that never starts is
busy for that long."""

GIB = 1 << 30


class CaptureState(StrEnum):
    """Where a rank's part of a capture is."""

    ARMED = "armed"
    """The request was seen; torch.profiler starts at the boundary of ``start_step``, the step
    every asked rank agrees on (the same steps are traced on every rank)."""
    TRACING = "tracing"
    """torch.profiler is on since ``start_step``."""
    WRITING = "writing"
    """torch.profiler stopped; the trace is being written (off the training thread)."""
    DONE = "done"
    """The trace is written (``steps`` steps; fewer than asked when it ended late)."""
    TIMED_OUT = "timed_out"
    """The timeout passed before the rank reached a step boundary (armed: nothing traced), or
    before it finished the steps (tracing: the trace is written at its next boundary, if any);
    ``where`` says where its main thread was."""
    SKIPPED = "skipped"
    """Not captured: another capture is running on the rank, or the disk budget is spent."""
    FAILED = "failed"
    """torch.profiler or writing the trace failed (``message`` says why); training went on."""

    @property
    def final(self) -> bool:
        """The rank will not write this capture's status again (TIMED_OUT may still turn into
        DONE when a late rank reaches its boundary: the asker does not wait for that)."""
        return self in (
            CaptureState.DONE,
            CaptureState.TIMED_OUT,
            CaptureState.SKIPPED,
            CaptureState.FAILED,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class CaptureRequest(CodedRecord):
    """What the asker wants traced (``RUN_DIR/requests/capture-<id>.json``; a copy stays in
    ``RUN_DIR/captures/<id>/request.json``)."""

    format: str = CAPTURE_FORMAT
    """``"meshprof-capture/1"``."""
    kind: str = "capture"
    """``"capture"``: what the agent reads the file as."""
    id: str
    """The capture's id, also its folder's name (``RUN_DIR/captures/<id>/``)."""
    ranks: tuple[int, ...]
    """The ranks to trace; the first is compared with each of the others (the culprit first,
    then its healthy peer)."""
    steps: int = 3
    """Steps to trace, from each rank's next step boundary (1 to :data:`MAX_CAPTURE_STEPS`)."""
    activities: tuple[str, ...] = ()
    """torch.profiler activities among :data:`ACTIVITIES`; empty: cpu, and cuda where CUDA is
    available (cuda asked where there is none is left out, and said)."""
    record_shapes: bool = False
    """torch.profiler's ``record_shapes``."""
    with_stack: bool = False
    """torch.profiler's ``with_stack`` (Python stacks of the ops: larger traces)."""
    trigger: str = "demand"
    """Why: ``"demand"`` (``meshprof capture``) or the kind of the alert that asked for it
    (``straggler``, ``step_regression``, ``stall``, ...)."""
    reason: str = ""
    """Why these ranks, in words (the culprit and how its peer was chosen)."""
    requested_ns: int
    """When it was asked (wall clock of the asking host)."""
    timeout_s: float = 60.0
    """A rank that has not started by ``requested_ns`` + this gives up (``timed_out``); one
    still tracing then stops at its next step boundary."""
    max_bytes: int = 0
    """Disk budget of ``RUN_DIR/captures`` as a whole: a rank does not keep a trace that would
    take it past this many bytes (0: the job's own budget, :attr:`CaptureLimits.max_bytes`; a
    request only ever lowers the job's budget)."""

    def __post_init__(self) -> None:
        """A request read from a file is checked here: its id is a name (it becomes a folder),
        its numbers are in range (:class:`RecordError` otherwise)."""
        check_id(self.id, "capture request.id")
        check_ranks(self.ranks, "capture request.ranks")
        if not self.ranks:
            raise RecordError("capture request.ranks: no rank named")
        if not 1 <= self.steps <= MAX_CAPTURE_STEPS:
            raise RecordError(
                f"capture request.steps: {self.steps}, expected 1 to {MAX_CAPTURE_STEPS}"
            )
        bad = [a for a in self.activities if a not in ACTIVITIES]
        if bad:
            raise RecordError(
                f"capture request.activities: {bad[0]!r}, expected some of {', '.join(ACTIVITIES)}"
            )
        if not (math.isfinite(self.timeout_s) and 0 < self.timeout_s <= MAX_TIMEOUT_S):
            raise RecordError(
                f"capture request.timeout_s: {self.timeout_s}, expected 0 to {MAX_TIMEOUT_S:g} s"
            )
        if self.max_bytes < 0:
            raise RecordError(f"capture request.max_bytes: {self.max_bytes}, expected >= 0")
        if self.requested_ns < 0:
            raise RecordError(f"capture request.requested_ns: {self.requested_ns}, expected >= 0")

    @property
    def deadline_ns(self) -> int:
        """``requested_ns`` + the timeout."""
        return self.requested_ns + int(self.timeout_s * 1e9)

    JSON_WHAT: ClassVar[str] = "capture request"


@dataclass(frozen=True, slots=True, kw_only=True)
class CaptureLimits(CodedRecord):
    """What the job lets a request ask of its ranks (``meshprof run``'s options, carried to
    every rank in :class:`~meshprof.records.worker_settings.WorkerSettings`). A request is read
    from a folder others may write: it can ask for less than these, never more; one that asks
    for more is refused, and says why (:class:`RequestRefusal`)."""

    max_steps: int = MAX_CAPTURE_STEPS
    """The most steps one capture traces."""
    max_bytes: int = 2 * GIB
    """Disk budget of ``RUN_DIR/captures`` (bytes): no trace is kept past it, whatever the
    request's own ``max_bytes``."""
    max_per_hour: int = 12
    """Captures a rank starts in any hour, whoever asks (``meshprof capture`` and the alerts'
    captures together)."""
    activities: tuple[str, ...] = ACTIVITIES
    """The torch.profiler activities a request may ask for."""
    max_timeout_s: float = MAX_TIMEOUT_S
    """The longest timeout a capture request may carry (s): an armed rank serves no other
    capture until its request's timeout."""
    stacks_per_hour: int = 720
    """Stacks requests a rank answers in any hour (one every 5 s)."""
    any_user: bool = False
    """Answer requests written by other users than the job's (the file's owner): off by
    default (``meshprof run --requests-from-any-user``)."""

    def __post_init__(self) -> None:
        if not 1 <= self.max_steps <= MAX_CAPTURE_STEPS:
            raise RecordError(
                f"capture limits.max_steps: {self.max_steps}, expected 1 to {MAX_CAPTURE_STEPS}"
            )
        if self.max_bytes < 1 or self.max_per_hour < 0 or self.stacks_per_hour < 0:
            raise RecordError("capture limits: max_bytes must be > 0, the rates >= 0")
        if not (math.isfinite(self.max_timeout_s) and 0 < self.max_timeout_s <= MAX_TIMEOUT_S):
            raise RecordError(
                f"capture limits.max_timeout_s: {self.max_timeout_s}, expected 0 to "
                f"{MAX_TIMEOUT_S:g} s"
            )
        bad = [a for a in self.activities if a not in ACTIVITIES]
        if bad:
            raise RecordError(f"capture limits.activities: {bad[0]!r} is not an activity")

    def excess(self, req: CaptureRequest) -> str:
        """What ``req`` asks beyond these limits, in words ("" when nothing)."""
        if req.steps > self.max_steps:
            return f"{req.steps} steps asked, the job allows {self.max_steps}"
        extra = [a for a in req.activities if a not in self.activities]
        if extra:
            allowed = ", ".join(self.activities) or "none"
            return f"activity {extra[0]} asked, the job allows {allowed}"
        if req.timeout_s > self.max_timeout_s:
            return f"a timeout of {req.timeout_s:g} s, the job allows {self.max_timeout_s:g} s"
        return ""

    def budget(self, req: CaptureRequest) -> int:
        """The disk budget of ``RUN_DIR/captures`` for ``req`` (bytes): the job's, or the
        request's when lower."""
        return min(self.max_bytes, req.max_bytes) if req.max_bytes > 0 else self.max_bytes

    JSON_WHAT: ClassVar[str] = "capture limits"


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestRefusal(CodedRecord):
    """Why the ranks did not take a request (``RUN_DIR/requests/refused/<kind>-<id>.json``,
    written once, by the first rank that refused it; the asker prints it and stops waiting)."""

    format: str = CAPTURE_FORMAT
    """``"meshprof-capture/1"``."""
    request: str
    """The request's file name in ``RUN_DIR/requests`` (``capture-<id>.json``)."""
    reason: str
    """Why, in words (an id that is not a name, another user's file, a limit of the job)."""
    rank: int
    """The rank that wrote this."""
    refused_ns: int
    """When (wall clock of the rank's host)."""
    pid: int = -1
    """The rank's process id."""
    hostname: str = ""
    """The rank's host."""

    JSON_WHAT: ClassVar[str] = "request refusal"


@dataclass(frozen=True, slots=True)
class CapturedStep:
    """One traced step, as the rank's step monitor bounds it (wall clock of the rank's host)."""

    step: int
    """Step number."""
    start_ns: int
    """Its boundary at the start."""
    end_ns: int
    """Its boundary at the end."""


@dataclass(frozen=True, slots=True)
class CapturedPhase:
    """A phase the step monitor recorded inside the traced steps (``with monitor.phase(...)``)."""

    name: str
    """The phase's name."""
    step: int
    """The step it is in."""
    start_ns: int
    """Start (wall clock of the rank's host)."""
    end_ns: int
    """End."""


@dataclass(frozen=True, slots=True)
class CaptureCost:
    """What the capture cost the rank."""

    start_ns: int = 0
    """Training-thread time starting torch.profiler at the first boundary."""
    stop_ns: int = 0
    """Training-thread time stopping it at the last boundary."""
    boundary_ns: int = 0
    """Training-thread time at the boundaries in between (the step annotations)."""
    write_ns: int = 0
    """Time writing and compressing the trace, on the agent's thread (not the training thread)."""
    step_ns_before: int = 0
    """Median duration of the (up to 8) steps before the capture."""
    step_ns_during: int = 0
    """Median duration of the traced steps: the difference to ``step_ns_before`` is what
    torch.profiler cost each traced step (with any change in the job itself)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CaptureRankStatus(CodedRecord):
    """One rank's part of a capture (``RUN_DIR/captures/<id>/rank{R}.json``)."""

    format: str = CAPTURE_FORMAT
    """``"meshprof-capture/1"``."""
    id: str
    """The capture's id."""
    rank: int
    """Global rank."""
    state: CaptureState
    """Where it is (see :class:`CaptureState`)."""
    updated_ns: int
    """When this status was written (wall clock of the rank's host)."""
    message: str = ""
    """Why it was skipped, failed or timed out; notes (CUDA asked but not available)."""
    steps_asked: int = 0
    """Steps the request asked for."""
    armed_step: int = -1
    """The step the rank was in when it armed (-1: not armed)."""
    step_ns: int = 0
    """The rank's median recent step when it armed, ns (0: unknown)."""
    start_step: int = -1
    """The step the ranks agreed to start at (see :mod:`meshprof.session.capture_agent`; -1:
    not agreed yet)."""
    steps: tuple[CapturedStep, ...] = ()
    """The steps traced so far."""
    phases: tuple[CapturedPhase, ...] = ()
    """The step monitor's phases inside the traced steps (empty when the script marks none)."""
    activities: tuple[str, ...] = ()
    """The activities traced."""
    trace: str = ""
    """The trace's file name in the capture's folder ("" until written)."""
    trace_bytes: int = 0
    """Its size on disk."""
    cost: CaptureCost = CaptureCost()
    """What the capture cost the rank."""
    where: RankStacks | None = None
    """Every thread's stack when the rank timed out (it did not reach a step boundary in time)."""
    pid: int = -1
    """The rank's process id."""
    hostname: str = ""
    """The rank's host."""

    def __post_init__(self) -> None:
        check_id(self.id, "capture status.id")
        check_ranks((self.rank,), "capture status.rank")

    JSON_WHAT: ClassVar[str] = "capture status"


@dataclass(frozen=True, slots=True)
class OpDifference:
    """How one op's time per step differs between two ranks of a capture
    (:mod:`meshprof.analyze.traces.capture_diff`)."""

    name: str
    """The op (``aten::mm``) or kernel."""
    phase: str
    """The step phase it runs in (``forward``, ``backward``, ``after backward``,
    ``optimizer``, ``data``, or the script's own phase names)."""
    a_rank: int
    """The rank compared (the culprit)."""
    b_rank: int
    """The rank it is compared with (its peer)."""
    a_ns: int
    """Its self time per step on ``a_rank``, ns."""
    b_ns: int
    """On ``b_rank``."""
    delta_ns: int
    """``a_ns`` − ``b_ns``."""
    kind: str = "op"
    """``"op"`` (a CPU op) or ``"kernel"`` (a device kernel)."""
    a_calls: float = 0.0
    """Calls per step on ``a_rank``."""
    b_calls: float = 0.0
    """On ``b_rank``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AlertCapture(CodedRecord):
    """The ``capture`` of an ``--alert-cmd`` payload (``meshprof run --capture-on``): what the
    capture the alert started found, or why none was taken."""

    status: str
    """``complete`` (every rank traced), ``partial``, ``empty`` (no rank traced) or
    ``skipped`` (rate or disk limit, another capture running: see ``message``)."""
    message: str
    """The capture in one line (its top difference), or why it was skipped."""
    id: str = ""
    """The capture's id ("" when skipped)."""
    dir: str = ""
    """Its folder (``RUN_DIR/captures/<id>``)."""
    trigger: str = ""
    """The alert's kind."""
    ranks: tuple[int, ...] = ()
    """The ranks traced, the culprit first."""
    reason: str = ""
    """Why these ranks."""
    steps: int = 0
    """Steps asked per rank."""
    requested_ns: int = 0
    """When the capture was asked (wall clock)."""
    analysed_ns: int = 0
    """When its comparison was ready (wall clock)."""
    differences: tuple[OpDifference, ...] = ()
    r"""The top differences, largest \|delta\| first."""
    stacks: tuple[str, ...] = ()
    """On a forming hang: every rank's stack, clustered (one line per cluster)."""

    JSON_WHAT: ClassVar[str] = "alert capture"


__all__ = [
    "ACTIVITIES",
    "CAPTURE_FORMAT",
    "GIB",
    "MAX_CAPTURE_STEPS",
    "MAX_TIMEOUT_S",
    "AlertCapture",
    "CaptureCost",
    "CaptureLimits",
    "CaptureRankStatus",
    "CaptureRequest",
    "CaptureState",
    "CapturedPhase",
    "CapturedStep",
    "OpDifference",
    "RequestRefusal",
]

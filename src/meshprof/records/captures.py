"""Captures: torch.profiler traces of a few steps, taken on chosen ranks of a running job at a
step boundary (``meshprof capture``, ``meshprof run --capture-on``).

A requester writes a :class:`CaptureRequest` (``RUN_DIR/requests/capture-<id>.json``); every
named rank's capture agent answers with a :class:`CaptureRankStatus` (``RUN_DIR/captures/<id>/
rank{R}.json``, rewritten as the capture proceeds) and, when it traced, its Kineto trace beside
it. The files are read and written by :mod:`meshprof.rundir.captures`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meshprof.records.codec import dataclass_to_json, from_json
from meshprof.records.finding import StrEnum
from meshprof.records.stacks import RankStacks

CAPTURE_FORMAT = "meshprof-capture/1"

MAX_CAPTURE_STEPS = 50
"""The most steps one capture traces (torch.profiler keeps every event in memory until it
stops)."""

ACTIVITIES = ("cpu", "cuda")
"""What a capture can trace (torch.profiler's activities)."""


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
class CaptureRequest:
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
    take it past this many bytes (0: no limit)."""

    @property
    def deadline_ns(self) -> int:
        """``requested_ns`` + the timeout."""
        return self.requested_ns + int(self.timeout_s * 1e9)

    def to_dict(self) -> dict[str, Any]:
        return dataclass_to_json(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CaptureRequest:
        return from_json(cls, d, "capture request")


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
class CaptureRankStatus:
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

    def to_dict(self) -> dict[str, Any]:
        return dataclass_to_json(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CaptureRankStatus:
        return from_json(cls, d, "capture status")


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
class AlertCapture:
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

    def to_dict(self) -> dict[str, Any]:
        return dataclass_to_json(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AlertCapture:
        return from_json(cls, d, "alert capture")


__all__ = [
    "ACTIVITIES",
    "CAPTURE_FORMAT",
    "MAX_CAPTURE_STEPS",
    "AlertCapture",
    "CaptureCost",
    "CaptureRankStatus",
    "CaptureRequest",
    "CaptureState",
    "CapturedPhase",
    "CapturedStep",
    "OpDifference",
]

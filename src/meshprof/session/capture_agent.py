"""The rank side of captures and stacks: a daemon thread that answers the requests posted in
``RUN_DIR/requests/`` (:mod:`meshprof.rundir.requests`).

* **stacks** — every thread's Python stack, written at once by the agent's thread
  (``RUN_DIR/stacks/<id>/rank{R}.json``): a rank stuck in Python code or in a collective that
  releases the GIL answers; a rank stuck holding the GIL, stopped or dead does not.
* **capture** — torch.profiler over K steps, the same steps on every asked rank. The agent arms
  a hook on the step monitor (:attr:`StepMonitor.boundary_hook`) and writes its status with the
  step it is in and its recent step time. Once every asked rank has armed (or after
  :data:`COORD_WAIT_S` without the missing ones), each agent computes the same start step from
  those statuses: the highest armed step + 1 + the steps of :data:`LEAD_S` seconds at the
  slowest rank's pace (so that every agent learns it before the job gets there). At that step's
  boundary the *training thread* starts torch.profiler's Kineto profiler (it must: the profiler
  follows the thread that enables it and the threads it starts), marks each traced step with a
  ``ProfilerStep#N`` annotation, and stops it K boundaries later. It is
  ``torch.autograd.profiler.profile``, the profiler ``torch.profiler.profile`` drives, used
  directly: ``torch.profiler.profile`` imports ``torch._inductor`` when it first starts (seconds
  of CPU and ~70 MiB in a process that does not compile), which the training process is spared;
  the trace and its ``distributedInfo`` are the same. Everything else — the agreement, the timeout,
  writing and compressing the trace, the statuses — runs on the agent's thread.

What it costs the training thread: nothing per step while no capture is pending (the monitor
checks one attribute per step boundary; the hook is set only while a capture is armed or
tracing); during a capture, starting and stopping torch.profiler at two boundaries and one
annotation per step in between, each measured and reported in the rank's status
(:class:`~meshprof.records.captures.CaptureCost`). Nothing here raises into training: a failure
ends the capture with a FAILED status, and the hook is removed.

What a request can make a rank do: the requests folder is input from anyone who can write the
run directory. A request passes :class:`~meshprof.session.request_gate.RequestGate` first (a
name for an id, the job's user, the job's limits; a refusal is said once), everything the rank
writes for it lies inside the run directory whatever links the folders hold
(:mod:`meshprof.rundir.confine`, :mod:`meshprof.session.trace_file`), and the rank starts at
most :attr:`~meshprof.records.captures.CaptureLimits.max_per_hour` captures and answers at most
:attr:`~meshprof.records.captures.CaptureLimits.stacks_per_hour` stacks requests an hour.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import statistics
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from meshprof.records.captures import (
    CaptureCost,
    CapturedStep,
    CaptureLimits,
    CaptureRankStatus,
    CaptureRequest,
    CaptureState,
)
from meshprof.records.stacks import StacksRequest
from meshprof.rundir.captures import captures_bytes, read_statuses, write_status
from meshprof.rundir.requests import request_name, requests_dir, scan_requests
from meshprof.rundir.stacks import write_rank_stacks
from meshprof.session.capture_steps import (
    add_distributed_info,
    choose_activities,
    mark_instrumented,
    median_recent_step,
    traced_phases,
    warm_up_profiler,
)
from meshprof.session.request_gate import RequestGate
from meshprof.session.thread_stacks import thread_stacks_now
from meshprof.session.trace_file import write_trace

#: Seconds between two looks at ``RUN_DIR/requests``.
POLL_S = 0.5
#: Seconds after which the folder is listed even if its mtime did not change (shared file
#: systems may cache a directory's attributes).
RELIST_S = 5.0
#: Seconds of steps between the agreement and the start step (every agent must see it first).
LEAD_S = 1.0
#: The most steps of lead (very short steps).
MAX_LEAD_STEPS = 200
#: Seconds an armed rank waits for the other asked ranks to arm before it starts without them.
COORD_WAIT_S = 3.0


class AgentHost(Protocol):
    """What the agent needs from its recording session (read when a capture is armed: the
    monitor may be attached after the agent starts)."""

    monitor: Any
    """The step monitor whose boundaries start and stop captures (None: no steps)."""

    def rank(self) -> int: ...


@dataclass(slots=True)
class _Capture:
    """One capture on this rank (guarded by the agent's lock)."""

    req: CaptureRequest
    rank: int
    state: CaptureState = CaptureState.ARMED
    message: str = ""
    activities: tuple[str, ...] = ()
    prof: Any = None
    annotation: Any = None
    steps: list[CapturedStep] = field(default_factory=list)
    step_open: tuple[int, int] | None = None  # (step, start_ns) of the step being traced
    cost: CaptureCost = field(default_factory=CaptureCost)
    monitor: Any = None
    timeout_said: bool = False
    armed_step: int = -1
    step_ns: int = 0
    start_at: int | None = None
    armed_mono: float = 0.0


class CaptureAgent:
    """Answers capture and stacks requests for one rank (see the module docstring)."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        host: AgentHost,
        poll_s: float = POLL_S,
        limits: CaptureLimits | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.host = host
        self.poll_s = float(poll_s)
        self.limits = limits if limits is not None else CaptureLimits()
        """What requests may ask of this rank (the job's limits)."""
        self.gate = RequestGate(self.run_dir, self.limits, self._rank)
        """Which requests the rank takes (:mod:`meshprof.session.request_gate`)."""
        self.started_ns = time.time_ns()
        self.captures_done = 0
        self.stacks_answered = 0
        self.failures = 0
        """Errors of the agent itself (a look that failed, a status not written)."""
        self._active: _Capture | None = None
        self._lock = threading.Lock()
        self._to_write: list[_Capture] = []
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._mtime = -1
        self._listed = 0.0
        self._hostname = socket.gethostname()

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> CaptureAgent:
        self._thread = threading.Thread(target=self._run, name="meshprof-capture", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread; a capture still tracing is stopped and written now (call it from
        the training thread: the script has ended)."""
        self._stop.set()
        self._wake.set()
        with self._lock:
            c = self._active
            if c is not None and c.state is CaptureState.TRACING:
                with contextlib.suppress(Exception):
                    self._finish_tracing(c, time.time_ns(), "the script ended first")
            elif c is not None:
                self._uninstall(c)
                self._active = None
        if self._thread is not None and threading.current_thread() is not self._thread:
            self._thread.join(timeout=10.0)
        self._write_pending()

    # -- the agent's thread ----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.look()
            except Exception:
                self.failures += 1
            self._wake.wait(self.poll_s)
            self._wake.clear()

    def look(self, now_ns: int | None = None) -> None:
        """One look: new requests, the active capture's timeout, traces to write."""
        now = time.time_ns() if now_ns is None else now_ns
        if self._changed():
            for req in self.gate.new_requests(scan_requests(self.run_dir), now):
                if isinstance(req, StacksRequest):
                    self._answer_stacks(req, now)
                else:
                    self._answer_capture(req, now)
        self._coordinate()
        self._check_timeout(now)
        self._write_pending()

    def _changed(self) -> bool:
        """The requests folder changed since the last listing (or it is time to list anyway)."""
        try:
            mtime = requests_dir(self.run_dir).stat().st_mtime_ns
        except OSError:
            return False
        mono = time.monotonic()
        if mtime != self._mtime or mono - self._listed >= RELIST_S:
            self._mtime, self._listed = mtime, mono
            return True
        return False

    def _rank(self) -> int:
        try:
            return int(self.host.rank())
        except Exception:
            return 0

    def _step(self) -> int:
        mon = self.host.monitor
        try:
            return int(mon.current_step) if mon is not None else -1
        except Exception:
            return -1

    def _answer_stacks(self, req: StacksRequest, now: int) -> None:
        rank = self._rank()
        if req.ranks and rank not in req.ranks:
            return
        if now > req.requested_ns + int(req.timeout_s * 1e9):
            return  # the asker has gone
        if not self.gate.stacks.allow():
            self.gate.refuse(
                request_name(req),
                f"rank {rank} answered {self.limits.stacks_per_hour} stacks requests in the "
                f"last hour, the job's limit: again in {self.gate.stacks.next_in_s():.0f} s",
            )
            return
        try:
            write_rank_stacks(self.run_dir, thread_stacks_now(rank, req.id, self._step()))
            self.stacks_answered += 1
        except Exception:
            self.failures += 1

    def _answer_capture(self, req: CaptureRequest, now: int) -> None:
        rank = self._rank()
        if rank not in req.ranks or now > req.deadline_ns:
            return
        c = _Capture(req, rank)
        why_not = self._refuse(req)
        if why_not is None:
            warm_up_profiler()
            with self._lock:
                why_not = self._refuse(req)
                if why_not is None:
                    self.gate.captures.allow()
                    c.monitor = self.host.monitor
                    c.activities, note = choose_activities(req.activities, self.limits.activities)
                    c.message = note
                    c.armed_step = int(c.monitor.current_step)
                    c.step_ns = median_recent_step(c.monitor)
                    c.armed_mono = time.monotonic()
                    if len(req.ranks) == 1:
                        c.start_at = c.armed_step + 1
                    self._active = c
                    c.monitor.boundary_hook = self.on_boundary
        if why_not is not None:
            c.state, c.message = why_not
        self._write_status(c)
        self._coordinate()

    def _refuse(self, req: CaptureRequest) -> tuple[CaptureState, str] | None:
        """Why this rank will not take ``req`` (None: it will)."""
        busy = self._active
        if busy is not None:
            return CaptureState.SKIPPED, f"busy with capture {busy.req.id}"
        budget = self.limits.budget(req)
        if captures_bytes(self.run_dir) >= budget:
            return CaptureState.SKIPPED, f"the captures' disk budget ({budget:,} bytes) is spent"
        if self.host.monitor is None or not hasattr(self.host.monitor, "boundary_hook"):
            return CaptureState.FAILED, "no step monitor: no step boundaries"
        if self.gate.captures.full():
            return CaptureState.SKIPPED, (
                f"{self.limits.max_per_hour} captures in the last hour, the job's limit: "
                f"again in {self.gate.captures.next_in_s():.0f} s"
            )
        return None

    def _coordinate(self) -> None:
        """An armed capture without a start step: agree on one once every asked rank has armed
        (see the module docstring)."""
        with self._lock:
            c = self._active
            if c is None or c.state is not CaptureState.ARMED or c.start_at is not None:
                return
        statuses = read_statuses(self.run_dir, c.req.id)
        armed = [st for st in statuses.values() if st.armed_step >= 0]
        answered = {st.rank for st in statuses.values() if st.armed_step >= 0 or st.state.final}
        note = ""
        if set(c.req.ranks) <= answered:
            slowest = max((st.step_ns for st in armed), default=0)
            lead = min(max(math.ceil(LEAD_S * 1e9 / max(slowest, 1_000_000)), 1), MAX_LEAD_STEPS)
            start = max(st.armed_step for st in armed) + 1 + lead
        elif time.monotonic() - c.armed_mono > COORD_WAIT_S:
            missing = sorted(set(c.req.ranks) - answered)
            start = self._step() + 1
            note = (
                f"rank(s) {', '.join(map(str, missing))} did not answer within "
                f"{COORD_WAIT_S:g} s: traced without them"
            )
        else:
            return
        with self._lock:
            if c is not self._active or c.start_at is not None:
                return
            c.start_at = start
            if note:
                c.message = "; ".join(x for x in (c.message, note) if x)
            status = self._status(c)
        self._write(status)

    def _check_timeout(self, now: int) -> None:
        with self._lock:
            c = self._active
            if c is None or now <= c.req.deadline_ns or c.timeout_said:
                return
            c.timeout_said = True
            if c.state is CaptureState.ARMED:
                self._uninstall(c)
                self._active = None
                c.state = CaptureState.TIMED_OUT
                c.message = (
                    f"did not reach step {c.start_at} within {c.req.timeout_s:g} s of the "
                    "request: the rank is stuck in a step (see where), or its steps are longer "
                    "than the timeout allows"
                    if c.start_at is not None
                    else f"no start step agreed within {c.req.timeout_s:g} s"
                )
            else:
                c.message = (
                    f"{len(c.steps)} of {c.req.steps} step(s) traced when the timeout "
                    f"({c.req.timeout_s:g} s) passed; the trace is written at the next step boundary"
                )
            status = self._status(c, CaptureState.TIMED_OUT)
        status = replace(status, where=thread_stacks_now(c.rank, c.req.id, self._step()))
        self._write(status)

    # -- the training thread ---------------------------------------------------------------------
    def on_boundary(self, step: int) -> None:
        """The step monitor's boundary hook (training thread): a step ``step`` opens."""
        try:
            with self._lock:
                c = self._active
                if c is None:
                    return
                now = time.time_ns()
                if c.state is CaptureState.ARMED:
                    if c.start_at is not None and step >= c.start_at:
                        self._start_tracing(c, step, now)
                elif c.state is CaptureState.TRACING:
                    self._next_boundary(c, step, now)
        except BaseException as e:  # never into training
            with contextlib.suppress(BaseException):
                self._abort(e)

    def _start_tracing(self, c: _Capture, step: int, now: int) -> None:
        import torch
        from torch.autograd.profiler import profile, record_function

        if torch.autograd._profiler_enabled():
            # a second start would take over the running session and break it at its stop
            raise RuntimeError(
                "torch.profiler is already running on this rank (the script's own, or "
                "@performance_monitor's): not started"
            )
        t0 = time.perf_counter_ns()
        c.cost = replace(c.cost, step_ns_before=median_recent_step(c.monitor))
        c.prof = profile(
            use_kineto=True,
            use_cpu="cpu" in c.activities,
            use_device="cuda" if "cuda" in c.activities else None,
            record_shapes=c.req.record_shapes,
            with_stack=c.req.with_stack,
        )
        c.prof.__enter__()
        add_distributed_info()
        c.annotation = record_function(f"ProfilerStep#{step}")
        c.annotation.__enter__()
        mark_instrumented(c.monitor, step)
        c.step_open = (step, time.time_ns())
        c.state = CaptureState.TRACING
        c.cost = replace(c.cost, start_ns=time.perf_counter_ns() - t0)
        self._pending_status(c)

    def _next_boundary(self, c: _Capture, step: int, now: int) -> None:
        t0 = time.perf_counter_ns()
        self._close_step(c, now)
        if len(c.steps) >= c.req.steps or now > c.req.deadline_ns:
            late = "" if len(c.steps) >= c.req.steps else "the timeout passed first"
            self._finish_tracing(c, now, late)
            return
        from torch.autograd.profiler import record_function

        c.annotation = record_function(f"ProfilerStep#{step}")
        c.annotation.__enter__()
        mark_instrumented(c.monitor, step)
        c.step_open = (step, now)
        c.cost = replace(c.cost, boundary_ns=c.cost.boundary_ns + time.perf_counter_ns() - t0)

    def _close_step(self, c: _Capture, now: int) -> None:
        if c.annotation is not None:
            c.annotation.__exit__(None, None, None)
            c.annotation = None
        if c.step_open is not None:
            c.steps.append(CapturedStep(c.step_open[0], c.step_open[1], now))
            c.step_open = None

    def _finish_tracing(self, c: _Capture, now: int, why_short: str) -> None:
        """Stop torch.profiler (lock held, training thread) and queue the trace for writing."""
        t0 = time.perf_counter_ns()
        self._close_step(c, now)
        self._uninstall(c)
        self._active = None
        try:
            c.prof.__exit__(None, None, None)
        finally:
            durs = [s.end_ns - s.start_ns for s in c.steps]
            c.cost = replace(
                c.cost,
                stop_ns=time.perf_counter_ns() - t0,
                step_ns_during=int(statistics.median(durs)) if durs else 0,
            )
            if why_short:
                c.message = "; ".join(
                    x
                    for x in (
                        c.message if not c.timeout_said else "",
                        f"{len(c.steps)} of {c.req.steps} step(s) traced: {why_short}",
                    )
                    if x
                )
            c.state = CaptureState.WRITING
            self._to_write.append(c)
            self._wake.set()

    def _abort(self, e: BaseException) -> None:
        with self._lock:
            c = self._active
            self._active = None
            if c is None:
                return
            self._uninstall(c)
            if c.annotation is not None:
                with contextlib.suppress(BaseException):
                    c.annotation.__exit__(None, None, None)
            if c.prof is not None:
                with contextlib.suppress(BaseException):
                    c.prof.__exit__(None, None, None)
            c.prof = None
            c.state, c.message = CaptureState.FAILED, f"{type(e).__name__}: {e}"
            self._to_write.append(c)
        self._wake.set()

    def _uninstall(self, c: _Capture) -> None:
        mon = c.monitor
        if mon is not None and getattr(mon, "boundary_hook", None) == self.on_boundary:
            mon.boundary_hook = None

    def _pending_status(self, c: _Capture) -> None:
        """A status the agent's thread writes (the training thread never writes files)."""
        self._to_write.append(c)
        self._wake.set()

    # -- writing (agent's thread, or stop()) -----------------------------------------------------
    def _write_pending(self) -> None:
        with self._lock:
            todo, self._to_write = self._to_write, []
        for c in todo:
            if c.state is CaptureState.WRITING:
                self._write_trace(c)
            else:
                self._write_status(c)

    def _write_trace(self, c: _Capture) -> None:
        t0 = time.perf_counter_ns()
        budget = self.limits.budget(c.req)
        try:
            got = write_trace(self.run_dir, c.req.id, c.rank, c.prof, budget)
            if not got.name:
                c.state = CaptureState.SKIPPED
                c.message = (
                    f"the trace ({got.size:,} bytes) would take the captures past their disk "
                    f"budget ({budget:,} bytes): not kept"
                )
                self._write_status(c)
                return
            c.cost = replace(c.cost, write_ns=time.perf_counter_ns() - t0)
            c.state = CaptureState.DONE
            self.captures_done += 1
            self._write_status(c, trace=got.name, trace_bytes=got.size)
        except Exception as e:
            c.state, c.message = CaptureState.FAILED, f"writing the trace: {type(e).__name__}: {e}"
            self._write_status(c)
        finally:
            c.prof = None  # the profiler's events go with it

    def _status(
        self, c: _Capture, state: CaptureState | None = None, **kw: Any
    ) -> CaptureRankStatus:
        return CaptureRankStatus(
            id=c.req.id,
            rank=c.rank,
            state=state or c.state,
            updated_ns=time.time_ns(),
            message=c.message,
            steps_asked=c.req.steps,
            armed_step=c.armed_step,
            step_ns=c.step_ns,
            start_step=-1 if c.start_at is None else c.start_at,
            steps=tuple(c.steps),
            phases=traced_phases(c.monitor, c.steps) if c.state is CaptureState.DONE else (),
            activities=c.activities,
            cost=c.cost,
            pid=os.getpid(),
            hostname=self._hostname,
            **kw,
        )

    def _write_status(self, c: _Capture, **kw: Any) -> None:
        self._write(self._status(c, **kw))

    def _write(self, status: CaptureRankStatus) -> None:
        try:
            write_status(self.run_dir, status)
        except Exception:
            self.failures += 1


def start_capture_agent(
    run_dir: str | os.PathLike[str], host: AgentHost, limits: CaptureLimits | None = None
) -> CaptureAgent:
    """Start the agent of this process (``.stop()`` ends it)."""
    return CaptureAgent(run_dir, host, limits=limits).start()


__all__ = ["POLL_S", "AgentHost", "CaptureAgent", "start_capture_agent", "thread_stacks_now"]

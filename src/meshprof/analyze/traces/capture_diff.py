"""What differs between the ranks of one capture: the ops (and, on CUDA, the kernels) whose time
per step differs most between the culprit and its peer, per step phase, with each rank's
Kineto breakdown (:func:`~meshprof.analyze.traces.kineto.kineto_report`).

Definitions, for one rank's trace (a torch.profiler trace of the captured steps):

* **steps** — the ``ProfilerStep#N`` annotations the capture agent puts around each traced step
  (meshprof's step boundaries); a trace without them is one window of the captured steps.
* **self time** of a CPU op — its duration less the time of the events nested in it on its
  thread (ops, annotations), as torch.profiler's ``self_cpu_time_total`` counts it; a kernel's
  time is its duration on the device. Per step: the sum over the trace divided by its steps.
* **phase** of an op — the step monitor's phase that contains it when the script marks phases
  (``with monitor.phase(...)``); else from the trace: ``optimizer`` inside an ``Optimizer.*``
  annotation, ``backward`` inside an ``autograd::engine::evaluate_function``, ``data`` inside a
  ``DataLoader`` annotation, otherwise ``forward`` before the step's first backward op and
  ``after backward`` once the step's backward is over. A kernel has the phase of the CPU call
  that launched it.
* **communication** (ops and kernels named as collectives, :func:`is_comm_name`, and NCCL
  kernels) is left out of the differences: a rank waiting in a collective for a slow peer shows
  the peer's slowness as its own communication time, the breakdown's ``comm`` says how much.
* **difference** — for the first rank of the request (the culprit, *a*) and each other rank
  (*b*): ``delta_ns`` = *a*'s self time per step − *b*'s, for each (op or kernel, phase) either
  rank has; largest \\|delta\\| first.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshprof.analyze.traces.kineto import KinetoBreakdown, is_comm_name, kineto_report, load_trace
from meshprof.analyze.traces.kineto_load import DEVICE_CATS, KernelClass, kernel_class
from meshprof.errors import MeshprofError
from meshprof.records.captures import CaptureCost, CapturedPhase, CaptureState, OpDifference
from meshprof.rundir.captures import LoadedCapture

#: Differences kept per pair of ranks.
MAX_DIFFERENCES = 20
#: Ops listed per rank (:attr:`CaptureRank.top`).
MAX_TOP = 10

_HOST_CATS = frozenset({"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver"})
_STEP_PREFIX = "ProfilerStep#"
_BACKWARD = "autograd::engine::evaluate_function"
_OPTIMIZER = "Optimizer."
_DATA = "enumerate(DataLoader)"
_FORWARD, _BWD, _AFTER, _OPT, _DATA_PHASE = (
    "forward",
    "backward",
    "after backward",
    "optimizer",
    "data",
)


@dataclass(frozen=True, slots=True)
class OpTime:
    """One op (or kernel) in one phase on one rank, per traced step."""

    name: str
    """The op's name (``aten::mm``) or the kernel's."""
    kind: str
    """``"op"`` (CPU) or ``"kernel"`` (device)."""
    phase: str
    """Its phase (see the module docstring)."""
    ns: int
    """Self time per step, ns."""
    calls: float
    """Calls per step."""


@dataclass(frozen=True, slots=True)
class PhaseDifference:
    """The ops' self time (communication left out) of one phase, per step, on two ranks."""

    phase: str
    """The phase."""
    a_rank: int
    """The culprit."""
    b_rank: int
    """Its peer."""
    a_ns: int
    """Per step on ``a_rank``, ns."""
    b_ns: int
    """On ``b_rank``."""
    delta_ns: int
    """``a_ns`` − ``b_ns``."""


@dataclass(frozen=True, slots=True)
class RankOps:
    """One rank's trace reduced to self time per (op, phase) and step."""

    rank: int
    """Global rank."""
    steps: int
    """Steps in the trace (``ProfilerStep#N`` windows; the capture's step count without them)."""
    step_ns: int
    """Median duration of those steps, ns (0 without annotations)."""
    ops: tuple[OpTime, ...]
    """Every (op, phase) but communication, largest self time first."""
    comm_ns: int
    """Self time per step of the communication ops and kernels, ns."""


@dataclass(frozen=True, slots=True)
class CaptureRank:
    """One rank's part of a capture, as the comparison shows it."""

    rank: int
    """Global rank."""
    state: CaptureState
    """Its status (``done`` when its trace is written)."""
    message: str
    """Why it is not done, or notes."""
    steps: int
    """Steps traced."""
    first_step: int
    """The first traced step's number (-1: none)."""
    trace: str
    """The trace file ("" when none)."""
    trace_bytes: int
    """Its size."""
    cost: CaptureCost
    """What the capture cost the rank."""
    where: str
    """Where its main thread was when it timed out ("" when it did not)."""
    step_ns: int = 0
    """Median traced step, ns (from the trace)."""
    top: tuple[OpTime, ...] = ()
    """Its ops with the most self time per step (communication left out)."""


@dataclass(frozen=True, slots=True)
class CaptureComparison:
    """One capture, analysed."""

    id: str
    """The capture's id."""
    trigger: str
    """``demand`` or the alert's kind."""
    ranks: tuple[int, ...]
    """The ranks asked, the culprit first."""
    steps: int
    """Steps asked per rank."""
    requested_ns: int
    """When it was asked."""
    reason: str
    """Why these ranks."""
    state: str
    """``complete`` (every rank traced), ``partial`` (some did) or ``empty`` (none did)."""
    rank_results: tuple[CaptureRank, ...]
    """Each asked rank's part, in the order asked."""
    differences: tuple[OpDifference, ...]
    """The ops whose time per step differs most, largest \\|delta\\| first (per pair of ranks: the
    culprit with each other rank traced)."""
    phases: tuple[PhaseDifference, ...]
    """Per phase, the ops' time per step on the culprit and each other rank."""
    breakdown: tuple[KinetoBreakdown, ...]
    """Each traced rank's Kineto breakdown (idle, compute, communication, overlap on GPU traces;
    the host split on CPU-only ones)."""
    path: str
    """The capture's folder."""
    problems: tuple[str, ...] = ()
    """What could not be read."""

    @property
    def message(self) -> str:
        """The capture in one line."""
        traced = [r for r in self.rank_results if r.trace]
        if not traced:
            why = "; ".join(f"rank {r.rank}: {r.message or r.state}" for r in self.rank_results)
            return f"capture {self.id}: nothing traced ({why})"
        if self.differences:
            d = self.differences[0]
            return (
                f"capture {self.id}: rank {d.a_rank} vs rank {d.b_rank}: {d.name} ({d.phase}) "
                f"{_signed_ms(d.delta_ns)} per step"
            )
        return f"capture {self.id}: {len(traced)} rank(s) traced, nothing to compare"


def _signed_ms(ns: int) -> str:
    return f"{'+' if ns >= 0 else '−'}{abs(ns) / 1e6:.2f} ms"


@dataclass(slots=True)
class _Node:
    start: int
    end: int
    name: str
    cat: str
    child_ns: int = 0
    flags: str = ""  # "o" optimizer, "b" backward, "d" data (inherited from ancestors)


@dataclass(slots=True)
class _Parsed:
    """What :func:`rank_ops` reads of a trace (times in ns of the trace's wall clock)."""

    host: list[_Node]
    """Every host event but the step annotations, nested per thread."""
    steps: list[tuple[int, int]]
    """The ``ProfilerStep#N`` windows, sorted."""
    launches: dict[int, tuple[int, str]]
    """Correlation id -> (start, flags) of the runtime call that launched a device event."""
    device: list[tuple[int, int, str, int]]
    """Device events: (start, end, name, correlation id)."""


def _events(data: dict[str, Any]) -> _Parsed:
    """One pass over the trace's complete events (see :class:`_Parsed`)."""
    base = int(data.get("baseTimeNanoseconds", 0) or 0)
    threads: dict[Any, list[_Node]] = {}
    steps: list[tuple[int, int]] = []
    device: list[tuple[int, int, str, int]] = []
    launches: dict[int, _Node] = {}
    for e in data.get("traceEvents", []):
        if type(e) is not dict or e.get("ph") != "X":
            continue
        cat = e.get("cat")
        try:
            s = base + round(float(e["ts"]) * 1000.0)
            d = max(round(float(e.get("dur", 0.0)) * 1000.0), 0)
        except (KeyError, TypeError, ValueError):
            continue
        name = str(e.get("name", ""))
        if cat in DEVICE_CATS:
            args = e.get("args") or {}
            corr = args.get("correlation", -1)
            device.append((s, s + d, name, corr if type(corr) is int else -1))
            continue
        if cat not in _HOST_CATS:
            continue
        if cat == "user_annotation" and name.startswith(_STEP_PREFIX):
            steps.append((s, s + d))
            continue
        node = _Node(s, s + d, name, str(cat))
        threads.setdefault((e.get("pid"), e.get("tid")), []).append(node)
        if cat in ("cuda_runtime", "cuda_driver"):
            corr = (e.get("args") or {}).get("correlation")
            if type(corr) is int:
                launches[corr] = node
    every: list[_Node] = []
    for nodes in threads.values():
        nodes.sort(key=lambda n: (n.start, -n.end))
        _nest(nodes)
        every += nodes
    steps.sort()
    return _Parsed(every, steps, {k: (v.start, v.flags) for k, v in launches.items()}, device)


def _nest(nodes: list[_Node]) -> None:
    """Children's time and inherited flags of one thread's events (sorted by start, longest
    first). An event that starts inside another is its child (clipped to the parent's end)."""
    stack: list[_Node] = []
    for n in nodes:
        while stack and n.start >= stack[-1].end:
            stack.pop()
        own = (
            "o"
            if n.name.startswith(_OPTIMIZER)
            else "b"
            if n.name.startswith(_BACKWARD)
            else "d"
            if n.name.startswith(_DATA)
            else ""
        )
        if stack:
            parent = stack[-1]
            parent.child_ns += max(min(n.end, parent.end) - n.start, 0)
            n.flags = parent.flags + own
        else:
            n.flags = own
        stack.append(n)


def _phase_of_flags(flags: str) -> str:
    """The phase the innermost marked ancestor says ("" when none does)."""
    for f in reversed(flags):
        if f == "o":
            return _OPT
        if f == "b":
            return _BWD
        if f == "d":
            return _DATA_PHASE
    return ""


def rank_ops(
    data: dict[str, Any],
    rank: int,
    steps_hint: int = 1,
    monitor_phases: Sequence[CapturedPhase] = (),
) -> RankOps:
    """One trace (loaded JSON) reduced to self time per (op or kernel, phase) and step."""
    parsed = _events(data)
    every, windows, launches, device = parsed.host, parsed.steps, parsed.launches, parsed.device
    if not windows:
        lo = min((n.start for n in every), default=0)
        hi = max((n.end for n in every), default=0)
        windows = [(lo, hi)]
        n_steps = max(steps_hint, 1)
        step_ns = 0
    else:
        n_steps = len(windows)
        durs = sorted(e - s for s, e in windows)
        step_ns = durs[len(durs) // 2]
    starts = [s for s, _ in windows]
    mon = sorted(monitor_phases, key=lambda p: p.start_ns)
    mon_starts = [p.start_ns for p in mon]

    def step_of(t: int) -> int:
        i = bisect.bisect_right(starts, t) - 1
        return i if i >= 0 and t < windows[i][1] else -1

    # each step's backward: from its first backward event to its last one's end
    bwd: dict[int, tuple[int, int]] = {}
    for n in every:
        if "b" in n.flags:
            st = step_of(n.start)
            if st >= 0:
                lo, hi = bwd.get(st, (n.start, n.end))
                bwd[st] = (min(lo, n.start), max(hi, n.end))

    def phase_of(t: int, flags: str) -> str:
        if mon:
            i = bisect.bisect_right(mon_starts, t) - 1
            while i >= 0:  # innermost (latest-starting) phase that contains t
                if mon[i].start_ns <= t < mon[i].end_ns:
                    return mon[i].name
                i -= 1
            # outside every marked phase: the trace decides
        p = _phase_of_flags(flags)
        if p:
            return p
        st = step_of(t)
        b = bwd.get(st)
        if b is None or t < b[0]:
            return _FORWARD
        return _BWD if t < b[1] else _AFTER

    totals: dict[tuple[str, str, str], list[int]] = {}
    comm = 0
    for n in every:
        if n.cat != "cpu_op" or step_of(n.start) < 0:
            continue
        self_ns = max(n.end - n.start - n.child_ns, 0)
        if is_comm_name(n.name):
            comm += self_ns
            continue
        key = ("op", phase_of(n.start, n.flags), n.name)
        acc = totals.setdefault(key, [0, 0])
        acc[0] += self_ns
        acc[1] += 1
    for s, e, name, corr in device:
        launch = launches.get(corr)
        t, flags = launch if launch is not None else (s, "")
        if step_of(t) < 0:
            continue
        if kernel_class(name) is KernelClass.COMMUNICATION or is_comm_name(name):
            comm += e - s
            continue
        key = ("kernel", phase_of(t, flags), name)
        acc = totals.setdefault(key, [0, 0])
        acc[0] += e - s
        acc[1] += 1
    ops = tuple(
        sorted(
            (
                OpTime(name, kind, phase, ns // n_steps, calls / n_steps)
                for (kind, phase, name), (ns, calls) in totals.items()
            ),
            key=lambda o: (-o.ns, o.name),
        )
    )
    return RankOps(rank, n_steps, step_ns, ops, comm // n_steps)


def differences(a: RankOps, b: RankOps, limit: int = MAX_DIFFERENCES) -> tuple[OpDifference, ...]:
    """``a``'s ops against ``b``'s, largest \\|delta\\| first (ties by name); ``limit`` kept."""
    av = {(o.kind, o.phase, o.name): o for o in a.ops}
    bv = {(o.kind, o.phase, o.name): o for o in b.ops}
    out = []
    for key in av.keys() | bv.keys():
        x, y = av.get(key), bv.get(key)
        a_ns, b_ns = (x.ns if x else 0), (y.ns if y else 0)
        if a_ns == b_ns:
            continue
        out.append(
            OpDifference(
                name=key[2],
                phase=key[1],
                a_rank=a.rank,
                b_rank=b.rank,
                a_ns=a_ns,
                b_ns=b_ns,
                delta_ns=a_ns - b_ns,
                kind=key[0],
                a_calls=x.calls if x else 0.0,
                b_calls=y.calls if y else 0.0,
            )
        )
    out.sort(key=lambda d: (-abs(d.delta_ns), d.name, d.phase))
    return tuple(out[:limit])


def phase_differences(a: RankOps, b: RankOps) -> tuple[PhaseDifference, ...]:
    """Per phase, the ops' time per step on ``a`` and ``b``, largest \\|delta\\| first."""
    pa: dict[str, int] = {}
    pb: dict[str, int] = {}
    for o in a.ops:
        pa[o.phase] = pa.get(o.phase, 0) + o.ns
    for o in b.ops:
        pb[o.phase] = pb.get(o.phase, 0) + o.ns
    rows = [
        PhaseDifference(p, a.rank, b.rank, pa.get(p, 0), pb.get(p, 0), pa.get(p, 0) - pb.get(p, 0))
        for p in pa.keys() | pb.keys()
    ]
    return tuple(sorted(rows, key=lambda r: (-abs(r.delta_ns), r.phase)))


def _where(status: Any) -> str:
    """The main thread's innermost frames of a timed-out rank, outermost last."""
    where = status.where
    main = where.main if where is not None else None
    if main is None or not main.frames:
        return ""
    return " ← ".join(f"{f.function} ({Path(f.file).name}:{f.line})" for f in main.frames[::-1][:3])


def compare_capture(cap: LoadedCapture, limit: int = MAX_DIFFERENCES) -> CaptureComparison:
    """Analyse one capture's folder (see the module docstring). A trace that cannot be read is
    named in ``problems``; the rest is analysed."""
    req = cap.request
    asked = tuple(req.ranks) if req is not None else tuple(sorted(cap.statuses))
    problems = list(cap.problems)
    reduced: dict[int, RankOps] = {}
    for r, path in sorted(cap.traces.items()):
        done = cap.statuses[r]
        try:
            reduced[r] = rank_ops(load_trace(path), r, len(done.steps), done.phases)
        except MeshprofError as e:
            problems.append(str(e))
        except Exception as e:  # a damaged trace is named, never fatal
            problems.append(f"{path}: {type(e).__name__}: {e}")
    results = []
    for r in asked:
        st = cap.statuses.get(r)
        ops = reduced.get(r)
        if st is None:
            results.append(
                CaptureRank(
                    r,
                    CaptureState.TIMED_OUT,
                    "no answer (the rank did not see the "
                    "request: dead, stopped, stuck holding the GIL, or run with --no-capture)",
                    0,
                    -1,
                    "",
                    0,
                    CaptureCost(),
                    "",
                )
            )
            continue
        results.append(
            CaptureRank(
                rank=r,
                state=st.state,
                message=st.message,
                steps=len(st.steps),
                first_step=st.steps[0].step if st.steps else -1,
                trace=st.trace if r in reduced else "",
                trace_bytes=st.trace_bytes,
                cost=st.cost,
                where=_where(st),
                step_ns=ops.step_ns if ops else 0,
                top=ops.ops[:MAX_TOP] if ops else (),
            )
        )
    diffs: list[OpDifference] = []
    phases: list[PhaseDifference] = []
    culprit = reduced.get(asked[0]) if asked else None
    if culprit is not None:
        for r in asked[1:]:
            if r in reduced:
                diffs += differences(culprit, reduced[r], limit)
                phases += phase_differences(culprit, reduced[r])
    diffs.sort(key=lambda d: (-abs(d.delta_ns), d.b_rank, d.name))
    breakdown: tuple[KinetoBreakdown, ...] = ()
    if cap.traces:
        try:
            k = kineto_report([cap.traces[r] for r in sorted(reduced)])
            breakdown = k.ranks
            problems += k.problems
        except Exception as e:
            problems.append(f"Kineto breakdown: {type(e).__name__}: {e}")
    traced = sum(1 for r in asked if r in reduced)
    state = "empty" if traced == 0 else "complete" if traced == len(asked) else "partial"
    return CaptureComparison(
        id=cap.id,
        trigger=req.trigger if req is not None else "",
        ranks=asked,
        steps=req.steps if req is not None else 0,
        requested_ns=req.requested_ns if req is not None else 0,
        reason=req.reason if req is not None else "",
        state=state,
        rank_results=tuple(results),
        differences=tuple(diffs[: limit * max(len(asked) - 1, 1)]),
        phases=tuple(phases),
        breakdown=breakdown,
        path=str(cap.path),
        problems=tuple(problems),
    )


__all__ = [
    "MAX_DIFFERENCES",
    "CaptureComparison",
    "CaptureRank",
    "OpDifference",
    "OpTime",
    "PhaseDifference",
    "RankOps",
    "compare_capture",
    "differences",
    "phase_differences",
    "rank_ops",
]

"""``StepMonitor``: time steps and phases on one rank and sample memory (analysis on request).

Recording is cheap (a tuple per span, a clock read and a thread-CPU-time read at each boundary)
and never raises into training: errors inside the monitor are counted and warned about once.
"""

from __future__ import annotations

import functools
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import numpy as np

from meshprof.config import BottleneckThresholds
from meshprof.events import EVENT_DTYPE, MEMORY_DTYPE, SPAN_DTYPE, SPAN_KINDS, STATUS_CODES
from meshprof.layout import Layout
from meshprof.monitor.flop_counter import count_flops, detect_peak_tflops
from meshprof.monitor.memory_sampler import sample_memory
from meshprof.monitor.memory_sampler import warm as warm_memory_sampler
from meshprof.records.rank_meta import GroupRecord

F = TypeVar("F", bound=Callable[..., Any])
_STEP = SPAN_KINDS.index("step")
_PHASE = SPAN_KINDS.index("phase")
_OK = STATUS_CODES["ok"]
_ERR = STATUS_CODES["error"]

_active: StepMonitor | None = None


MAX_INSTRUMENTED = 10_000
"""Instrumented step numbers a monitor keeps (the newest)."""


def get_monitor() -> StepMonitor | None:
    """The most recently created StepMonitor of this process (used by automatic hooks)."""
    return _active


def forget_active() -> None:
    """No monitor is active any more (``meshprof.reset()``; a new StepMonitor becomes active)."""
    global _active
    _active = None


class _Span:
    """Context manager and decorator for one step or phase."""

    __slots__ = ("cpu0", "depth", "kind", "mon", "name", "samples", "step", "t0", "tokens")

    def __init__(
        self, mon: StepMonitor, kind: int, name: str, tokens: int = 0, samples: int = 0
    ) -> None:
        self.mon = mon
        self.kind = kind
        self.name = name
        self.tokens = tokens
        self.samples = samples
        self.step = -1
        self.depth = 0
        self.t0 = 0
        self.cpu0 = 0

    def __enter__(self) -> _Span:
        try:
            self.mon._open(self)
        except Exception as e:
            self.mon._internal_error(e)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self.mon._close(self, exc is not None)
        except Exception as e:
            self.mon._internal_error(e)

    def __call__(self, fn: F) -> F:
        mon, kind, name, tokens, samples = self.mon, self.kind, self.name, self.tokens, self.samples

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with _Span(mon, kind, name, tokens, samples):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


class StepMonitor:
    """Per-rank step and phase monitor.

    ``with mon.step(tokens=..., samples=...)`` around a training step, ``with mon.phase(name)``
    around its parts ("data", "forward", "backward", "optimizer", or any name; both also work as
    decorators). Memory is sampled at the end of every step. Collectives recorded by the
    :class:`~meshprof.CommProfiler` (``profiler``, default: the global one) are attributed to the
    parallel dimension of their process group from ``mapping`` (a ParallelConfig, RankMapping,
    :class:`Layout`, dict or "dp=2,tp=1,pp=2"). Works in a single process without a process group.
    """

    def __init__(
        self,
        mapping: Any = None,
        *,
        profiler: Any = None,
        rank: int | None = None,
        flops_per_step: float | None = None,
        peak_tflops: float | None = None,
        thresholds: BottleneckThresholds | None = None,
        schedule: str = "",
        microbatches: int = 0,
        virtual_stages: int = 1,
        warmup_steps: int = 0,
        device: int | None = None,
        max_spans: int = 1_000_000,
        track_pipeline: bool = True,
        sample_memory_every_step: bool = True,
    ) -> None:
        global _active
        self.layout = Layout.from_any(mapping)
        self.mapping = mapping
        cfg = getattr(mapping, "config", mapping)
        self.schedule = schedule or str(getattr(cfg, "schedule", "") or "")
        self.microbatches = microbatches or int(
            getattr(cfg, "num_microbatches", 0) or getattr(cfg, "microbatches", 0) or 0
        )
        self.virtual_stages = (
            virtual_stages if virtual_stages != 1 else int(getattr(cfg, "virtual_stages", 1) or 1)
        )
        self._profiler = profiler
        self._rank = rank
        self.flops_per_step = flops_per_step
        self.peak_tflops = peak_tflops if peak_tflops is not None else detect_peak_tflops()
        self.thresholds = thresholds or BottleneckThresholds()
        self.warmup_steps = warmup_steps
        self.device = device
        self.sample_memory = sample_memory_every_step
        if sample_memory_every_step:
            warm_memory_sampler()  # (the first step's end would pay for it)
        self._spans: deque[tuple[Any, ...]] = deque(maxlen=max_spans)
        self._memory: deque[tuple[int, ...]] = deque(maxlen=max_spans)
        self._names: list[str] = []
        self._name_index: dict[str, int] = {}
        self._tls = threading.local()
        self._step_no = 0
        self._implicit: _Span | None = None
        self.internal_errors = 0
        self.user_marks = 0
        """Calls of :func:`meshprof.mark_step` (the user marks steps: automatic detection stops)."""
        self.instrumented_steps: deque[int] = deque(maxlen=MAX_INSTRUMENTED)
        """Steps meshprof itself slowed (``@performance_monitor``'s FLOP-counter, memory-snapshot
        and torch.profiler steps, a capture's traced steps): the step analysis leaves them out,
        as it does warm-up (:meth:`mark_instrumented`)."""
        self.boundary_hook: Callable[[int], None] | None = None
        """Called on the training thread with the step's number as each step opens, before its
        clock starts (a capture agent sets it only while a capture is pending: otherwise each
        step boundary costs one attribute check)."""
        self.step_name = "step"
        """The name of the steps opened without one (automatic forward steps included): a
        serving integration sets "prefill" or "decode" before the forward it knows the kind of
        (:mod:`meshprof.monitor.hf_generate`)."""
        self._wall_offset = time.time_ns() - time.perf_counter_ns()
        _active = self
        if track_pipeline:
            from meshprof.monitor.pipeline_hooks import install_pipeline_hooks

            install_pipeline_hooks(get_monitor)

    # -- recording ----------------------------------------------------------------------------
    def step(self, tokens: int = 0, samples: int = 0, name: str | None = None) -> _Span:
        """Context manager / decorator timing one training step (or one serving forward:
        ``name`` "prefill", "decode" or "mixed" says which, see
        :data:`meshprof.events.STEP_KINDS`; default :attr:`step_name`)."""
        return _Span(self, _STEP, name or self.step_name, tokens, samples)

    def phase(self, name: str) -> _Span:
        """Context manager / decorator timing a phase inside the current step."""
        return _Span(self, _PHASE, name)

    def mark_step(self, tokens: int = 0, samples: int = 0) -> None:
        """End the current implicit step now and start the next one (automatic step detection:
        called after every optimizer step by ``meshprof run``). Ignored inside ``with step()``."""
        try:
            if self._stack():
                top = self._stack()[0]
                if top is not self._implicit:
                    return
            if self._implicit is not None:
                self._implicit.tokens += tokens
                self._implicit.samples += samples
                self._close(self._implicit, False)
            self._implicit = _Span(self, _STEP, "step")
            self._open(self._implicit)
        except Exception as e:
            self._internal_error(e)

    def discard_implicit_step(self) -> None:
        """Drop the implicit step in progress without recording it (automatic step detection
        changing its mind: the step opened at the first forward of a script that turns out to
        make each forward a step)."""
        try:
            span = self._implicit
            if span is None:
                return
            self._implicit = None
            stack = self._stack()
            if span in stack:
                while stack and stack[-1] is not span:
                    stack.pop()
                stack.pop()
            self._step_no = span.step
        except Exception as e:
            self._internal_error(e)

    def add_step(self, start_perf_ns: int, end_perf_ns: int, cpu_ns: int = 0) -> None:
        """Record a step that already happened (``time.perf_counter_ns()`` bounds) as the next
        step; no memory sample (automatic step detection's provisional forwards)."""
        try:
            self._spans.append(
                (
                    _STEP,
                    _OK,
                    0,
                    self._name("step"),
                    self._step_no,
                    start_perf_ns + self._wall_offset,
                    max(end_perf_ns - start_perf_ns, 0),
                    0,
                    0,
                    cpu_ns,
                )
            )
            self._step_no += 1
        except Exception as e:
            self._internal_error(e)

    def _stack(self) -> list[_Span]:
        s = getattr(self._tls, "stack", None)
        if s is None:
            s = self._tls.stack = []
        return s

    def _name(self, name: str) -> int:
        i = self._name_index.get(name)
        if i is None:
            i = self._name_index[name] = len(self._names)
            self._names.append(name)
        return i

    @property
    def in_step(self) -> bool:
        """A step or phase is open on this thread (explicit or implicit)."""
        return bool(self._stack())

    @property
    def current_step(self) -> int:
        """Number of the step in progress (or of the next one)."""
        return self._step_no

    def _prof(self) -> Any:
        if self._profiler is not None:
            return self._profiler
        from meshprof.comm.active import get_profiler

        return get_profiler()

    def _open(self, span: _Span) -> None:
        stack = self._stack()
        if span.kind == _STEP:
            if stack and stack[0] is self._implicit and span is not self._implicit:
                # an explicit step replaces automatic detection
                self._close(self._implicit, False)
                self._implicit = None
                stack = self._stack()
            span.step = self._step_no
            prof = self._prof()
            if prof is not None:
                prof.step = span.step
            hook = self.boundary_hook
            if hook is not None:
                hook(span.step)
        else:
            span.step = stack[0].step if stack else -1
        span.depth = len(stack)
        stack.append(span)
        span.cpu0 = time.thread_time_ns()
        span.t0 = time.perf_counter_ns()

    def _close(self, span: _Span, error: bool) -> None:
        t1 = time.perf_counter_ns()
        cpu1 = time.thread_time_ns()
        stack = self._stack()
        if span in stack:
            while stack and stack[-1] is not span:
                stack.pop()
            stack.pop()
        self._spans.append(
            (
                span.kind,
                _ERR if error else _OK,
                span.depth,
                self._name(span.name),
                span.step,
                span.t0 + self._wall_offset,
                t1 - span.t0,
                span.tokens,
                span.samples,
                cpu1 - span.cpu0,
            )
        )
        if span.kind == _STEP:
            if self.sample_memory:
                self._memory.append(sample_memory(span.step, self.device))
            self._step_no = span.step + 1
            if span is self._implicit:
                self._implicit = None

    def _internal_error(self, e: BaseException) -> None:
        self.internal_errors += 1
        if self.internal_errors == 1:
            warnings.warn(
                f"meshprof monitor: internal error, monitoring continues: {type(e).__name__}: {e}",
                RuntimeWarning,
                stacklevel=3,
            )

    def count_flops(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` once under FlopCounterMode, keep its FLOPs as the FLOPs per step, and
        return its result (use it for one representative training step)."""
        flops, out = count_flops(fn, *args, **kwargs)
        self.flops_per_step = float(flops)
        return out

    # -- data ---------------------------------------------------------------------------------
    def spans_array(self) -> tuple[np.ndarray, list[str]]:
        """(SPAN_DTYPE array of the closed spans, span-name table)."""
        rows = list(self._spans)
        arr = np.array(rows, dtype=SPAN_DTYPE) if rows else np.zeros(0, dtype=SPAN_DTYPE)
        return arr, list(self._names)

    @property
    def span_rows(self) -> deque[tuple[Any, ...]]:
        """The closed spans as tuples in SPAN_DTYPE field order, oldest first (bounded: the
        oldest go first). Read it, never change it: the crash-safe store copies new rows."""
        return self._spans

    @property
    def memory_rows(self) -> deque[tuple[int, ...]]:
        """The memory samples as tuples in MEMORY_DTYPE field order (read-only, like
        :attr:`span_rows`)."""
        return self._memory

    @property
    def span_names(self) -> list[str]:
        """The span-name table (SPAN_DTYPE ``name`` codes index it)."""
        return self._names

    def memory_array(self) -> np.ndarray:
        rows = list(self._memory)
        return np.array(rows, dtype=MEMORY_DTYPE) if rows else np.zeros(0, dtype=MEMORY_DTYPE)

    def mark_instrumented(self, step: int) -> None:
        """Step ``step`` runs under meshprof's own instrumentation (a FLOP counter, a profiler
        trace): its time says nothing of the job, so the step analysis leaves it out."""
        self.instrumented_steps.append(int(step))

    def to_meta(self) -> dict[str, Any]:
        """Monitor settings for a rank file's meta."""
        lay = self.layout
        return {
            "layout": {"dp": lay.dp, "tp": lay.tp, "pp": lay.pp} if lay else None,
            "schedule": self.schedule,
            "microbatches": self.microbatches,
            "virtual_stages": self.virtual_stages,
            "flops_per_step": self.flops_per_step,
            "peak_tflops": self.peak_tflops,
            "warmup_steps": self.warmup_steps,
            "instrumented_steps": sorted(set(self.instrumented_steps)) or None,
            "thresholds": self.thresholds.to_dict(),
            "span_names": list(self._names),
            "monitor_internal_errors": self.internal_errors,
        }

    def keep_rows(self, n: int) -> None:
        """Keep at most the ``n`` newest spans and memory samples in memory from now on (a
        rank writer appends them to disk as they come, so the in-memory copy need not hold
        the whole run)."""
        self._spans = deque(self._spans, maxlen=max(int(n), 1))
        self._memory = deque(self._memory, maxlen=max(int(n), 1))

    def reset(self) -> None:
        """Forget every span and memory sample (step numbers keep counting)."""
        self._spans.clear()
        self._memory.clear()

    def close(self) -> None:
        """Close an open automatic step."""
        if self._implicit is not None:
            self._close(self._implicit, False)
            self._implicit = None

    def recorded(self) -> RecordedSteps:
        """What this monitor and the active recorder hold, as the step analysis takes it
        (``meshprof.StepMonitor.analysis()`` analyzes it like the report analyzes a rank file)."""
        spans, names = self.spans_array()
        prof = self._prof()
        if prof is not None:
            events, _ = prof.columns()
            mesh = getattr(prof, "mesh_names", None)
            mesh_dims = mesh.names() if mesh is not None else {}
            groups = [
                GroupRecord(
                    name=g.name,
                    desc=g.desc,
                    ranks=g.ranks,
                    backend=g.backend,
                    mesh_dims=mesh_dims.get(g.name),
                )
                for g in prof.log.groups
            ]
            rank = max(prof.rank, 0) if self._rank is None else self._rank
        else:
            events, groups, rank = np.zeros(0, dtype=EVENT_DTYPE), [], self._rank or 0
        return RecordedSteps(spans, names, events, groups, self.memory_array(), rank)


class RecordedSteps(NamedTuple):
    """A monitor's spans and memory samples with the recorder's events (the columns of
    :mod:`meshprof.events`)."""

    spans: np.ndarray
    """SPAN_DTYPE rows."""
    span_names: list[str]
    """Names of the spans' ``name`` codes."""
    events: np.ndarray
    """EVENT_DTYPE rows of the active recorder (empty without one)."""
    groups: list[GroupRecord]
    """The recorder's process groups, indexed by the events' ``group`` code (with the job's
    DeviceMesh names of each)."""
    memory: np.ndarray
    """MEMORY_DTYPE rows."""
    rank: int
    """Global rank."""

"""``@performance_monitor``: one decorator on a training step for everything at once.

    monitor = meshprof.performance_monitor(model, out_dir="runs/x", wait=1, warmup=1, active=2,
                                           flop_counter_step=3, comm_logger_step=4)

    @monitor
    def train_step(batch): ...

Every call of the step is one step of the :class:`~meshprof.monitor.StepMonitor` (steps are
numbered from the monitor's current step, 0 for a fresh one); the collective recorder is enabled.
The work is done by small parts, each with a before/after-step hook (:class:`Part`): torch.profiler
on its schedule (:mod:`.schedule`), the FLOP counter (:mod:`.flops`), the communication log
(:mod:`.commlog`), the CUDA memory snapshot (:mod:`.memsnap`), NVTX ranges (:mod:`.nvtx`) and
TensorBoard / W&B scalars (:mod:`.loggers`). This module builds them, calls them around each step,
and writes this rank's ``rankNNNNN.npz`` (so ``meshprof report out_dir`` works). Rank r > 0 writes
its per-step files with a ``_rank{r}`` suffix.

Nothing here raises into the training step: a failing part warns once and is switched off. The
step's return value and exceptions pass through unchanged. ``enabled=False`` returns the step
function itself.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from meshprof.config import PerfmonConfig
from meshprof.perfmon.commlog import CommLogPart
from meshprof.perfmon.context import (
    Part,
    PerfmonContext,
    StepState,
    cuda_available,
    record_failure,
)
from meshprof.perfmon.flop_log import FlopCounterPart
from meshprof.perfmon.loggers import LoggerContainer, StepScalarsPart
from meshprof.perfmon.memsnap import MemorySnapshotPart
from meshprof.perfmon.nvtx import NvtxPart
from meshprof.perfmon.schedule import ProfilerSchedulePart
from meshprof.process import rank_and_world

if TYPE_CHECKING:
    from meshprof.session.recording import RecordingSession

F = TypeVar("F", bound=Callable[..., Any])
#: Session parts under the names this monitor has always reported them in ``failures``.
SESSION_PARTS = {"rank writer": "rank file", "recorder": "monitor", "step monitor": "monitor"}


class _Off:
    """What ``performance_monitor(enabled=False)`` returns: decorating gives the function back."""

    enabled = False

    def __call__(self, fn: F) -> F:
        return fn

    def close(self) -> None:
        pass


class PerformanceMonitor:
    """See :func:`performance_monitor`. Keyword arguments are the fields of
    :class:`~meshprof.config.PerfmonConfig`."""

    enabled = True

    def __init__(
        self,
        model: Any = None,
        *,
        out_dir: str | os.PathLike[str] = "meshprof_out",
        wait: int = 1,
        warmup: int = 1,
        active: int = 3,
        repeat: int = 1,
        flop_counter_step: int | None = None,
        comm_logger_step: int | None = None,
        memory_snapshot_step: int | None = None,
        nsight: bool = False,
        tensorboard: bool = False,
        wandb: bool = False,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
        profiler: bool = True,
        monitor: Any = None,
        tokens_per_step: int = 0,
        samples_per_step: int = 0,
        print_fn: Callable[[str], None] | None = None,
    ) -> None:
        self.settings = PerfmonConfig(
            out_dir=out_dir,
            wait=wait,
            warmup=warmup,
            active=active,
            repeat=repeat,
            flop_counter_step=flop_counter_step,
            comm_logger_step=comm_logger_step,
            memory_snapshot_step=memory_snapshot_step,
            nsight=nsight,
            tensorboard=tensorboard,
            wandb=wandb,
            record_shapes=record_shapes,
            profile_memory=profile_memory,
            with_stack=with_stack,
            profiler=profiler,
            tokens_per_step=tokens_per_step,
            samples_per_step=samples_per_step,
        )
        """The settings (validated)."""
        self.model = model
        self._say = print_fn or (lambda s: print(s, file=sys.stderr, flush=True))
        self._given_monitor = monitor
        self.mon: Any = None
        """The StepMonitor numbering the steps (set when the first step starts)."""
        self.prof: Any = None
        """The collective recorder (set when the first step starts)."""
        self.rank, self.world_size = 0, 1
        self.started = False
        self.closed = False
        self.failures: dict[str, str] = {}
        """Parts switched off after an error: part -> message."""
        self.files: list[Path] = []
        """Files written so far."""
        self.last_step_ns: int = 0
        """Wall time of the last step (ns)."""
        self.ctx: PerfmonContext | None = None
        self.parts: list[Part] = []
        """The parts, in the order their hooks run."""
        self.session: RecordingSession | None = None
        """Recorder, step monitor, rank writer and manifest (set when the first step starts)."""
        self._lock = threading.Lock()

    @property
    def out_dir(self) -> Path:
        return self.settings.out_path

    @property
    def flops_per_step(self) -> float | None:
        """FLOPs of one step, once the FLOP counter step has run."""
        return self.ctx.flops_per_step if self.ctx is not None else None

    def config(self) -> dict[str, Any]:
        """The settings, as printed at start and sent to W&B."""
        return self.settings.to_dict(self.world_size)

    def describe(self) -> str:
        """What this monitor will do, in a few lines for people."""
        from meshprof.render.perfmon_text import describe_config

        return describe_config(self.settings, self.world_size)

    # -- decorating -------------------------------------------------------------------------------
    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            st = self._before()
            try:
                out = fn(*args, **kwargs)
            except BaseException:
                self._after(st, True)
                raise
            self._after(st, False)
            return out

        return wrapper  # type: ignore[return-value]

    def _fail(self, part: str, e: BaseException) -> None:
        record_failure(self.failures, part, e)

    # -- start ------------------------------------------------------------------------------------
    def _start(self) -> None:
        """Start the recording session (recorder, step monitor, rank writer, manifest), then
        the parts. Called by the first step."""
        from meshprof.rundir.schema import Manifest
        from meshprof.session.recording import RecordingSession, SessionConfig

        self.started = True
        self.rank, self.world_size = rank_and_world()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if self.rank == 0:
            self._say(self.describe())
        manifest = Manifest(
            world_size=self.world_size, source="performance_monitor", config=self.config()
        )
        self.session = RecordingSession(
            SessionConfig(
                run_dir=self.out_dir,
                rank=self.rank,
                flush_interval_s=0,
                clock_sync=False,
                manifest=manifest,
                on_error=lambda part, e: self._fail(SESSION_PARTS.get(part, part), e),
            ),
            monitor=self._given_monitor,
        ).start()
        self.prof, self.mon = self.session.prof, self.session.monitor
        if self.prof is None or self.mon is None:
            raise RuntimeError("no recorder or step monitor: nothing to monitor")
        ctx = PerfmonContext(
            config=self.settings,
            prof=self.prof,
            mon=self.mon,
            loggers=LoggerContainer(self.failures),
            rank=self.rank,
            world_size=self.world_size,
            cuda=cuda_available(),
            model=self.model,
            say=self._say,
            write_rank_file=self.session.write,
            files=self.files,
            failures=self.failures,
        )
        self.ctx = ctx
        self.parts = [CommLogPart(ctx), StepScalarsPart(ctx), NvtxPart(ctx)]
        self.parts += [MemorySnapshotPart(ctx), FlopCounterPart(ctx)]
        if self.settings.profiler:
            try:
                self._start_profiler()
            except Exception as e:
                self._fail("profiler", e)
        ctx.loggers = LoggerContainer.build(
            self.settings, self.rank, self.world_size, self.failures
        )

    def _start_profiler(self) -> None:
        assert self.ctx is not None
        part = ProfilerSchedulePart(self.ctx)
        part.start()
        self.parts.append(part)

    # -- around each step ---------------------------------------------------------------------------
    def _before(self) -> StepState | None:
        st: StepState | None = None
        try:
            with self._lock:
                if not self.started:
                    self._start()
            ctx = self.ctx
            if self.closed or ctx is None:
                return None
            st = StepState(step=int(ctx.mon.current_step))
            for part in self.parts:
                if ctx.ok(part.name):
                    try:
                        part.before_step(st)
                    except Exception as e:
                        ctx.fail(part.name, e)
            s = self.settings
            span = ctx.mon.step(tokens=s.tokens_per_step, samples=s.samples_per_step)
            span.__enter__()
            st.span = span
            st.t0_ns = time.time_ns()
        except Exception as e:
            self._fail("monitor", e)
        return st

    def _after(self, st: StepState | None, error: bool) -> None:
        t1 = time.time_ns()
        if st is None or self.ctx is None:
            return
        try:
            if st.span is not None:
                st.span.__exit__(
                    RuntimeError if error else None, RuntimeError() if error else None, None
                )
            st.stack.close()
        except Exception as e:
            self._fail("monitor", e)
        if st.t0_ns == 0:
            return
        st.t1_ns, st.error = t1, error
        self.last_step_ns = t1 - st.t0_ns
        for part in self.parts:
            if self.ctx.ok(part.name):
                try:
                    part.after_step(st)
                except Exception as e:
                    self.ctx.fail(part.name, e)

    # -- end ------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Write pending logs, stop the profiler, write this rank's file, close the loggers.
        Safe to call twice."""
        if self.closed or not self.started:
            self.closed = True
            return
        self.closed = True
        for part in self.parts:
            try:
                part.close()
            except Exception as e:
                self._fail(part.name, e)
        if self.session is not None:
            self.session.stop(final_write=True)
            writer = self.session.writer
            if writer is not None and writer.last_path is not None:
                self.files.append(writer.last_path)
        if self.ctx is not None:
            self.ctx.loggers.close()

    def __enter__(self) -> PerformanceMonitor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def performance_monitor(
    model: Any = None, *, enabled: bool = True, **kwargs: Any
) -> PerformanceMonitor | _Off:
    """Build the monitor; decorate a training step with it (``@monitor``).

    Arguments: ``out_dir`` (run directory), ``wait``/``warmup``/``active``/``repeat``
    (torch.profiler schedule, in steps), ``flop_counter_step``, ``comm_logger_step``,
    ``memory_snapshot_step`` (step numbers, None = off), ``nsight`` (NVTX ranges on CUDA),
    ``tensorboard``, ``wandb`` (scalars; optional extras), ``record_shapes``, ``profile_memory``,
    ``with_stack`` (torch.profiler options), ``profiler`` (False: no torch.profiler),
    ``monitor`` (a StepMonitor to use; default: the current one or a new one),
    ``tokens_per_step``/``samples_per_step``. Call ``monitor.close()`` at the end of training
    (it is also done at exit). ``enabled=False`` gives an object whose decoration returns the
    function unchanged.
    """
    if not enabled:
        return _Off()
    mon = PerformanceMonitor(model, **kwargs)
    import atexit

    atexit.register(mon.close)
    return mon

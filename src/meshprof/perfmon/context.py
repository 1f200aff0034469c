"""What the parts of ``@performance_monitor`` share: the run's context (where files go, which
rank, how a failing part is switched off), the typed state of one step, the :class:`Part`
protocol every part implements, and the one wait for a step's collectives to complete.

Times are wall-clock integers in nanoseconds (``time.time_ns()``, the recorder's clock).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from meshprof.config import PerfmonConfig

if TYPE_CHECKING:
    from meshprof.comm.recorder import CommProfiler

#: Poll period (seconds) while waiting for a step's collectives to complete.
POLL_S = 0.001


def wait_for_step(prof: CommProfiler, t0_ns: int, t1_ns: int, timeout_s: float) -> bool:
    """Wait at most ``timeout_s`` seconds until no collective issued during the step that ran
    over wall-clock [t0_ns, t1_ns] is in flight (asynchronous ones, such as DDP's buckets, are
    recorded once their completion is noticed). True when none is left.

    A step's collectives are those issued inside its span, which opens just before ``t0_ns`` and
    closes just after ``t1_ns`` with no user code in between: the same set the recorder tags
    with the step number."""
    deadline = time.monotonic() + timeout_s
    while any(t0_ns <= op.start_ns <= t1_ns for op in prof.inflight()):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True


class AfterSettle:
    """Work on a finished step, run at the start of the next step (or at close) once the step's
    collectives completed or ``settle_s`` seconds passed: asynchronous collectives (DDP's
    buckets) are recorded only when their completion has been noticed. Holds one step."""

    def __init__(self, ctx: PerfmonContext, part: str, settle_s: float) -> None:
        self.ctx = ctx
        self.part = part
        """The part switched off when the work raises."""
        self.settle_s = settle_s
        self._pending: tuple[StepState, Callable[[], None]] | None = None

    def defer(self, st: StepState, work: Callable[[], None]) -> None:
        """Run ``work`` at the next :meth:`flush`, after ``st``'s collectives settled."""
        self._pending = (st, work)

    def flush(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None or not self.ctx.ok(self.part):
            return
        st, work = pending
        try:
            wait_for_step(self.ctx.prof, st.t0_ns, st.t1_ns, self.settle_s)
            work()
        except Exception as e:
            self.ctx.fail(self.part, e)


@dataclass(slots=True)
class StepState:
    """One call of the decorated step, from ``before_step`` to ``after_step``."""

    step: int
    """The step number (the step monitor's current step when the call began)."""
    stack: ExitStack = field(default_factory=ExitStack)
    """Context managers the parts entered for this step; closed when the step function returns,
    before any ``after_step``, in reverse order of entering."""
    t0_ns: int = 0
    """Wall clock when the step function was called (ns)."""
    t1_ns: int = 0
    """Wall clock when it returned or raised (ns)."""
    error: bool = False
    """The step function raised."""
    span: Any = None
    """The step monitor's span of this step (None until it was opened)."""


class Part(Protocol):
    """One feature of the monitor. Hooks never raise into training: the monitor switches a
    part off (``PerfmonContext.fail``) when a hook raises."""

    name: str
    """Name used in ``PerformanceMonitor.failures`` and the warning."""

    def before_step(self, st: StepState) -> None:
        """Before the step function runs (may enter contexts on ``st.stack``)."""

    def after_step(self, st: StepState) -> None:
        """After the step function returned or raised (``st.stack`` is already closed)."""

    def close(self) -> None:
        """End of training: finish pending work, release resources."""


class MetricLogger(Protocol):
    """A sink for scalars (``TensorBoardLogger``, ``WandbLogger``)."""

    def log(self, values: Mapping[str, float], step: int) -> None: ...

    def close(self) -> None: ...


@dataclass(slots=True)
class PerfmonContext:
    """The run as the parts see it (one per monitor, built when the first step starts)."""

    config: PerfmonConfig
    prof: CommProfiler
    """The collective recorder (``meshprof.enable()``)."""
    mon: Any
    """The :class:`~meshprof.monitor.StepMonitor` numbering the steps."""
    loggers: MetricLogger
    """Where scalars go (TensorBoard, W&B; empty off rank 0)."""
    rank: int = 0
    world_size: int = 1
    cuda: bool = False
    """CUDA is available in this process."""
    model: Any = None
    """The model given to ``performance_monitor`` (None: no module attribution, no NVTX hooks)."""
    say: Callable[[str], None] = print
    """Where messages for people go (``print_fn``; only rank 0 speaks)."""
    write_rank_file: Callable[[], object] = lambda: None
    """Write this rank's file now (after each trace window)."""
    flops_per_step: float | None = None
    """FLOPs of one step, once the FLOP counter step has run."""
    files: list[Path] = field(default_factory=list)
    """Files written so far."""
    failures: dict[str, str] = field(default_factory=dict)
    """Parts switched off after an error: part -> message."""

    @property
    def out_dir(self) -> Path:
        return self.config.out_path

    def path(self, stem: str, ext: str) -> Path:
        """A per-step file of this rank: rank r > 0 gets a ``_rank{r}`` suffix."""
        name = f"{stem}{ext}" if self.rank == 0 else f"{stem}_rank{self.rank}{ext}"
        return self.out_dir / name

    def ok(self, part: str) -> bool:
        """The part has not been switched off."""
        return part not in self.failures

    def fail(self, part: str, e: BaseException) -> None:
        """Switch ``part`` off after ``e``; warns once per part."""
        record_failure(self.failures, part, e)


def record_failure(failures: dict[str, str], part: str, e: BaseException) -> None:
    """Record the first error of ``part`` in ``failures`` and warn (once per part)."""
    if part in failures:
        return
    failures[part] = f"{type(e).__name__}: {e}"
    warnings.warn(
        f"meshprof performance_monitor: {part} switched off after an error: {type(e).__name__}: {e}",
        RuntimeWarning,
        stacklevel=4,
    )


def cuda_available() -> bool:
    """CUDA can be used in this process (False when torch cannot tell)."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False

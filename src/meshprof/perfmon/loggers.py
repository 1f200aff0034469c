"""Scalars per step for people's dashboards: one fan-out :class:`LoggerContainer` over the
TensorBoard and W&B loggers (``meshprof.render``), and the part that computes each step's
scalars and sends them there.

Tags: ``perf/step_time_ms`` (ms), ``perf/comm_share`` (share of the step's wall time covered by
its collectives, 0..1), ``perf/collectives`` (count), ``perf/tflops`` (TFLOP/s, once FLOPs were
counted), ``perf/mfu`` (0..1, with a known peak); the profiler part adds ``prof/<op>_ms``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING

from meshprof.perfmon.context import AfterSettle, MetricLogger, StepState, record_failure

if TYPE_CHECKING:
    from meshprof.config import PerfmonConfig
    from meshprof.perfmon.context import PerfmonContext

#: Longest wait (seconds) for a step's collectives before its scalars are computed.
SCALARS_SETTLE_S = 0.2


class LoggerContainer:
    """Sends every ``log`` to each logger it holds; a logger that raises is recorded in
    ``failures`` under its name and dropped. Empty: ``log`` does nothing."""

    def __init__(self, failures: dict[str, str]) -> None:
        self.failures = failures
        self._loggers: dict[str, MetricLogger] = {}

    @classmethod
    def build(
        cls, config: PerfmonConfig, rank: int, world_size: int, failures: dict[str, str]
    ) -> LoggerContainer:
        """The loggers ``config`` asks for, on rank 0 only. An optional extra that is not
        installed is a failure of that logger, not an error."""
        out = cls(failures)
        if rank != 0:
            return out
        if config.tensorboard:
            try:
                from meshprof.render.tensorboard import TensorBoardLogger

                out.add("tensorboard", TensorBoardLogger(config.out_path / "tensorboard"))
            except Exception as e:
                record_failure(failures, "tensorboard", e)
        if config.wandb:
            try:
                from meshprof.render.wandb import WandbLogger

                out.add("wandb", WandbLogger(config.out_path, config=config.to_dict(world_size)))
            except Exception as e:
                record_failure(failures, "wandb", e)
        return out

    def add(self, name: str, logger: MetricLogger) -> None:
        self._loggers[name] = logger

    def __bool__(self) -> bool:
        return bool(self._loggers)

    def log(self, values: Mapping[str, float], step: int) -> None:
        for name, logger in list(self._loggers.items()):
            try:
                logger.log(values, step)
            except Exception as e:
                record_failure(self.failures, name, e)
                del self._loggers[name]

    def close(self) -> None:
        for name, logger in list(self._loggers.items()):
            try:
                logger.close()
            except Exception as e:
                record_failure(self.failures, name, e)
        self._loggers.clear()


def step_scalars(ctx: PerfmonContext, step: int, t0_ns: int, t1_ns: int) -> dict[str, float]:
    """The ``perf/*`` scalars of ``step``, which ran over wall-clock [t0_ns, t1_ns)."""
    import numpy as np

    from meshprof.analyze.compute.intervals import clipped_total
    from meshprof.monitor.flop_counter import mfu

    dur = max(t1_ns - t0_ns, 1)
    arr, _ = ctx.prof.columns()
    sel = arr[(arr["step"] == step) & (arr["duration_ns"] >= 0)]
    starts = sel["start_ns"].astype(np.int64)
    comm = clipped_total(starts, starts + sel["duration_ns"].astype(np.int64), t0_ns, t1_ns)
    out = {
        "perf/step_time_ms": dur / 1e6,
        "perf/comm_share": comm / dur,
        "perf/collectives": float(len(sel)),
    }
    if ctx.flops_per_step:
        tflops, util = mfu(ctx.flops_per_step, dur / 1e9, getattr(ctx.mon, "peak_tflops", None))
        out["perf/tflops"] = tflops
        if util is not None:
            out["perf/mfu"] = util
    return out


class StepScalarsPart:
    """Logs each step's scalars at the start of the next step (or at close): by then the
    completion of the step's asynchronous collectives has been noticed."""

    name = "logging"

    def __init__(self, ctx: PerfmonContext) -> None:
        self.ctx = ctx
        self._later = AfterSettle(ctx, self.name, SCALARS_SETTLE_S)

    def before_step(self, st: StepState) -> None:
        self._later.flush()

    def after_step(self, st: StepState) -> None:
        if self.ctx.loggers:
            self._later.defer(st, functools.partial(self._log, st))

    def _log(self, st: StepState) -> None:
        self.ctx.loggers.log(step_scalars(self.ctx, st.step, st.t0_ns, st.t1_ns), st.step)

    def close(self) -> None:
        self._later.flush()


__all__ = ["LoggerContainer", "MetricLogger", "StepScalarsPart", "step_scalars"]

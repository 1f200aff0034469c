"""TensorBoard scalars for the performance monitor (optional extra: ``pip install meshprof[tensorboard]``).

Tags: ``perf/step_time_ms``, ``perf/comm_share``, ``perf/tflops``, ``perf/mfu`` per step, and the
most expensive ops of each profiled window under ``prof/<op>_ms``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from meshprof.errors import MeshprofError

MISSING = "TensorBoard logging needs the tensorboard package: pip install 'meshprof[tensorboard]'"


class TensorBoardLogger:
    """Writes scalars into ``log_dir`` (an event file TensorBoard reads); a
    :class:`~meshprof.perfmon.loggers.MetricLogger`."""

    def __init__(self, log_dir: str | os.PathLike[str]) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise MeshprofError(MISSING) from None
        self.log_dir = str(log_dir)
        self._writer: Any = SummaryWriter(log_dir=self.log_dir)

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        """One value per tag at ``step`` (NaN and None values are skipped)."""
        for tag, value in scalars.items():
            if value is None or value != value:
                continue
            self._writer.add_scalar(tag, float(value), global_step=step)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()

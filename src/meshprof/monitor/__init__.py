"""Collection of steps and phases inside training: the step monitor, memory samples, FLOP
counting and pipeline-stage hooks. No analysis here: the step analysis is
:mod:`meshprof.analyze.steps` (``StepMonitor.analysis()`` calls it on request)."""

from __future__ import annotations

from meshprof.monitor.flop_counter import PEAK_TFLOPS, count_flops, mfu, peak_tflops_for
from meshprof.monitor.step_monitor import StepMonitor, get_monitor

__all__ = [
    "PEAK_TFLOPS",
    "StepMonitor",
    "count_flops",
    "get_monitor",
    "mfu",
    "peak_tflops_for",
]

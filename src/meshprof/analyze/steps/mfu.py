"""Analysis step: achieved TFLOP/s and MFU from the FLOPs per step and the mean step time.

achieved = FLOPs per step / mean step time (TFLOP/s); MFU = achieved / peak
(:func:`meshprof.monitor.flop_counter.mfu`).
"""

from __future__ import annotations

from meshprof.analyze.steps.options import StepOptions
from meshprof.analyze.steps.timeline import StepTimeline
from meshprof.analyze.steps.types import FlopsStats, StepAnalysis, updated
from meshprof.monitor.flop_counter import mfu


def add_flops(a: StepAnalysis, t: StepTimeline, o: StepOptions) -> StepAnalysis:
    """Fill ``flops`` when the FLOPs per step are known."""
    mean_step = a.step_time.mean_ns
    if not (o.flops_per_step and a.steps and mean_step > 0):
        return a
    achieved, m_fu = mfu(o.flops_per_step, mean_step / 1e9, o.peak_tflops)
    return updated(a, flops=FlopsStats(float(o.flops_per_step), achieved, o.peak_tflops, m_fu))

"""The step monitor: phases, memory, FLOPs, communication per parallel dimension, bottlenecks."""

from meshprof.monitor.analysis import (
    CommDimStats,
    Distribution,
    FlopsStats,
    MemoryStats,
    PhaseStats,
    PipelineStats,
    StepAnalysis,
    StepRow,
    analyze_steps,
    pipeline_bubble_theory,
)
from meshprof.monitor.bottlenecks import Bottleneck, BottleneckThresholds, evaluate_cross_rank
from meshprof.monitor.dimensions import Layout, dimension_of
from meshprof.monitor.flops import PEAK_TFLOPS, count_flops, mfu, peak_tflops_for
from meshprof.monitor.monitor import StepMonitor, get_monitor

__all__ = [
    "PEAK_TFLOPS",
    "Bottleneck",
    "BottleneckThresholds",
    "CommDimStats",
    "Distribution",
    "FlopsStats",
    "Layout",
    "MemoryStats",
    "PhaseStats",
    "PipelineStats",
    "StepAnalysis",
    "StepMonitor",
    "StepRow",
    "analyze_steps",
    "count_flops",
    "dimension_of",
    "evaluate_cross_rank",
    "get_monitor",
    "mfu",
    "peak_tflops_for",
    "pipeline_bubble_theory",
]

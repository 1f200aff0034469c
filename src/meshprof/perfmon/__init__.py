"""``@performance_monitor`` as small parts with before/after-step hooks (see :mod:`.monitor`)."""

from __future__ import annotations

from meshprof.config import PerfmonConfig
from meshprof.perfmon.context import Part, PerfmonContext, StepState
from meshprof.perfmon.decorator import PerformanceMonitor, performance_monitor
from meshprof.perfmon.loggers import LoggerContainer, MetricLogger
from meshprof.perfmon.module_timeline import ModuleTimeline

__all__ = [
    "LoggerContainer",
    "MetricLogger",
    "ModuleTimeline",
    "Part",
    "PerfmonConfig",
    "PerfmonContext",
    "PerformanceMonitor",
    "StepState",
    "performance_monitor",
]

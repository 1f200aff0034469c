"""meshprof: a profiler and performance monitor for distributed PyTorch.

The public names are loaded on first use (PEP 562), so ``import meshprof`` and the analysis
commands (``meshprof report``) do not pay for importing torch; the recorder imports it when it
is enabled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshprof._version import __version__
from meshprof.errors import MeshprofError
from meshprof.lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "disable": "meshprof.api",
    "enable": "meshprof.api",
    "get_profiler": "meshprof.api",
    "mark_step": "meshprof.api",
    "profile": "meshprof.api",
    "reset": "meshprof.api",
    "ProfilerConfig": "meshprof.config",
    "PerformanceMonitor": "meshprof.perfmon",
    "performance_monitor": "meshprof.perfmon",
    "CommEvent": "meshprof.events",
    "GroupInfo": "meshprof.events",
    "OpType": "meshprof.events",
    "Bottleneck": "meshprof.analyze.steps.rules",
    "BottleneckThresholds": "meshprof.config",
    "StepAnalysis": "meshprof.analyze.steps",
    "StepMonitor": "meshprof.api",
    "RequestMonitor": "meshprof.monitor.request_monitor",
    "requests": "meshprof.monitor.request_monitor",
    "CommProfiler": "meshprof.api",
    "OpStats": "meshprof.stats",
    "StatsReport": "meshprof.stats",
    "setup_logging": "meshprof.tools.logs",
}

if TYPE_CHECKING:
    from meshprof.analyze.steps import StepAnalysis
    from meshprof.analyze.steps.rules import Bottleneck
    from meshprof.api import (
        CommProfiler,
        StepMonitor,
        disable,
        enable,
        get_profiler,
        mark_step,
        profile,
        reset,
    )
    from meshprof.config import BottleneckThresholds, ProfilerConfig
    from meshprof.events import CommEvent, GroupInfo, OpType
    from meshprof.monitor.request_monitor import RequestMonitor, requests
    from meshprof.perfmon import PerformanceMonitor, performance_monitor
    from meshprof.stats import OpStats, StatsReport
    from meshprof.tools.logs import setup_logging


__getattr__, __dir__ = lazy_exports("meshprof", _EXPORTS, globals())


__all__ = [
    "Bottleneck",
    "BottleneckThresholds",
    "CommEvent",
    "CommProfiler",
    "GroupInfo",
    "MeshprofError",
    "OpStats",
    "OpType",
    "PerformanceMonitor",
    "ProfilerConfig",
    "RequestMonitor",
    "StatsReport",
    "StepAnalysis",
    "StepMonitor",
    "__version__",
    "disable",
    "enable",
    "get_profiler",
    "mark_step",
    "performance_monitor",
    "profile",
    "requests",
    "reset",
    "setup_logging",
]

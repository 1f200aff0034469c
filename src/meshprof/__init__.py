"""meshprof: a profiler and performance monitor for distributed PyTorch.

The public names are loaded on first use (PEP 562), so ``import meshprof`` and the analysis
commands (``meshprof report``) do not pay for importing torch; the recorder imports it when it
is enabled.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from meshprof._version import __version__
from meshprof.errors import MeshprofError

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
    "Bottleneck": "meshprof.analyze.bottlenecks",
    "BottleneckThresholds": "meshprof.analyze.bottlenecks",
    "StepAnalysis": "meshprof.analyze.steps",
    "StepMonitor": "meshprof.monitor",
    "CommProfiler": "meshprof.comm.recorder",
    "OpStats": "meshprof.stats",
    "StatsReport": "meshprof.stats",
    "setup_logging": "meshprof.tools.logs",
}

if TYPE_CHECKING:
    from meshprof.analyze.bottlenecks import Bottleneck, BottleneckThresholds
    from meshprof.analyze.steps import StepAnalysis
    from meshprof.api import disable, enable, get_profiler, mark_step, profile, reset
    from meshprof.comm.recorder import CommProfiler
    from meshprof.config import ProfilerConfig
    from meshprof.events import CommEvent, GroupInfo, OpType
    from meshprof.monitor import StepMonitor
    from meshprof.perfmon import PerformanceMonitor, performance_monitor
    from meshprof.stats import OpStats, StatsReport
    from meshprof.tools.logs import setup_logging


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'meshprof' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


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
    "reset",
    "setup_logging",
]

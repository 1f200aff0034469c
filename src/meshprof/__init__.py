"""meshprof: a profiler and performance monitor for distributed PyTorch."""

from meshprof._version import __version__
from meshprof.api import disable, enable, get_profiler, profile, reset
from meshprof.config import ProfilerConfig
from meshprof.decorator import PerformanceMonitor, performance_monitor
from meshprof.errors import MeshprofError
from meshprof.events import CommEvent, GroupInfo, OpType
from meshprof.monitor import Bottleneck, BottleneckThresholds, StepAnalysis, StepMonitor
from meshprof.profiler import CommProfiler
from meshprof.stats import OpStats, StatsReport
from meshprof.tools.logs import setup_logging

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
    "performance_monitor",
    "profile",
    "reset",
    "setup_logging",
]

"""The 3D-parallel layout library: the layout (ParallelConfig, RankMapping), the model sizes and
per-device memory estimate, the layout's command-line options and its DeviceMesh (:mod:`.mesh`).
The demo model and training loop built on it live in :mod:`meshprof.demo`.

Names load on first use (PEP 562) so that the CLI can import the layout code without torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "DataParallelMode": "config",
    "GradCompression": "config",
    "MemoryStrategy": "config",
    "ParallelConfig": "config",
    "PipelineSchedule": "config",
    "Precision": "config",
    "strategy_settings": "config",
    "RankCoords": "mapping",
    "RankMapping": "mapping",
    "MemoryBreakdown": "memory",
    "MemoryEstimate": "memory",
    "estimate_memory": "memory",
    "ModelConfig": "model_config",
}

if TYPE_CHECKING:
    from meshprof.parallel.config import (
        DataParallelMode,
        GradCompression,
        MemoryStrategy,
        ParallelConfig,
        PipelineSchedule,
        Precision,
        strategy_settings,
    )
    from meshprof.parallel.mapping import RankCoords, RankMapping
    from meshprof.parallel.memory import MemoryBreakdown, MemoryEstimate, estimate_memory
    from meshprof.parallel.model_config import ModelConfig


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'meshprof.parallel' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"meshprof.parallel.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "DataParallelMode",
    "GradCompression",
    "MemoryBreakdown",
    "MemoryEstimate",
    "MemoryStrategy",
    "ModelConfig",
    "ParallelConfig",
    "PipelineSchedule",
    "Precision",
    "RankCoords",
    "RankMapping",
    "estimate_memory",
    "strategy_settings",
]

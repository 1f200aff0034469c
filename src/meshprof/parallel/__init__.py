"""3D parallelism: the layout (ParallelConfig, RankMapping), the memory estimate, and the demo
transformer built with torch's own DeviceMesh, FSDP2/DDP, DTensor TP and pipelining.

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
    "dimension_of_group": "mapping",
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
    from meshprof.parallel.mapping import RankCoords, RankMapping, dimension_of_group
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
    "dimension_of_group",
    "estimate_memory",
    "strategy_settings",
]

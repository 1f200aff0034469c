"""The 3D-parallel layout library: the layout (ParallelConfig, RankMapping), the model sizes and
per-device memory estimate, the layout's command-line options and its DeviceMesh (:mod:`.mesh`).
The demo model and training loop built on it live in :mod:`meshprof.demo`.

Names load on first use (PEP 562) so that the CLI can import the layout code without torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshprof.lazy import lazy_exports

_EXPORTS = {
    "DataParallelMode": "meshprof.parallel.parallel_config",
    "GradCompression": "meshprof.parallel.parallel_config",
    "MemoryStrategy": "meshprof.parallel.parallel_config",
    "ParallelConfig": "meshprof.parallel.parallel_config",
    "PipelineSchedule": "meshprof.parallel.parallel_config",
    "Precision": "meshprof.parallel.parallel_config",
    "strategy_settings": "meshprof.parallel.parallel_config",
    "RankCoords": "meshprof.parallel.mapping",
    "RankMapping": "meshprof.parallel.mapping",
    "MemoryBreakdown": "meshprof.parallel.memory_estimate",
    "MemoryEstimate": "meshprof.parallel.memory_estimate",
    "estimate_memory": "meshprof.parallel.memory_estimate",
    "ModelConfig": "meshprof.parallel.model_config",
}

if TYPE_CHECKING:
    from meshprof.parallel.mapping import RankCoords, RankMapping
    from meshprof.parallel.memory_estimate import MemoryBreakdown, MemoryEstimate, estimate_memory
    from meshprof.parallel.model_config import ModelConfig
    from meshprof.parallel.parallel_config import (
        DataParallelMode,
        GradCompression,
        MemoryStrategy,
        ParallelConfig,
        PipelineSchedule,
        Precision,
        strategy_settings,
    )


__getattr__, __dir__ = lazy_exports("meshprof.parallel", _EXPORTS, globals())


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

"""3D parallelism: the layout (ParallelConfig, RankMapping), the memory estimate, and the demo
transformer built with torch's own DeviceMesh, FSDP2/DDP, DTensor TP and pipelining."""

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
from meshprof.parallel.model import ModelConfig

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

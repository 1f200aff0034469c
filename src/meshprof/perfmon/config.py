"""The settings of ``@performance_monitor``: one typed dataclass, a docstring per field.

Steps are numbered like the :class:`~meshprof.monitor.StepMonitor` numbers them (the monitor's
current step when the decorated function is called; 0 for a fresh monitor).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The torch.profiler schedule's fields, in steps.
SCHEDULE_FIELDS = ("wait", "warmup", "active", "repeat")


@dataclass(kw_only=True, slots=True)
class PerfmonConfig:
    """What ``performance_monitor(...)`` was asked to do (every keyword but ``model``,
    ``monitor``, ``print_fn`` and ``enabled``). Invalid schedules raise ``ValueError``."""

    out_dir: str | os.PathLike[str] = "meshprof_out"
    """Run directory: traces, FLOP and communication logs, rank files, manifest."""

    wait: int = 1
    """torch.profiler schedule: steps skipped at the start of each cycle (>= 0)."""

    warmup: int = 1
    """torch.profiler schedule: steps traced but thrown away before each window (>= 0)."""

    active: int = 3
    """torch.profiler schedule: steps in each recorded trace window (>= 1)."""

    repeat: int = 1
    """torch.profiler schedule: number of cycles (0: repeat until the end of training)."""

    flop_counter_step: int | None = None
    """Step run under ``FlopCounterMode`` (``flops_step{N}.json``); None: off."""

    comm_logger_step: int | None = None
    """Step whose collectives are logged with module and phase (``comm_step{N}.json``,
    ``comm_debug_step{N}.txt``); None: off."""

    memory_snapshot_step: int | None = None
    """Step recorded by the CUDA caching allocator's history and dumped as a snapshot
    (``memory_snapshot_rank{r}_step{N}.pickle``); None: off. Needs CUDA."""

    nsight: bool = False
    """NVTX ranges per step and around the model's forward (for Nsight Systems). Needs CUDA."""

    tensorboard: bool = False
    """Per-step scalars into ``out_dir/tensorboard`` (rank 0; optional extra)."""

    wandb: bool = False
    """Per-step scalars into a W&B run under ``out_dir`` (rank 0; optional extra)."""

    record_shapes: bool = False
    """torch.profiler option: record the input shapes of ops."""

    profile_memory: bool = False
    """torch.profiler option: record tensor allocations and frees."""

    with_stack: bool = False
    """torch.profiler option: record Python stacks of ops."""

    profiler: bool = True
    """Run torch.profiler at all (False: no traces)."""

    tokens_per_step: int = 0
    """Tokens per step, passed to the step monitor (throughput; 0: unknown)."""

    samples_per_step: int = 0
    """Samples per step, passed to the step monitor (throughput; 0: unknown)."""

    def __post_init__(self) -> None:
        for k in SCHEDULE_FIELDS:
            v = getattr(self, k)
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"performance_monitor: {k} must be an integer >= 0, got {v!r}")
        if self.active < 1:
            raise ValueError(f"performance_monitor: active must be >= 1, got {self.active}")

    @property
    def out_path(self) -> Path:
        """``out_dir`` as a :class:`~pathlib.Path`."""
        return Path(self.out_dir)

    def trace_windows(self) -> list[tuple[int, int]]:
        """First and last step of each trace window (only the first cycle when ``repeat`` is 0,
        which then repeats every ``wait + warmup + active`` steps)."""
        first = self.wait + self.warmup
        span = self.wait + self.warmup + self.active
        return [
            (first + i * span, first + i * span + self.active - 1) for i in range(self.repeat or 1)
        ]

    def to_dict(self, world_size: int) -> dict[str, Any]:
        """The settings as printed at start, written into the manifest and sent to W&B."""
        return {
            **{k: getattr(self, k) for k in SCHEDULE_FIELDS},
            "out_dir": str(self.out_path),
            "flop_counter_step": self.flop_counter_step,
            "comm_logger_step": self.comm_logger_step,
            "memory_snapshot_step": self.memory_snapshot_step,
            "nsight": self.nsight,
            "tensorboard": self.tensorboard,
            "wandb": self.wandb,
            "record_shapes": self.record_shapes,
            "profile_memory": self.profile_memory,
            "with_stack": self.with_stack,
            "world_size": world_size,
        }

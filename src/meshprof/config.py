"""User-facing settings: the collective recorder's (:class:`ProfilerConfig`), the bottleneck
rules' thresholds (:class:`BottleneckThresholds`) and ``@performance_monitor``'s
(:class:`PerfmonConfig`), each a dataclass with a docstring per field."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from meshprof.errors import MeshprofError
from meshprof.events import OP_NAMES


@dataclass(kw_only=True, slots=True)
class ProfilerConfig:
    """How the always-on collective recorder behaves. Validated on construction."""

    enabled: bool = True
    """Record collectives. When False the hooks stay installed but return at once."""

    max_events: int = 1_000_000
    """Capacity of the per-rank ring buffer of retained events. The oldest event is evicted
    in O(1) when it is full; counts and totals in the statistics stay exact for the whole run.
    Each retained event costs 56 bytes."""

    sample_rate: float = 1.0
    """Fraction of collectives that are timed and retained, in (0, 1]. The choice is a hash of
    (group name, seq), identical on every rank, so sampled collectives still match across ranks.
    Collectives not sampled are only counted."""

    min_duration_us: float = 0.0
    """Collectives shorter than this (microseconds) are counted in the statistics but not retained
    in the event buffer."""

    ops: frozenset[str] | None = None
    """Only these ops are recorded (names as in :class:`meshprof.events.OpType`, or custom labels);
    None records every op."""

    track_per_rank: bool = True
    """Keep the rank in every statistics key, so a run merged from several ranks reports each
    rank. Off: statistics have no per-rank rows (one key for all ranks, less memory)."""

    track_per_group: bool = True
    """Keep the process group in every statistics key (per-group rows). Off: no per-group rows,
    fewer keys when a job has many groups. Events always keep their group."""

    device_timing: bool = True
    """On CUDA, time collectives with CUDA events on the device (never synchronizing the host).
    When False, or on CPU, collectives are timed on the host from issue to completion."""

    native: bool | None = field(default_factory=lambda: native_from_env())
    """Which dispatcher kernel records: None (the default) the native (C++) one wherever it can
    run (no CUDA, see :func:`meshprof.comm.selection.native_supports_device`) and be built —
    about 20× cheaper per collective than the Python kernel (benchmarks/README.md); until a first build is cached
    the Python kernel records and hands over when a background build finishes. True: native,
    building it now if needed; False: always the Python kernel. Default from
    ``MESHPROF_NATIVE`` (``1``: True, ``0``: False, unset: None)."""

    sketch_relative_error: float = 0.01
    """Relative error of the latency sketch used for percentiles once the buffer has wrapped."""

    extra: dict[str, Any] = field(default_factory=dict)
    """Free-form metadata copied into every export's ``meta``."""

    def __post_init__(self) -> None:
        if self.max_events < 1:
            raise MeshprofError(f"max_events must be >= 1, got {self.max_events}")
        if not (0.0 < self.sample_rate <= 1.0):
            raise MeshprofError(f"sample_rate must be in (0, 1], got {self.sample_rate}")
        if self.min_duration_us < 0:
            raise MeshprofError(f"min_duration_us must be >= 0, got {self.min_duration_us}")
        if not (0.0 < self.sketch_relative_error < 0.5):
            raise MeshprofError(
                f"sketch_relative_error must be in (0, 0.5), got {self.sketch_relative_error}"
            )
        if self.ops is not None:
            self.ops = frozenset(self.ops)

    def updated(self, **changes: Any) -> ProfilerConfig:
        """A copy with ``changes`` applied (unknown names raise :class:`MeshprofError`)."""
        known = {f.name for f in fields(self)}
        bad = sorted(set(changes) - known)
        if bad:
            raise MeshprofError(
                f"unknown config field(s): {', '.join(bad)}; known: {', '.join(sorted(known))}"
            )
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["ops"] = sorted(self.ops) if self.ops is not None else None
        return d


KNOWN_OPS = frozenset(OP_NAMES)


def native_from_env() -> bool | None:
    """``MESHPROF_NATIVE``: ``1``/``true`` → True, ``0``/``false`` → False, unset or empty → None
    (native wherever it can run)."""
    v = os.environ.get("MESHPROF_NATIVE", "").strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    return None


@dataclass(kw_only=True, slots=True)
class BottleneckThresholds:
    """Thresholds of the bottleneck rules (fractions in [0, 1])."""

    exposed_comm: float = 0.30
    """Exposed (not hidden) communication above this share of the step time."""
    memory: float = 0.90
    """Peak memory above this share of device capacity."""
    pipeline_utilization: float = 0.70
    """Pipeline utilization (1 − bubble) below this."""
    tp_efficiency: float = 0.80
    """Tensor-parallel efficiency below this."""
    data_loading: float = 0.10
    """Data loading above this share of the step time."""
    load_imbalance: float = 0.10
    """Cross-rank: slowest rank's compute time above the median by more than this fraction."""
    memory_imbalance: float = 0.20
    """Cross-rank: largest peak memory above the median by more than this fraction."""

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


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

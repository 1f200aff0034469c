"""Configuration of the collective recorder."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
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

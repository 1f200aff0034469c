"""The alert rules' names, units and thresholds (:class:`AlertConfig`): what ``meshprof run``'s
options set and :class:`~meshprof.analyze.live.alerts.AlertRules` reads (the rules themselves
are described there)."""

from __future__ import annotations

from dataclasses import dataclass

from meshprof.errors import MeshprofError

RULES: tuple[str, ...] = (
    "straggler",
    "step_regression",
    "throughput_drop",
    "memory",
    "memory_growth",
    "inflight",
    "stall",
    "stale",
    "decode_straggler",
    "slo",
)
"""Every rule's name (the :attr:`Alert.kind` it raises)."""

UNITS: dict[str, str] = {
    "straggler": "ratio",
    "step_regression": "ratio",
    "throughput_drop": "ratio",
    "memory": "bytes",
    "memory_growth": "bytes",
    "inflight": "s",
    "stall": "s",
    "stale": "s",
    "decode_straggler": "ratio",
    "slo": "ratio",
}
"""The SI unit of each rule's :attr:`Alert.value` and :attr:`Alert.threshold`: ``ratio`` (0.25
for 25 %), ``bytes`` or ``s``."""

JOB_WIDE: tuple[str, ...] = ("step_regression", "throughput_drop")
"""Rules whose alert waits for every running rank's next record (see the module docstring)."""


@dataclass(kw_only=True, slots=True)
class AlertConfig:
    """Thresholds of the alert rules and what the watcher does with an alert. A threshold of 0
    turns its rule off. Validated on construction (bad values raise :class:`MeshprofError`)."""

    enabled: bool = True
    """False: no watcher, no alerts (``meshprof run --no-alerts``)."""
    straggler_pct: float = 20.0
    """A live straggler whose compute exceeds the other ranks' median by more than this many
    percent (the snapshot's straggler list starts at 10 %: noise on a busy machine). The alert's
    ``value`` and ``threshold`` are ratios (0.2 for 20 %)."""
    straggler_looks: int = 3
    """Consecutive fresh records a rank must be such a straggler in before the alert."""
    step_regression_pct: float = 20.0
    """Recent step time above the rank's own baseline by more than this many percent (and by
    more than ``noise_k`` × the baseline's spread)."""
    throughput_drop_pct: float = 30.0
    """Tokens/s (or steps/s) below the rank's own baseline by more than this many percent (and
    by more than ``noise_k`` × the baseline's spread)."""
    noise_k: float = 3.0
    """A step regression or throughput drop must also exceed this many times its baseline's
    spread (1.4826 × the median absolute deviation of the baseline's steps or records: a
    standard deviation robust to outliers), so that a noisy job (a busy machine, a jittery data
    loader) does not regress by its noise alone. 0: the percentages alone."""
    hold_looks: int = 3
    """Consecutive fresh records a step regression, throughput drop or memory growth must hold
    before the alert (a passing hiccup raises nothing)."""
    hold_s: float = 3.0
    """... and, a step regression or throughput drop, for this many seconds by the rank's own
    records (from the first record it held in to this one): a busy machine's slowdown of a
    second or two raises nothing, whatever the live interval (three records span 2 s at
    ``--live-interval 1``, 1 s at 0.5)."""
    memory_pct: float = 90.0
    """Memory above this percentage of the rank's capacity."""
    memory_growth_pct: float = 50.0
    """Memory grown above the rank's own baseline (the median of its first ``baseline_looks``
    fresh records after the warm-up) by more than this many percent and more than
    ``memory_growth_floor_bytes``: a leak, long before the ``memory_pct`` of capacity."""
    memory_growth_floor_bytes: int = 256 << 20
    """... and by more than this many bytes."""
    inflight_s: float = 60.0
    """A collective in flight longer than this many seconds."""
    stall_factor: float = 10.0
    """A step that has lasted more than this many times the rank's median step time (and more
    than ``stall_floor_s``) is stalled."""
    stall_floor_s: float = 120.0
    """... and more than this many seconds (evaluation or a checkpoint between steps, while the
    other ranks wait for the one that does it, is no stall) ..."""
    hang_floor_s: float = 5.0
    """... or only this many seconds when every running rank is waiting in a collective: no
    rank computes, loads data or checkpoints, so none can end the wait (a hang; a pause for a
    checkpoint leaves the rank that writes it outside any collective). 0: always
    ``stall_floor_s``."""
    stale: bool = True
    """Alert when a running rank stops publishing its live state."""
    decode_straggler_pct: float = 20.0
    """A serving rank whose compute in its recent decode steps exceeds the median of the other
    fresh ranks' of its pipeline stage by more than this many percent, for
    ``straggler_looks`` consecutive fresh records (every token of every running request waits
    for it)."""
    slo_attainment_pct: float = 90.0
    """A serving rank's SLO attainment over the recent window (requests that met every service
    level of ``--slo`` / successful requests) below this many percent, for ``hold_looks``
    consecutive fresh records (no service levels: no alert)."""
    warmup_steps: int = 10
    """Steps ignored at the start (compilation, allocator and cache warm-up) for the baselines."""
    baseline_steps: int = 20
    """Steps whose median duration is the step-time baseline (their spread its noise band)."""
    baseline_looks: int = 5
    """Fresh records whose median rate (and memory) is the throughput (and memory) baseline."""
    recent_steps: int = 8
    """Last steps whose median is compared with the step-time baseline."""
    clear_looks: int = 3
    """Consecutive looks a condition must be false before it can raise again."""
    command: str | None = None
    """Shell command run for an alert with the alert as JSON on stdin (``--alert-cmd``)."""
    command_interval_s: float = 60.0
    """At most one command per (rule, rank) per this many seconds (``--alert-interval``): an
    alert runs the command unless every rank it names had one for its rule that recently, so
    noise from one rule or rank never mutes another."""
    command_timeout_s: float = 30.0
    """A command still running after this many seconds is killed (one warning)."""
    poll_s: float = 1.0
    """Seconds between two looks of the watcher."""

    def __post_init__(self) -> None:
        for name, option in (
            ("straggler_pct", "--alert-straggler"),
            ("step_regression_pct", "--alert-step-regression"),
            ("throughput_drop_pct", "--alert-throughput-drop"),
            ("memory_pct", "--alert-memory"),
            ("inflight_s", "--alert-inflight"),
            ("stall_factor", "--alert-stall"),
            ("stall_floor_s", "--alert-stall-floor"),
            ("hang_floor_s", "--alert-hang-floor"),
            ("hold_s", "--alert-hold-seconds"),
            ("memory_growth_pct", "--alert-memory-growth"),
            ("memory_growth_floor_bytes", "--alert-memory-growth-floor"),
            ("noise_k", "--alert-noise-k"),
            ("decode_straggler_pct", "--alert-decode-straggler"),
            ("slo_attainment_pct", "--alert-slo-attainment"),
            ("command_interval_s", "--alert-interval"),
        ):
            v = getattr(self, name)
            if not v >= 0:
                raise MeshprofError(f"{option} {v}: must be >= 0 (0 turns it off)")
        if self.slo_attainment_pct > 100:
            raise MeshprofError(
                f"--alert-slo-attainment {self.slo_attainment_pct}: must be at most 100 (%)"
            )
        if self.throughput_drop_pct >= 100:
            raise MeshprofError(
                f"--alert-throughput-drop {self.throughput_drop_pct}: must be below 100 (%)"
            )
        if self.straggler_looks < 0:
            raise MeshprofError(
                f"--alert-straggler-looks {self.straggler_looks}: must be >= 0 (0 turns it off)"
            )
        for name in (
            "warmup_steps",
            "baseline_steps",
            "baseline_looks",
            "recent_steps",
            "hold_looks",
        ):
            lo = 0 if name == "warmup_steps" else 1
            if getattr(self, name) < lo:
                what = "--alert-hold-looks" if name == "hold_looks" else f"alert {name}"
                raise MeshprofError(f"{what} {getattr(self, name)}: must be >= {lo}")
        if not (self.poll_s > 0 and self.command_timeout_s > 0 and self.clear_looks >= 1):
            raise MeshprofError("alert poll_s, command_timeout_s and clear_looks must be positive")


__all__ = ["JOB_WIDE", "RULES", "UNITS", "AlertConfig"]

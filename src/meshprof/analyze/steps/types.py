"""The typed result of the step analysis (:class:`StepAnalysis`) and its parts.

Times are nanoseconds, shares are fractions of the mean step time, bytes are nccl-tests bytes
(max(in, out)). :meth:`StepAnalysis.check` states the invariants every analysis satisfies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from meshprof.analyze.steps.rules import Bottleneck
from meshprof.records.codec import dataclass_to_json
from meshprof.records.finding import severity_order


def _expect(ok: bool, message: str) -> None:
    """An assertion that also holds under ``python -O``."""
    if not ok:
        raise AssertionError(message)


#: slack for comparisons of float sums and means (relative to the values compared)
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Distribution:
    """Mean, median and 95th percentile of a time over steps (nanoseconds)."""

    count: int
    mean_ns: float
    p50_ns: float
    p95_ns: float

    @classmethod
    def of(cls, values: Sequence[float] | np.ndarray) -> Distribution:
        if len(values) == 0:
            return cls(0, math.nan, math.nan, math.nan)
        a = np.asarray(values, dtype=np.float64)
        if len(a) <= _SMALL:
            s = sorted(a.tolist())
            if math.isfinite(s[0]) and math.isfinite(s[-1]):
                return cls(
                    len(a), float(a.mean()), linear_percentile(s, 50), linear_percentile(s, 95)
                )
        return cls(
            len(a), float(a.mean()), float(np.percentile(a, 50)), float(np.percentile(a, 95))
        )


_SMALL = 4096
"""Up to this many values :meth:`Distribution.of` takes its percentiles in Python (a call of
``np.percentile`` costs ~30 µs, most of a step analysis's per-phase cost at thousands of
ranks)."""


def linear_percentile(ordered: Sequence[float], q: float) -> float:
    """``np.percentile(ordered, q)`` (method "linear") of sorted finite values, bit for bit:
    the same float operations in the same order (numpy's ``_quantile`` and ``_lerp``)."""
    n = len(ordered)
    virtual = (n - 1) * (q / 100)
    if virtual >= n - 1:
        return float(ordered[-1])
    prev = math.floor(virtual)
    gamma = virtual - prev
    a, b = float(ordered[prev]), float(ordered[prev + 1])
    diff = b - a
    if gamma >= 0.5:
        return b - diff * (1 - gamma)
    return a + diff * gamma


@dataclass(frozen=True, slots=True)
class PhaseStats:
    """Time per step spent in one named phase (summed when it occurs several times in a step)."""

    name: str
    time: Distribution
    share_of_step: float
    """Mean phase time / mean step time."""


@dataclass(frozen=True, slots=True)
class CommDimStats:
    """Communication of one parallel dimension, per step on average."""

    dimension: str
    """dp, tp, pp, world or other."""
    count: int
    """Collectives per step."""
    bytes: int
    """nccl-tests bytes per step (max(in, out))."""
    total_ns: float
    exposed_ns: float
    hidden_ns: float
    total_share: float
    """total_ns / mean step time."""
    exposed_share: float
    """exposed_ns / mean step time."""


@dataclass(frozen=True, slots=True)
class PipelineStats:
    """The pipeline bubble of this stage."""

    schedule: str
    stages: int
    microbatches: int
    virtual_stages: int
    bubble: float
    """Measured bubble fraction (mean over steps)."""
    bubble_theory: float | None
    utilization: float
    """1 − bubble."""


@dataclass(frozen=True, slots=True)
class MemoryStats:
    """Memory over the analyzed steps (bytes)."""

    kind: str
    """"cuda" (allocator) or "cpu" (resident set size)."""
    current_bytes: int
    peak_bytes: int
    mean_bytes: float
    mean_over_peak: float
    capacity_bytes: int
    headroom_bytes: int
    peak_fraction: float
    """peak / capacity (0 when the capacity is unknown)."""


@dataclass(frozen=True, slots=True)
class FlopsStats:
    """FLOPs per step and what the step time makes of them."""

    flops_per_step: float
    achieved_tflops: float
    """FLOPs per step / mean step time, in TFLOP/s."""
    peak_tflops: float | None
    mfu: float | None
    """achieved / peak (None without a peak)."""


@dataclass(frozen=True, slots=True)
class StepRow:
    """One analyzed step."""

    step: int
    duration_ns: int
    cpu_ns: int
    comm_ns: int
    exposed_comm_ns: int
    compute_ns: int
    """Step time minus exposed communication."""
    tokens: int
    samples: int


@dataclass(frozen=True, slots=True)
class StepAnalysis:
    """Where this rank's step time goes (definitions: :mod:`meshprof.analyze.steps`).

    Built by a chain of steps (:data:`meshprof.analyze.steps.STEPS`), each filling its fields;
    the fields a step has not filled yet hold their defaults.
    """

    rank: int
    steps: int
    """Steps analyzed (after warm-up)."""
    warmup_steps: int
    step_time: Distribution
    tokens_per_s: float
    samples_per_s: float
    phases: list[PhaseStats] = field(default_factory=list)
    comm: list[CommDimStats] = field(default_factory=list)
    comm_total_share: float = 0.0
    comm_exposed_share: float = 0.0
    data_loading_share: float = 0.0
    dp_efficiency: float | None = None
    tp_efficiency: float | None = None
    pipeline: PipelineStats | None = None
    memory: MemoryStats | None = None
    flops: FlopsStats | None = None
    bottlenecks: list[Bottleneck] = field(default_factory=list)
    per_step: list[StepRow] = field(default_factory=list)
    ledger: dict[str, int] = field(default_factory=dict)
    """The analysed steps' wall time by cause (:class:`meshprof.records.ledger.TimeCause`
    values -> ns), summing to :attr:`ledger_wall_ns` (:mod:`meshprof.analyze.steps.ledger`)."""
    ledger_wall_ns: int = 0
    """The analysed steps' total wall time (ns)."""

    def share_of_step(self, ns: float) -> float:
        """``ns`` as a fraction of the mean step time (0 without analyzed steps)."""
        mean = self.step_time.mean_ns
        return float(ns / mean) if self.steps and mean > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The JSON object (:func:`meshprof.records.codec.dataclass_to_json`: the fields, NaN
        as null)."""
        return dataclass_to_json(self)

    def check(self) -> None:
        """Raise AssertionError (with the numbers) unless the analysis is self-consistent:
        every row's communication fits in its step and its exposed part in the communication,
        shares of the step and efficiencies are fractions, exposed ≤ total communication, a
        phase occurs in at most every step, bubble and utilization add up to 1, memory peaks
        bound the samples, and bottlenecks are ordered by severity.

        A phase's ``share_of_step`` is not checked against 1: it is its mean over the steps it
        occurs in, so a phase of only the long steps can exceed the mean step."""
        _expect(
            self.steps == len(self.per_step) == self.step_time.count,
            f"steps {self.steps} != rows {len(self.per_step)} / count {self.step_time.count}",
        )
        for r in self.per_step:
            _expect(0 <= r.comm_ns <= r.duration_ns, f"step {r.step}: comm {r.comm_ns} > step {r}")
            _expect(0 <= r.exposed_comm_ns <= r.comm_ns + 1, f"step {r.step}: exposed > comm {r}")
            _expect(r.compute_ns == r.duration_ns - r.exposed_comm_ns, f"step {r.step}: {r}")
        for what, t in [("step", self.step_time), *((p.name, p.time) for p in self.phases)]:
            _expect(t.count <= self.steps, f"{what}: {t.count} of {self.steps} steps")
            _expect(not t.count or t.p50_ns <= t.p95_ns * (1 + _EPS), f"{what}: p50 > p95: {t}")
        for name, share in self._shares():
            _expect(-_EPS <= share <= 1 + _EPS, f"{name} = {share} is not a fraction")
        _expect(
            self.comm_exposed_share <= self.comm_total_share + _EPS,
            f"exposed share {self.comm_exposed_share} > total share {self.comm_total_share}",
        )
        for c in self.comm:
            _expect(
                c.hidden_ns == max(c.total_ns - c.exposed_ns, 0.0),
                f"hidden != total − exposed: {c}",
            )
        for name, eff in (("dp", self.dp_efficiency), ("tp", self.tp_efficiency)):
            _expect(eff is None or -_EPS <= eff <= 1 + _EPS, f"{name} efficiency {eff}")
        p = self.pipeline
        if p is not None:
            _expect(-_EPS <= p.bubble <= 1 + _EPS, f"bubble {p.bubble} is not a fraction")
            _expect(p.utilization == 1.0 - p.bubble, f"utilization != 1 − bubble: {p}")
        m = self.memory
        if m is not None:
            _expect(m.peak_bytes >= m.current_bytes and m.peak_bytes >= m.mean_bytes, f"peak: {m}")
            _expect(0 <= m.mean_over_peak <= 1 + _EPS, f"mean/peak is not a fraction: {m}")
        if self.ledger:
            _expect(min(self.ledger.values()) >= 0, f"negative ledger part: {self.ledger}")
            _expect(
                sum(self.ledger.values()) == self.ledger_wall_ns,
                f"ledger parts {sum(self.ledger.values())} != wall {self.ledger_wall_ns}",
            )
        ranks = [severity_order(b.severity) for b in self.bottlenecks]
        _expect(ranks == sorted(ranks), f"bottlenecks not ordered by severity: {ranks}")

    def _shares(self) -> list[tuple[str, float]]:
        """Every figure that is a fraction of the step, by name."""
        out = [
            ("comm_total_share", self.comm_total_share),
            ("comm_exposed_share", self.comm_exposed_share),
            ("data_loading_share", self.data_loading_share),
        ]
        for c in self.comm:
            out += [(f"{c.dimension} total_share", c.total_share)]
            out += [(f"{c.dimension} exposed_share", c.exposed_share)]
        return out

"""The typed result of the step analysis (:class:`StepAnalysis`) and its parts.

Times are nanoseconds, shares are fractions of the mean step time, bytes are nccl-tests bytes
(max(in, out)). :meth:`StepAnalysis.check` states the invariants every analysis satisfies.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

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


class _Compact:
    """Pickled as the arguments of its constructor, ``cls(*fields)``: one ``__init__`` call
    where a frozen dataclass's own unpickling calls ``object.__setattr__`` field by field in
    Python (~2× the time; the report's main process unpickles every rank's analysis)."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, ...]:
        cls = type(self)
        names = _FIELD_NAMES.get(cls)
        if names is None:
            names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(self))  # type: ignore[arg-type]
        return (cls, tuple(getattr(self, n) for n in names))


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


@dataclass(frozen=True, slots=True)
class Distribution(_Compact):
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

    @classmethod
    def of_rows(cls, rows: np.ndarray) -> list[Distribution]:
        """:meth:`of` of each row of a float64 matrix, bit for bit: the rows' means come from
        one reduction along the rows of a C-ordered matrix, which sums each row as ``np.mean``
        of that row alone does (pairwise, then / n)."""
        n = rows.shape[1]
        if not 0 < n <= _SMALL:
            return [cls.of(r) for r in rows]
        rows = np.ascontiguousarray(rows, dtype=np.float64)
        out = []
        for mean, r in zip(rows.mean(axis=1).tolist(), rows.tolist(), strict=True):
            s = sorted(r)
            if math.isfinite(s[0]) and math.isfinite(s[-1]):
                out.append(cls(n, mean, linear_percentile(s, 50), linear_percentile(s, 95)))
            else:
                out.append(cls.of(r))
        return out


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
class PhaseStats(_Compact):
    """Time per step spent in one named phase (summed when it occurs several times in a step)."""

    name: str
    time: Distribution
    share_of_step: float
    """Mean phase time / mean step time."""


@dataclass(frozen=True, slots=True)
class CommDimStats(_Compact):
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
class PipelineStats(_Compact):
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
class MemoryStats(_Compact):
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
class FlopsStats(_Compact):
    """FLOPs per step and what the step time makes of them."""

    flops_per_step: float
    achieved_tflops: float
    """FLOPs per step / mean step time, in TFLOP/s."""
    peak_tflops: float | None
    mfu: float | None
    """achieved / peak (None without a peak)."""


@dataclass(frozen=True, slots=True)
class StepRow(_Compact):
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


_ROW_FIELDS = tuple(f.name for f in fields(StepRow))
_row_values = operator.attrgetter(*_ROW_FIELDS)

PackedRows = tuple[str, int, bytes]
"""Step rows as one blob: (numpy dtype, rows, their values row by row)."""


def pack_rows(rows: list[StepRow]) -> PackedRows | list[StepRow]:
    """``rows`` as :data:`PackedRows`; the list itself when empty or when a value is not a
    plain int (nothing is ever rounded)."""
    if not rows or any(type(r) is not StepRow for r in rows):
        return rows
    values = list(map(_row_values, rows))
    if set(map(type, itertools.chain.from_iterable(values))) != {int}:
        return rows
    try:
        return pack_row_values(np.asarray(values, dtype=np.int64))
    except OverflowError:
        return rows


def pack_row_values(values: np.ndarray) -> PackedRows:
    """Rows given as an int64 matrix (one row per step, :class:`StepRow`'s fields in order)
    as :data:`PackedRows` (int32 where every value fits, else int64)."""
    a = np.ascontiguousarray(values, dtype=np.int64)
    if a.size and int(a.min()) >= -(2**31) and int(a.max()) < 2**31:
        a = a.astype(np.int32)
    return (a.dtype.str, len(a), a.tobytes())


def unpack_rows(packed: PackedRows | list[StepRow]) -> list[StepRow]:
    """The rows :func:`pack_rows` packed."""
    if isinstance(packed, list):
        return packed
    dtype, n, data = packed
    values = np.frombuffer(data, dtype=dtype).reshape(n, len(_ROW_FIELDS)).tolist()
    return list(itertools.starmap(StepRow, values))


class _LazyRows:
    """The slot that holds an unpickled analysis's per-step rows packed
    (:data:`PackedRows`) until :attr:`StepAnalysis.per_step` is first read."""

    __slots__ = ("_packed_rows",)


@dataclass(frozen=True, slots=True)
class StepAnalysis(_LazyRows):
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

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its fields' values, the per-step rows packed into one blob
        (:func:`pack_rows`); unpickled, the rows are made when ``per_step`` is first read (the
        report's main process unpickles every rank's analysis, and reads the rows only to
        write them as JSON)."""
        state = []
        for name in _ANALYSIS_FIELDS:
            if name == "per_step":
                try:
                    rows = object.__getattribute__(self, "per_step")
                except AttributeError:  # unpickled and never read: still packed
                    state.append(object.__getattribute__(self, "_packed_rows"))
                else:
                    state.append(pack_rows(rows))
            else:
                state.append(getattr(self, name))
        return (_unpickle_analysis, (tuple(state),))

    if not TYPE_CHECKING:  # (for type checkers every attribute is declared)

        def __getattr__(self, name: str) -> Any:
            """``per_step`` of an unpickled analysis: the packed rows, made now (once)."""
            if name != "per_step":
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            rows = unpack_rows(object.__getattribute__(self, "_packed_rows"))
            object.__setattr__(self, "per_step", rows)
            object.__delattr__(self, "_packed_rows")
            return rows

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


_ANALYSIS_FIELDS = tuple(f.name for f in fields(StepAnalysis))
_ANALYSIS_FIELD_SET = frozenset(_ANALYSIS_FIELDS)


def updated(a: StepAnalysis, rows: PackedRows | None = None, **changes: Any) -> StepAnalysis:
    """``dataclasses.replace(a, **changes)`` at a third of its cost (each step of the analysis
    chain makes one copy, per rank): a copy of ``a`` with ``changes``; ``rows``: its per-step
    rows, packed (made into :class:`StepRow` when ``per_step`` is first read)."""
    unknown = changes.keys() - _ANALYSIS_FIELD_SET
    if unknown:
        raise TypeError(f"StepAnalysis has no field {sorted(unknown)[0]!r}")
    new = object.__new__(StepAnalysis)
    for name in _ANALYSIS_FIELDS:
        if name == "per_step" and name not in changes:
            try:  # (not read: still packed)
                got = object.__getattribute__(a, "per_step") if rows is None else None
            except AttributeError:
                rows = object.__getattribute__(a, "_packed_rows")
            if rows is None:
                object.__setattr__(new, name, got)
            else:
                object.__setattr__(new, "_packed_rows", rows)
        else:
            object.__setattr__(new, name, changes[name] if name in changes else getattr(a, name))
    return new


def _unpickle_analysis(state: tuple[Any, ...]) -> StepAnalysis:
    """A :class:`StepAnalysis` from :meth:`StepAnalysis.__reduce__`'s state (the per-step rows
    left packed)."""
    a = object.__new__(StepAnalysis)
    for name, value in zip(_ANALYSIS_FIELDS, state, strict=True):
        if name == "per_step" and not isinstance(value, list):
            object.__setattr__(a, "_packed_rows", value)
        else:
            object.__setattr__(a, name, value)
    return a

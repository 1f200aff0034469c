"""The one shape of a conclusion meshprof draws, wherever it draws it: the cross-rank report's
findings, the bottleneck rules, the hang diagnosis, the live alerts and the run comparison all
hold a :class:`Finding` (their own types add the fields only they have).

A finding says *what* (:class:`FindingKind`), *how bad* (:class:`Severity`), one line for people
(``title``) and the ranks it is about. Kinds and severities are closed sets: a new rule adds its
kind here, so every consumer (renderers, ``--json`` readers, alert routing) sees the whole list.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class StrEnum(str, Enum):
    """An enum whose members are their string values (``enum.StrEnum`` of Python 3.11, which
    meshprof cannot assume): ``str(m)``, ``f"{m}"`` and JSON give the value."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Severity(StrEnum):
    """How bad a finding is, most severe first. The bottleneck rules grade low → critical by how
    far past its threshold the value is; report findings are warning or info; alerts warning or
    critical; a hang's findings critical."""

    CRITICAL = "critical"
    HIGH = "high"
    WARNING = "warning"
    MEDIUM = "medium"
    LOW = "low"
    INFO = "info"

    @property
    def order(self) -> int:
        """Sort key: 0 for the most severe."""
        return _ORDER[self]


_ORDER = {s: i for i, s in enumerate(Severity)}


def severity_order(severity: str) -> int:
    """:attr:`Severity.order` of a severity's name; after every known one for anything else."""
    try:
        return Severity(severity).order
    except ValueError:
        return len(_ORDER)


class FindingKind(StrEnum):
    """What a finding is about."""

    # the cross-rank report (meshprof.analyze.run.conclusions.findings)
    MANIFEST = "manifest"
    """The run's manifest is missing or damaged."""
    STRAGGLER = "straggler"
    """A rank computes longer than its peers and arrives last at the collectives (also a live
    alert: its recent compute exceeds its peers')."""
    MEMORY_IMBALANCE = "memory_imbalance"
    """A rank's peak memory is far above the median rank's (also a bottleneck rule)."""
    MISSING_RANK = "missing_rank"
    """A rank's file is missing or damaged."""
    STORAGE = "storage"
    """A rank recorded more than it stored: writing stopped (a full or failing disk), or the
    retention bounds rotated older rows out."""
    CLOCK = "clock"
    """A rank's clock could not be aligned."""
    INCOMPLETE = "incomplete"
    """Collectives not recorded by every member."""
    RECORDING = "recording"
    """The record contradicts itself (completions seen late by the recorder): repaired before
    the what-if, or the reason it cannot price the ranks."""
    # the bottleneck rules (meshprof.analyze.steps.rules)
    COMMUNICATION = "communication"
    """Exposed communication above its threshold."""
    MEMORY = "memory"
    """Peak memory near capacity (also a live alert)."""
    PIPELINE = "pipeline"
    """Pipeline utilization below its threshold (the bubble)."""
    TENSOR_PARALLEL = "tensor_parallel"
    """Tensor-parallel collectives take too much of forward and backward."""
    DATA_LOADING = "data_loading"
    """Data loading takes too much of the step."""
    LOAD_IMBALANCE = "load_imbalance"
    """The slowest rank's compute is far above the median rank's."""
    # the hang diagnosis (meshprof.analyze.hang)
    MISSING = "missing"
    """A rank never entered a collective its group waits in."""
    OP_MISMATCH = "op_mismatch"
    """Ranks entered different ops at the same (group, seq)."""
    DTYPE_MISMATCH = "dtype_mismatch"
    """Ranks passed different dtypes at the same (group, seq)."""
    SIZE_MISMATCH = "size_mismatch"
    """Ranks passed different sizes at the same (group, seq)."""
    ORDER = "order"
    """Ranks issued a group's collectives in different orders."""
    STUCK = "stuck"
    """Every rank is in the collective and it does not complete."""
    NO_DUMP = "no_dump"
    """A rank wrote no dump."""
    # the live alerts (meshprof.analyze.live.alerts)
    STEP_REGRESSION = "step_regression"
    """A rank's recent step time exceeds its own baseline."""
    THROUGHPUT_DROP = "throughput_drop"
    """A rank's throughput fell below its baseline."""
    MEMORY_GROWTH = "memory_growth"
    """A rank's memory grew far above its own baseline (a leak)."""
    INFLIGHT = "inflight"
    """A collective has been in flight too long (a forming hang)."""
    STALL = "stall"
    """A rank has been in one step too long."""
    STALE = "stale"
    """A rank stopped publishing its live state."""
    # serving (meshprof.analyze.serve; the first two also live alerts)
    DECODE_STRAGGLER = "decode_straggler"
    """A rank computes longer than its peers in the decode steps of a serving job: every token
    of every running request waits for it."""
    SLO = "slo"
    """Requests missed the service levels the user gave (goodput below the requests served)."""
    SERVING_COMMUNICATION = "serving_communication"
    """The collectives' share of the serving steps (transfer, and waiting for the last rank)."""
    QUEUEING = "queueing"
    """Requests waited for their prefill longer than it took: the server is saturated."""
    REQUEST_ERRORS = "request_errors"
    """Requests finished with an error."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """One conclusion, with the ranks it names."""

    kind: FindingKind
    """What it is about."""
    severity: Severity
    """How bad it is."""
    title: str
    """One line for people."""
    ranks: tuple[int, ...] = ()
    """The ranks it names (empty: the whole run, or none in particular)."""


__all__ = ["Finding", "FindingKind", "Severity", "StrEnum", "severity_order"]

"""Where the time of a step goes, in the closed set of causes meshprof accounts it to: the time
ledger of ``meshprof report`` (per rank and for the job) and the live
``meshprof_badput_seconds_total{cause}`` counter use these same names.

A ledger's parts sum to its wall time exactly (ns). Definitions:
:mod:`meshprof.analyze.steps.ledger` (one rank's step, phase by phase) and
:mod:`meshprof.analyze.run.conclusions.ledger` (the straggler wait, from the collectives matched across
ranks; the job's ledger).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshprof.records.finding import StrEnum


class TimeCause(StrEnum):
    """A part of the wall time."""

    COMPUTE = "compute"
    """Productive compute: time in the step's compute phases (or, without phases, the step)
    not spent blocked in communication."""
    EXPOSED_DP = "exposed_comm_dp"
    """Data-parallel communication the training thread waited for (not hidden by compute)."""
    EXPOSED_TP = "exposed_comm_tp"
    """Tensor-parallel communication waited for."""
    EXPOSED_PP = "exposed_comm_pp"
    """Pipeline send/recv waited for inside the stage's compute (outside it: the bubble)."""
    EXPOSED_OTHER = "exposed_comm_other"
    """Other communication waited for (the world group, groups of several dimensions)."""
    BUBBLE = "pipeline_bubble"
    """A pipeline stage idle in its schedule's window: no micro-batch to compute (waiting for
    its neighbours included)."""
    STRAGGLER_WAIT = "straggler_wait"
    """Exposed communication spent waiting for a rank that arrived late at the collective."""
    DATA_LOADING = "data_loading"
    """Time in data-loading phases, communication excluded."""
    OPTIMIZER = "optimizer"
    """Time in optimizer-step and checkpoint phases, communication excluded."""
    IDLE = "idle"
    """Unattributed: time of a step outside its recorded phases."""

    @property
    def badput(self) -> bool:
        """Every cause but productive compute is lost time."""
        return self is not TimeCause.COMPUTE


EXPOSED_BY_DIM = {
    "dp": TimeCause.EXPOSED_DP,
    "tp": TimeCause.EXPOSED_TP,
    "pp": TimeCause.EXPOSED_PP,
}
"""A parallel dimension's exposed-communication cause (any other dimension: EXPOSED_OTHER)."""


def exposed_cause(dim: str) -> TimeCause:
    """The cause exposed communication of the dimension ``dim`` is accounted to."""
    return EXPOSED_BY_DIM.get(dim, TimeCause.EXPOSED_OTHER)


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """Wall time split into causes (ns); the parts sum to ``wall_ns``."""

    wall_ns: int
    """Wall time accounted (ns; for the job: summed over ranks, i.e. GPU-time)."""
    parts: dict[str, int]
    """Cause (a :class:`TimeCause` value) -> ns; every cause present, 0 when none."""


@dataclass(frozen=True, slots=True)
class RankLedger:
    """One rank's ledger over its analysed steps."""

    rank: int
    """Global rank."""
    steps: int
    """Its analysed steps."""
    wall_ns: int
    """Their wall time (ns)."""
    parts: dict[str, int]
    """Cause -> ns, summing to ``wall_ns``."""


__all__ = ["EXPOSED_BY_DIM", "LedgerEntry", "RankLedger", "TimeCause", "exposed_cause"]

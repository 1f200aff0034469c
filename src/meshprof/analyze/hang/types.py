"""The results of a hang diagnosis (:mod:`meshprof.analyze.hang.diagnose`): the findings, the
root cause and the whole diagnosis, as frozen dataclasses; and the two phrases every sentence of
them uses (a rank's whereabouts, a list of ranks)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meshprof.analyze.hang.stacks import StackClusters
from meshprof.records.finding import Finding, Severity
from meshprof.rundir.hang_dumps import RankState


@dataclass(frozen=True, slots=True, kw_only=True)
class HangFinding(Finding):
    """One thing that went wrong in a hang or desync (kind: missing, op_mismatch,
    dtype_mismatch, size_mismatch, order, stuck, no_dump); ``ranks`` are the ranks at fault
    (missing ranks, the minority of a mismatch, ranks without a dump), ``title`` the finding in
    plain words."""

    severity: Severity = Severity.CRITICAL
    group: str
    """Process group name ("" when not about one group)."""
    seq: int
    """Sequence number in the group (-1 when not about one collective)."""
    values: tuple[tuple[int, str], ...] = ()
    """(rank, what that rank did) for the ranks compared."""
    op: str = ""
    """The collective's op at (group, seq) ("" when not about one collective)."""
    waiting: tuple[int, ...] = ()
    """The ranks waiting in that collective when they dumped."""
    consequence_of: int | None = None
    """Index in :attr:`HangDiagnosis.findings` of the finding this one follows from (None for a
    root cause or an independent finding)."""

    @property
    def message(self) -> str:
        """The finding in plain words (its title)."""
        return self.title


@dataclass(frozen=True, slots=True)
class RootCause:
    """The finding that explains the others: the ranks whose absence or mismatch blocks the rest."""

    kind: str
    """The root finding's kind ("missing", "op_mismatch", "stuck", "no_dump", ...)."""
    ranks: tuple[int, ...]
    """The ranks at fault."""
    group: str
    """Process group of the collective they block."""
    seq: int
    """Its sequence number in the group."""
    op: str
    """Its op."""
    where: str
    """Where the ranks at fault are ("rank 1: file:line in function; ..."; "" when unknown)."""
    message: str
    """The root cause and the chain of waits it explains, in plain words."""
    finding: int = 0
    """Index of the root finding in :attr:`HangDiagnosis.findings` (always 0)."""


@dataclass(frozen=True, slots=True)
class HangDiagnosis:
    """Everything :func:`diagnose_hang` found."""

    directory: str
    """The folder the dumps were read from."""
    ranks: tuple[RankState, ...]
    """One state per rank that left a dump, by rank (meshprof dumps win over Flight Recorder)."""
    findings: tuple[HangFinding, ...]
    """What went wrong, most important first."""
    world_size: int
    """World size (from the dumps; 0 when unknown)."""
    problems: tuple[str, ...] = ()
    """Files that could not be read, and why."""
    root_cause: RootCause | None = None
    """The first finding as a root cause (None when nothing is wrong)."""
    stacks: StackClusters | None = None
    """The ranks grouped by identical stacks (:mod:`meshprof.analyze.hang.stacks`): where
    each group is, and the outliers."""

    @property
    def ok(self) -> bool:
        return not self.findings

    def to_dict(self) -> dict[str, Any]:
        rc = self.root_cause
        return {
            "directory": self.directory,
            "world_size": self.world_size,
            "root_cause": None
            if rc is None
            else {
                "kind": rc.kind,
                "ranks": list(rc.ranks),
                "group": rc.group,
                "seq": rc.seq,
                "op": rc.op,
                "where": rc.where,
                "message": rc.message,
                "finding": rc.finding,
            },
            "findings": [
                {
                    "index": i,
                    "kind": f.kind,
                    "group": f.group,
                    "seq": f.seq,
                    "op": f.op,
                    "ranks": list(f.ranks),
                    "waiting": list(f.waiting),
                    "message": f.message,
                    "values": [[r, v] for r, v in f.values],
                    "consequence_of": f.consequence_of,
                }
                for i, f in enumerate(self.findings)
            ],
            "ranks": [
                {
                    "rank": s.rank,
                    "source": s.source,
                    "reason": s.reason,
                    "location": str(s.location) if s.location else None,
                    "inflight": [c.describe() for c in s.inflight],
                    "last": [c.describe() for c in s.collectives[-5:]],
                }
                for s in self.ranks
            ],
            "problems": list(self.problems),
            "stacks": None
            if self.stacks is None
            else {
                "lines": list(self.stacks.lines),
                "outliers": list(self.stacks.outliers),
                "clusters": [
                    {"ranks": list(c.ranks), "where": c.where, "outlier": c.outlier}
                    for c in self.stacks.clusters
                ],
                "missing": list(self.stacks.missing),
            },
        }


def where_of(st: RankState | None) -> str:
    """Where a rank is, for a sentence: "is at file:line", "left no dump" ..."""
    if st is None:
        return "left no dump"
    loc = st.location
    return f"is at {loc}" if loc is not None else "has no stack in its dump"


def fmt_ranks(ranks: list[int] | tuple[int, ...]) -> str:
    """ "rank 3" or "ranks 0, 1"."""
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)

"""The cross-rank report's findings: stragglers, memory imbalance, missing ranks, unaligned
clocks, incompletely recorded collectives and a record that contradicts itself, each one line
with the figures behind it."""

from __future__ import annotations

import dataclasses

from meshprof.analyze.run.events.clock import ClockAlignment
from meshprof.analyze.run.events.match import MatchSummary
from meshprof.analyze.run.stragglers.stragglers import StragglerReport
from meshprof.analyze.run.types import MemoryImbalance, RankProblem, RunFinding
from meshprof.analyze.run.what_if.what_if import WhatIf
from meshprof.records.finding import FindingKind, Severity
from meshprof.rundir.storage_notes import StorageNote

MEMORY_IMBALANCE_THRESHOLD = 0.20
"""Peak memory above the median rank by more than this fraction is reported as a finding (the
same default as :class:`meshprof.analyze.steps.rules.BottleneckThresholds.memory_imbalance`)."""


def find_findings(
    stragglers: StragglerReport,
    memory: MemoryImbalance,
    problems: tuple[RankProblem, ...],
    clock: ClockAlignment,
    match: MatchSummary,
    manifest_state: str = "ok",
    manifest_problem: str = "",
    storage: tuple[StorageNote, ...] = (),
    what_if: WhatIf | None = None,
) -> tuple[RunFinding, ...]:
    """Every finding, in this order: a damaged (warning) or missing (info) manifest, stragglers,
    memory imbalance, missing or damaged ranks, what ranks recorded but did not store (a
    warning when writing stopped), ranks whose clock could not be aligned, collectives not
    recorded by every member, completions the record contradicts (a warning when the what-if
    cannot price the ranks because of them, else info: repaired)."""
    out: list[RunFinding] = []
    if manifest_state != "ok":
        out.append(
            RunFinding(
                kind=FindingKind.MANIFEST,
                severity=Severity.WARNING if manifest_state == "damaged" else Severity.INFO,
                title=manifest_problem or f"manifest.json: {manifest_state}",
                evidence={"state": manifest_state, "reason": manifest_problem},
            )
        )
    for x in stragglers.stragglers:
        phase = f" in phase '{x.phase}'" if x.phase else ""
        out.append(
            RunFinding(
                kind=FindingKind.STRAGGLER,
                severity=Severity.WARNING,
                title=f"rank {x.rank} is a straggler{phase}: {x.score:+.0%} compute vs the median rank, arrived last in {x.last_share:.0%} of its collectives",
                ranks=(x.rank,),
                evidence=dataclasses.asdict(x),
            )
        )
    if memory.max_rank >= 0 and memory.imbalance > MEMORY_IMBALANCE_THRESHOLD:
        out.append(
            RunFinding(
                kind=FindingKind.MEMORY_IMBALANCE,
                severity=Severity.WARNING,
                title=f"rank {memory.max_rank} peaks at {memory.imbalance:+.0%} memory vs the median rank",
                ranks=(memory.max_rank,),
                evidence=dataclasses.asdict(memory),
            )
        )
    for p in problems:
        out.append(
            RunFinding(
                kind=FindingKind.MISSING_RANK,
                severity=Severity.WARNING,
                title=f"{p.label} not analyzed: {p.reason}",
                ranks=(p.rank,),
                evidence=p.to_dict(),
            )
        )
    for note in storage:
        out.append(
            RunFinding(
                kind=FindingKind.STORAGE,
                severity=Severity.WARNING if note.stopped else Severity.INFO,
                title=note.title,
                ranks=(note.rank,),
                evidence=dataclasses.asdict(note),
            )
        )
    for c in clock.ranks:
        if c.method == "none":
            out.append(
                RunFinding(
                    kind=FindingKind.CLOCK,
                    severity=Severity.WARNING,
                    title=f"rank {c.rank}: clock not aligned (no timestamp exchange, no shared collective)",
                    ranks=(c.rank,),
                    evidence={"rank": c.rank},
                )
            )
    if what_if is not None:
        out.extend(_recording(what_if))
    if match.incomplete:
        out.append(
            RunFinding(
                kind=FindingKind.INCOMPLETE,
                severity=Severity.INFO,
                title=f"{match.incomplete} of {match.collectives} collectives were not recorded by every member",
                evidence={"incomplete": match.incomplete, "collectives": match.collectives},
            )
        )
    return tuple(out)


def _recording(w: WhatIf) -> list[RunFinding]:
    """The what-if's record check as a finding (none when the record was consistent)."""
    r = w.record
    fixed = r.capped + r.retimed
    if not (fixed or r.unrepaired or w.doubt):
        return []
    evidence = {**dataclasses.asdict(r), "doubt": w.doubt, "contradicted_ns": w.contradicted_ns}
    if w.doubt:
        return [RunFinding(kind=FindingKind.RECORDING, severity=Severity.WARNING,
                           title=f"what-if {w.doubt}", evidence=evidence)]  # fmt: skip
    title = (
        f"{fixed} of {r.members} replayed completions were seen late by the recorder "
        f"(after the rank's next issue, or far after their collective's transfer) and repaired "
        "before the what-if"
    )
    if r.unrepaired:
        title += f"; {r.unrepaired} could not be"
    return [RunFinding(kind=FindingKind.RECORDING, severity=Severity.INFO, title=title,
                       evidence=evidence)]  # fmt: skip

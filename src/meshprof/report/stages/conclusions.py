"""The ranks not analyzed, the report's findings and its summary (:mod:`meshprof.analyze.run.
findings`)."""

from __future__ import annotations

from meshprof.analyze.run.conclusions.findings import find_findings
from meshprof.analyze.run.conclusions.tables import mean_step_ns
from meshprof.analyze.run.events.clock import ClockAlignment
from meshprof.analyze.run.events.match import MatchSummary
from meshprof.analyze.run.stragglers.stragglers import StragglerReport
from meshprof.analyze.run.types import (
    MemoryImbalance,
    RankProblem,
    RankRow,
    RunFinding,
    RunSummary,
)
from meshprof.analyze.run.what_if.what_if import WhatIf
from meshprof.report.stage import Key, stage
from meshprof.rundir import LoadedRun

PROBLEMS: Key[tuple[RankProblem, ...]] = Key("problems")
FINDINGS: Key[tuple[RunFinding, ...]] = Key("findings")
SUMMARY: Key[RunSummary] = Key("summary")


@stage(PROBLEMS)
def problems(run: LoadedRun) -> tuple[RankProblem, ...]:
    """The ranks whose file is missing or damaged, by rank (consecutive missing ranks: one
    entry)."""
    return tuple(
        RankProblem(e.first, e.reason, e.last if e.last > e.first else None)
        for e in run.problems.entries()
    )


@stage(FINDINGS, section=False)
def findings(
    run: LoadedRun,
    stragglers: StragglerReport,
    memory: MemoryImbalance,
    problems: tuple[RankProblem, ...],
    clock: ClockAlignment,
    collectives: MatchSummary,
    what_if_replay: WhatIf,
) -> tuple[RunFinding, ...]:
    """Conclusions with the figures behind them."""
    return find_findings(
        stragglers,
        memory,
        problems,
        clock,
        collectives,
        run.manifest_state,
        run.manifest_problem,
        run.storage_notes,
        what_if_replay,
    )


def manifest_fields(run: LoadedRun) -> dict[str, object]:
    """The manifest's fields that are plain JSON values."""
    return {
        k: v
        for k, v in run.manifest.to_dict().items()
        if isinstance(v, str | int | float | bool | list | dict)
    }


@stage(SUMMARY, lead=3)
def summary(
    run: LoadedRun,
    stragglers: StragglerReport,
    findings: tuple[RunFinding, ...],
    ranks: tuple[RankRow, ...],
) -> RunSummary:
    """What was analyzed and what was concluded."""
    return RunSummary(
        path=str(run.path),
        world_size=run.world_size,
        loaded_ranks=tuple(sorted(run.ranks)),
        steps=len(stragglers.steps),
        common_steps=len(stragglers.common_steps),
        stragglers=tuple(x.rank for x in stragglers.stragglers),
        metadata=manifest_fields(run),
        findings=findings,
        mean_step_ns=mean_step_ns(ranks),
    )


STAGES = (problems, findings, summary)

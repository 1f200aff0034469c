"""The time ledger (:mod:`meshprof.analyze.run.conclusions.ledger`): every rank's wall time and the job's,
split into causes that add up."""

from __future__ import annotations

from meshprof.analyze.run.conclusions.ledger import Ledger, run_ledger
from meshprof.analyze.run.stragglers.stragglers import StragglerReport
from meshprof.analyze.steps import StepAnalysis
from meshprof.report.stage import Key, stage

LEDGER: Key[Ledger] = Key("ledger")


@stage(LEDGER, lead=4)
def ledger(rank_analyses_by_rank: dict[int, StepAnalysis], stragglers: StragglerReport) -> Ledger:
    """Where the analysed steps' time went, per rank and for the job."""
    return run_ledger(list(rank_analyses_by_rank.values()), stragglers)


STAGES = (ledger,)

"""The verdict (:mod:`meshprof.analyze.run.verdict`): the causes of lost time, what each costs
and what to do, largest first — what the report says first."""

from __future__ import annotations

from meshprof.analyze.run.ledger import Ledger
from meshprof.analyze.run.stragglers import StragglerReport
from meshprof.analyze.run.verdict import VerdictInputs, VerdictItem, verdict
from meshprof.analyze.run.waits import WaitCause
from meshprof.analyze.run.what_if import WhatIf
from meshprof.report.stage import Key, ReportOptions, stage
from meshprof.rundir import LoadedRun

VERDICT: Key[tuple[VerdictItem, ...]] = Key("verdict")


@stage(VERDICT, lead=1)
def verdict_stage(
    run: LoadedRun,
    what_if_replay: WhatIf,
    ledger: Ledger,
    stragglers: StragglerReport,
    wait_causes: tuple[WaitCause, ...],
    options: ReportOptions,
) -> tuple[VerdictItem, ...]:
    """The causes of lost time, largest first."""
    hosts = {r: rd.meta.hostname or "" for r, rd in run.ranks.items()}
    inputs = VerdictInputs(what_if_replay, ledger, stragglers, run.world_size, hosts, wait_causes)
    return verdict(inputs, gpu_hour_price=options.gpu_hour_price, include_small=options.all_causes)


STAGES = (verdict_stage,)

"""The verdict (:mod:`meshprof.analyze.run.conclusions.verdict`): the causes of lost time, what each costs
and what to do, largest first — what the report says first."""

from __future__ import annotations

from meshprof.analyze.compute.workload import job_workload, workload_of
from meshprof.analyze.run.conclusions.ledger import Ledger
from meshprof.analyze.run.conclusions.verdict import VerdictInputs, VerdictItem, verdict
from meshprof.analyze.run.stragglers.stragglers import StragglerReport
from meshprof.analyze.run.stragglers.waits import WaitCause
from meshprof.analyze.run.what_if.what_if import WhatIf
from meshprof.report.stage import Key, ReportOptions, stage
from meshprof.rundir import LoadedRun, job_device_kind
from meshprof.rundir.rank_problems import ELSEWHERE

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
    """The causes of lost time, largest first; priced per device-hour of what the job ran on,
    gradient advice only for a job that trains."""
    hosts = {r: rd.meta.hostname or "" for r, rd in run.ranks.items()}
    work = job_workload(
        workload_of(
            rd.meta.step_detection,
            rd.meta.span_names or (rd.meta.monitor.span_names if rd.meta.monitor else None) or (),
        )
        for rd in run.ranks.values()
    )
    device = job_device_kind(rd.meta for rd in run.ranks.values())
    not_read = tuple((sp.first, sp.last) for sp in run.problems.spans if sp.kind == ELSEWHERE)
    inputs = VerdictInputs(
        what_if_replay, ledger, stragglers, run.world_size, hosts, wait_causes, work, device,
        not_read=not_read,
    )  # fmt: skip
    price = (
        options.device_hour_price
        if options.device_hour_price is not None
        else options.gpu_hour_price
    )
    return verdict(inputs, gpu_hour_price=price, include_small=options.all_causes)


STAGES = (verdict_stage,)

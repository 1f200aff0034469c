"""The serving section of the report, from its parts: the request figures, the steps by kind,
every rank's time per step, what a slow rank costs the requests, the slowest requests and the
findings (None for a run that served no requests)."""

from __future__ import annotations

import numpy as np

from meshprof.analyze.run.events.clock import ClockAlignment
from meshprof.analyze.run.events.match import CollectiveMatch
from meshprof.analyze.run.events.table import EventTable
from meshprof.analyze.serve.latency import request_latencies
from meshprof.analyze.serve.rank_breakdown import dim_shares, rank_breakdowns, step_matrix
from meshprof.analyze.serve.request_savings import request_costs
from meshprof.analyze.serve.request_table import request_table
from meshprof.analyze.serve.serving_findings import serving_findings
from meshprof.analyze.serve.slow_requests import slow_requests
from meshprof.analyze.serve.step_kinds import kind_summaries, serving_steps
from meshprof.analyze.serve.step_members import step_members
from meshprof.analyze.serve.types import ServingReport
from meshprof.records.serving import ServiceLevels
from meshprof.rundir import LoadedRun


def serving_report(
    run: LoadedRun,
    table: EventTable,
    clock: ClockAlignment,
    match: CollectiveMatch,
    slo: ServiceLevels | None = None,
) -> ServingReport | None:
    """The serving section of ``run`` (None when no rank recorded requests)."""
    reqs = request_table(run)
    if reqs is None:
        return None
    lat = request_latencies(reqs, slo)
    steps = serving_steps(run.ranks[reqs.rank], reqs)
    kinds = kind_summaries(steps)
    served = steps.kind >= 0
    note = ""
    if not served.any():
        note = (
            "no serving step: the serving rank recorded no step spans around its forwards "
            "(name them with StepMonitor.step(name='prefill'|'decode'), or run under meshprof run)"
        )
        return ServingReport(lat, kinds, note=note, slow=slow_requests(reqs, steps))
    sm = step_members(run, steps, table, clock, match)
    mat = step_matrix(sm)
    dims = dim_shares(sm, mat)
    costs = request_costs(sm, mat, steps, reqs)
    if not len(table):
        note = "no collective recorded: one rank, or the recorder was off (no cross-rank part)"
    return ServingReport(
        latencies=lat,
        kinds=kinds,
        ranks=rank_breakdowns(sm, mat),
        dims=dims,
        costs=costs,
        slow=slow_requests(reqs, steps, sm, mat),
        findings=serving_findings(lat, costs, dims),
        steps_from=int(np.min(steps.step[served])),
        steps_to=int(np.max(steps.step[served])),
        note=note,
    )


__all__ = ["serving_report"]

"""Serving (:mod:`meshprof.analyze.serve`): the requests' latencies as ``vllm bench serve``
measures them, the prefill and decode steps explained across ranks, what a slow rank costs the
requests, the slowest requests' timelines. ``report --json``'s ``serving`` key; absent for a run
that served no requests."""

from __future__ import annotations

from meshprof.analyze.run.events.clock import ClockAlignment
from meshprof.analyze.run.events.match import CollectiveMatch
from meshprof.analyze.run.events.table import EventTable
from meshprof.analyze.serve.serving_report import serving_report
from meshprof.analyze.serve.types import ServingReport
from meshprof.report.stage import Key, ReportOptions, stage
from meshprof.rundir import LoadedRun

SERVING: Key[ServingReport | None] = Key("serving")


@stage(SERVING, json_if_none=False)
def serving(
    run: LoadedRun,
    table: EventTable,
    clock: ClockAlignment,
    match: CollectiveMatch,
    options: ReportOptions,
) -> ServingReport | None:
    """The serving section (None without requests)."""
    return serving_report(run, table, clock, match, options.slo)


STAGES = (serving,)

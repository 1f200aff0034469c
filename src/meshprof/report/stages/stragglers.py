"""Per-step times, straggler scores and the slow ranks' phases (:mod:`meshprof.analyze.run.
stragglers`)."""

from __future__ import annotations

from meshprof.analyze.run.events.clock import ClockAlignment
from meshprof.analyze.run.events.match import CollectiveMatch
from meshprof.analyze.run.events.table import EventTable
from meshprof.analyze.run.stragglers.stragglers import StragglerReport, find_stragglers
from meshprof.report.stage import Key, ReportOptions, stage
from meshprof.rundir import LoadedRun

STRAGGLERS: Key[StragglerReport] = Key("stragglers")


@stage(STRAGGLERS, release_after=True)
def stragglers(
    run: LoadedRun,
    table: EventTable,
    clock: ClockAlignment,
    match: CollectiveMatch,
    options: ReportOptions,
) -> StragglerReport:
    """Who computes longer than the others and arrives last at the collectives."""
    return find_stragglers(run, table, clock, match, threshold=options.threshold)


STAGES = (stragglers,)

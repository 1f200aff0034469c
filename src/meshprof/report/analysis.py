"""The report of a loaded run: every stage of :data:`~meshprof.report.stages.REPORT_STAGES`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from meshprof.analyze.run.clock import ClockAlignment
from meshprof.analyze.run.match import CollectiveMatch
from meshprof.analyze.run.table import EventTable
from meshprof.report.executor import run_stages
from meshprof.report.run_report import RunReport
from meshprof.report.stage import ReportOptions
from meshprof.report.stages import REPORT_STAGES
from meshprof.report.stages.matching import CLOCK, MATCH, TABLE
from meshprof.rundir import LoadedRun


@dataclass(frozen=True, slots=True)
class RunAnalysis:
    """The report with the intermediate results it was built from (for renderers that need
    every event, such as the merged trace, without computing them again)."""

    report: RunReport
    """What ``meshprof report`` shows."""
    table: EventTable
    """Every completed event of every loaded rank."""
    clock: ClockAlignment
    """The clock offsets used."""
    match: CollectiveMatch
    """The matched collectives."""


def analyze_run(run: LoadedRun, options: ReportOptions | None = None, **kw: Any) -> RunReport:
    """The cross-rank report of a loaded run (pure: reads ``run``, returns data); ``kw`` are
    :class:`ReportOptions` fields when ``options`` is not given."""
    options = options or ReportOptions(**kw)
    return RunReport(run_stages(run, REPORT_STAGES, options), REPORT_STAGES)


def analyze_run_parts(
    run: LoadedRun, options: ReportOptions | None = None, **kw: Any
) -> RunAnalysis:
    """:func:`analyze_run`, keeping the event table, clock alignment and match it computed."""
    options = options or ReportOptions(**kw)
    keep: Iterable[str] = (TABLE.name, MATCH.name)
    values = run_stages(run, REPORT_STAGES, options, keep=keep)
    table, match = values.pop(TABLE.name), values.pop(MATCH.name)
    return RunAnalysis(RunReport(values, REPORT_STAGES), table, values[CLOCK.name], match)

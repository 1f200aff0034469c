"""The report of a loaded run: every stage of :data:`~meshprof.report.stages.REPORT_STAGES`."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from meshprof.analyze.run.events.changes import Timeline, find_changes, latest_regime, step_series
from meshprof.analyze.run.events.clock import ClockAlignment
from meshprof.analyze.run.events.match import CollectiveMatch
from meshprof.analyze.run.events.table import EventTable
from meshprof.analyze.run.events.window import window_run
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
    run: LoadedRun
    """The run the stages saw: the loaded run cut to the steps analysed (see
    :func:`choose_window`)."""
    table: EventTable
    """Every completed event of every loaded rank."""
    clock: ClockAlignment
    """The clock offsets used."""
    match: CollectiveMatch
    """The matched collectives."""


def choose_window(run: LoadedRun, options: ReportOptions) -> tuple[LoadedRun, ReportOptions]:
    """The change points of ``run`` and the steps the report analyses: ``options.window`` when
    given, else the latest regime when something changed mid-run (``options.regime``; not for a
    job that served requests, whose step time follows its load), else everything. Returns the run cut to that window and the options carrying the
    :class:`~meshprof.analyze.run.events.changes.Timeline`."""
    series = step_series(run)
    found = find_changes(series)
    first = int(series.steps[0]) if series is not None else -1
    last = int(series.steps[-1]) if series is not None else -1
    window, reason = options.window, "asked" if options.window is not None else ""
    serving = any(len(rd.requests) for rd in run.ranks.values())
    # a serving job's step time follows its load (batch sizes, prefill and decode): its change
    # points are listed, the whole run analysed unless a window is asked for
    if window is None and options.regime and series is not None and not serving:
        window = latest_regime(found, last)
        reason = "latest_regime" if window is not None else ""
    timeline = Timeline(
        found, first, last, window.lo if window else None, window.hi if window else None, reason
    )
    out = run if window is None else window_run(run, window)
    return out, dataclasses.replace(options, timeline=timeline)


def analyze_run(run: LoadedRun, options: ReportOptions | None = None, **kw: Any) -> RunReport:
    """The cross-rank report of a loaded run (pure: reads ``run``, returns data); ``kw`` are
    :class:`ReportOptions` fields when ``options`` is not given. The stages run on the window
    :func:`choose_window` picks."""
    run, options = choose_window(run, options or ReportOptions(**kw))
    return RunReport(run_stages(run, REPORT_STAGES, options), REPORT_STAGES)


def analyze_run_parts(
    run: LoadedRun, options: ReportOptions | None = None, **kw: Any
) -> RunAnalysis:
    """:func:`analyze_run`, keeping the event table, clock alignment and match it computed."""
    run, options = choose_window(run, options or ReportOptions(**kw))
    keep: Iterable[str] = (TABLE.name, MATCH.name)
    values = run_stages(run, REPORT_STAGES, options, keep=keep)
    table, match = values.pop(TABLE.name), values.pop(MATCH.name)
    report = RunReport(values, REPORT_STAGES)
    return RunAnalysis(report, run, table, values[CLOCK.name], match)

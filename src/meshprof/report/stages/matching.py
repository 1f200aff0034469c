"""The event table, clock alignment, the ranks that failed, and collectives matched across
ranks (:mod:`meshprof.analyze.run`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from meshprof.analyze.run.conclusions.tables import group_rows
from meshprof.analyze.run.events.clock import ClockAlignment, align_clocks
from meshprof.analyze.run.events.match import (
    CollectiveMatch,
    MatchSummary,
    match_collectives,
    summarize_match,
)
from meshprof.analyze.run.events.table import EventTable, build_event_table
from meshprof.analyze.run.failures import RankFailure, find_failures
from meshprof.report.stage import Key, stage
from meshprof.rundir import LoadedRun

TABLE: Key[EventTable] = Key("table")
CLOCK: Key[ClockAlignment] = Key("clock")
FAILURES: Key[tuple[RankFailure, ...]] = Key("failures")
MATCH: Key[CollectiveMatch] = Key("match")
COLLECTIVES: Key[MatchSummary] = Key("collectives")


@stage(TABLE, section=False, reads_events=True)
def table(run: LoadedRun, after_rank: Callable[[int], None] | None) -> EventTable:
    """Every completed event of every rank as columns."""
    return build_event_table(run, after_rank=after_rank, sample_fraction=run.sample_fraction)


@stage(CLOCK)
def clock(run: LoadedRun, table: EventTable) -> ClockAlignment:
    """Clock offsets between ranks."""
    return align_clocks(run, table)


@stage(FAILURES, release_after=True)
def failures(run: LoadedRun, clock: ClockAlignment) -> tuple[RankFailure, ...]:
    """The ranks that did not finish normally, the first failure first."""
    return find_failures(run, clock)


@stage(MATCH, section=False, release_after=True)
def match(table: EventTable, clock: ClockAlignment) -> CollectiveMatch:
    """Collectives and send/recv pairs matched across ranks, arrival skew, waits."""
    return match_collectives(table, clock)


@stage(COLLECTIVES)
def collectives(table: EventTable, match: CollectiveMatch) -> MatchSummary:
    """Matching statistics of the run and of every group."""
    return dataclasses.replace(summarize_match(match), groups=group_rows(table, match))


STAGES = (table, clock, failures, match, collectives)

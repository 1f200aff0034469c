"""The report's per-rank, memory, dimension, message-size tables, the step-time heatmap and the
timeline excerpt (:mod:`meshprof.analyze.run.conclusions.tables`, :mod:`.timeline_excerpt`)."""

from __future__ import annotations

from meshprof.analyze.run.conclusions.tables import (
    comm_share_by_dimension,
    memory_imbalance,
    rank_rows,
    recorded_by_size,
    size_rows,
    skew_histogram,
    step_heatmap,
    with_recorded,
)
from meshprof.analyze.run.conclusions.timeline_excerpt import excerpt_ranks, timeline_excerpt
from meshprof.analyze.run.events.clock import ClockAlignment
from meshprof.analyze.run.events.match import CollectiveMatch
from meshprof.analyze.run.events.table import EventTable
from meshprof.analyze.run.stragglers.stragglers import StragglerReport
from meshprof.analyze.run.types import (
    CommShareByDimension,
    MemoryImbalance,
    RankRow,
    SizeRow,
    SkewHistogram,
    StepHeatmap,
    TimelineExcerpt,
)
from meshprof.report.stage import Key, stage
from meshprof.rundir import LoadedRun

RANKS: Key[tuple[RankRow, ...]] = Key("ranks")
MEMORY: Key[MemoryImbalance] = Key("memory")
COMM_SHARE: Key[CommShareByDimension] = Key("comm_share_by_dimension")
BY_SIZE: Key[tuple[SizeRow, ...]] = Key("by_size")
HEATMAP: Key[StepHeatmap] = Key("heatmap")
SKEW: Key[SkewHistogram] = Key("skew_histogram")
TIMELINE: Key[TimelineExcerpt] = Key("timeline")


@stage(RANKS)
def ranks(run: LoadedRun, table: EventTable, stragglers: StragglerReport) -> tuple[RankRow, ...]:
    """One row per rank: step times, compute, communication and wait shares, memory, score."""
    return rank_rows(run, table, stragglers)


@stage(MEMORY)
def memory(ranks: tuple[RankRow, ...]) -> MemoryImbalance:
    """Peak memory across ranks."""
    return memory_imbalance(ranks)


@stage(COMM_SHARE)
def comm_share(
    run: LoadedRun, table: EventTable, stragglers: StragglerReport
) -> CommShareByDimension:
    """Communication time per rank and dimension as a share of the step."""
    dims, share = comm_share_by_dimension(run, table, stragglers)
    return CommShareByDimension(
        dims, stragglers.ranks, share, tuple(float(v) for v in share.sum(axis=1))
    )


@stage(TIMELINE, json=False, release_after=True)
def timeline(
    run: LoadedRun, table: EventTable, clock: ClockAlignment, stragglers: StragglerReport
) -> TimelineExcerpt:
    """Two steps of the merged timeline, on the aligned clock."""
    items, window_ns = timeline_excerpt(run, table, clock, stragglers, excerpt_ranks(stragglers))
    return TimelineExcerpt(items, window_ns)


@stage(BY_SIZE)
def by_size(run: LoadedRun, table: EventTable, match: CollectiveMatch) -> tuple[SizeRow, ...]:
    """Latency and bandwidth by op and message size, and the median wait for late members."""
    return with_recorded(size_rows(table, match), recorded_by_size(run))


@stage(HEATMAP, json=False)
def heatmap(stragglers: StragglerReport) -> StepHeatmap:
    """Step time per rank for the last steps."""
    return step_heatmap(stragglers)


@stage(SKEW)
def skew(match: CollectiveMatch) -> SkewHistogram:
    """How the collectives' arrival skews are distributed."""
    return skew_histogram(match)


STAGES = (ranks, memory, comm_share, timeline, by_size, heatmap, skew)

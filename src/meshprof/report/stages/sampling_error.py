"""How the run was sampled and the resulting error of the main figures
(:mod:`meshprof.analyze.run.conclusions.sampling_error`); absent when every collective was loaded."""

from __future__ import annotations

from meshprof.analyze.run.conclusions.sampling_error import SamplingInfo, sampling_info
from meshprof.analyze.run.events.match import MatchSummary
from meshprof.analyze.run.events.table import EventTable
from meshprof.analyze.run.stragglers.stragglers import StragglerReport
from meshprof.analyze.run.types import SizeRow
from meshprof.report.stage import Key, stage
from meshprof.rundir import LoadedRun

SAMPLING: Key[SamplingInfo | None] = Key("sampling")


@stage(SAMPLING, json_if_none=False, lead=2)
def sampling(
    run: LoadedRun,
    table: EventTable,
    stragglers: StragglerReport,
    by_size: tuple[SizeRow, ...],
    collectives: MatchSummary,
) -> SamplingInfo | None:
    """The sample's size and the error it puts on the report's figures."""
    if run.sample_fraction >= 1:
        return None
    recorded = sum(max(rd.file_events, len(rd.events)) for rd in run.ranks.values())
    return sampling_info(
        table, stragglers, by_size, collectives.collectives, recorded, run.sample_reason
    )


STAGES = (sampling,)

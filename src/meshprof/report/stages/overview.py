"""The run at a glance (:mod:`meshprof.analyze.run.overview`): per-rank figures as spreads across
ranks, the outlier ranks, the groups by kind — the console's view at any world size."""

from __future__ import annotations

from meshprof.analyze.run.events.match import MatchSummary
from meshprof.analyze.run.overview import Overview, overview
from meshprof.analyze.run.types import RankRow
from meshprof.report.stage import Key, stage

OVERVIEW: Key[Overview] = Key("overview")


@stage(OVERVIEW)
def overview_stage(ranks: tuple[RankRow, ...], collectives: MatchSummary) -> Overview:
    """Spreads, outliers and group kinds."""
    return overview(ranks, collectives.groups)


STAGES = (overview_stage,)

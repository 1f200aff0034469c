"""Who waits for whom (:mod:`meshprof.analyze.run.stragglers.waits`): the ranks the others wait for in the
collectives, how much of the run's waiting is theirs, and in which group."""

from __future__ import annotations

from meshprof.analyze.run.events.match import CollectiveMatch
from meshprof.analyze.run.events.table import EventTable
from meshprof.analyze.run.stragglers.waits import WaitCause, wait_causes
from meshprof.report.stage import Key, stage

WAIT_CAUSES: Key[tuple[WaitCause, ...]] = Key("wait_causes")


@stage(WAIT_CAUSES)
def waits(table: EventTable, match: CollectiveMatch) -> tuple[WaitCause, ...]:
    """The ranks that caused the most wait, largest first."""
    return wait_causes(table, match)


STAGES = (waits,)

"""What each slow rank, group and dimension costs every step: the matched collectives replayed
with its compute set to its peers' median (:mod:`meshprof.analyze.run.what_if.what_if`).

The replay is kept whole for the renderers (:data:`WHAT_IF_REPLAY`); ``report --json`` carries
it as four keys: ``what_if`` (the ranks), ``what_if_groups``, ``what_if_dims`` (largest saving
first) and ``what_if_info`` (what was replayed)."""

from __future__ import annotations

from dataclasses import dataclass, field

from meshprof.analyze.run.events.clock import ClockAlignment
from meshprof.analyze.run.events.match import CollectiveMatch
from meshprof.analyze.run.events.table import EventTable
from meshprof.analyze.run.replay.replay_repair import RecordCheck
from meshprof.analyze.run.stragglers.stragglers import StragglerReport
from meshprof.analyze.run.what_if.what_if import DimCost, GroupCost, RankCost, WhatIf, what_if
from meshprof.report.stage import Key, stage
from meshprof.rundir import LoadedRun


@dataclass(frozen=True, slots=True)
class WhatIfInfo:
    """What the what-if replayed (``report --json``'s ``what_if_info``)."""

    steps: tuple[int, ...]
    """The step numbers replayed."""
    step_ns: float
    """Median step time over the replayed steps (ns): the denominator of the shares."""
    ranks_total: int
    """Ranks with events in the replayed steps."""
    ranks_replayed: int
    """Ranks replayed (the largest excess compute first)."""
    levels: int
    """Dependency levels of the replay."""
    replay_error_ns: int
    """Largest |replayed − recorded| step end with the recorded gaps (ns): the self-check."""
    min_share: float
    """Savings below this share of the step are not called out in the text."""
    note: str
    """Why nothing was replayed, if so."""
    unmeasured: tuple[int, ...] = ()
    """Replayed ranks without peers (no other rank of their pipeline stage issued the same
    collectives): their cost is not measured."""
    interval: str = "order statistics of the per-step savings, 95 % (the range under 6 steps)"
    """How ``ci_low_ns`` / ``ci_high_ns`` are computed."""
    record: RecordCheck = field(default_factory=RecordCheck)
    """What the record contradicted and how it was repaired before the replay (counts of
    events: ``capped``, ``retimed``, ``unrepaired``, ``undecided``; see
    :mod:`meshprof.analyze.run.replay.replay_repair`)."""
    doubt: str = ""
    """Why no saving is measured though the run was replayed ("" when they are)."""
    contradicted_ns: float = 0.0
    """Issues recorded before completions the model says they waited for, summed per step
    (median over chains, ns): the record's self-check, 0 when the model fits it."""


WHAT_IF_REPLAY: Key[WhatIf] = Key("what_if_replay")
WHAT_IF: Key[tuple[RankCost, ...]] = Key("what_if")
WHAT_IF_GROUPS: Key[tuple[GroupCost, ...]] = Key("what_if_groups")
WHAT_IF_DIMS: Key[tuple[DimCost, ...]] = Key("what_if_dims")
WHAT_IF_INFO: Key[WhatIfInfo] = Key("what_if_info")


@stage(WHAT_IF_REPLAY, json=False, release_after=True)
def what_if_replay(
    run: LoadedRun,
    table: EventTable,
    clock: ClockAlignment,
    match: CollectiveMatch,
    stragglers: StragglerReport,
) -> WhatIf:
    """The replay of the slowest ranks, their groups and dimensions."""
    return what_if(run, table, clock, match, stragglers)


@stage(WHAT_IF)
def what_if_ranks(what_if_replay: WhatIf) -> tuple[RankCost, ...]:
    return what_if_replay.ranks


@stage(WHAT_IF_GROUPS)
def what_if_groups(what_if_replay: WhatIf) -> tuple[GroupCost, ...]:
    return what_if_replay.groups


@stage(WHAT_IF_DIMS)
def what_if_dims(what_if_replay: WhatIf) -> tuple[DimCost, ...]:
    return what_if_replay.dims


@stage(WHAT_IF_INFO)
def what_if_info(what_if_replay: WhatIf) -> WhatIfInfo:
    w = what_if_replay
    return WhatIfInfo(
        w.steps,
        w.step_ns,
        w.ranks_total,
        len(w.ranks),
        w.levels,
        w.replay_error_ns,
        w.min_share,
        w.note,
        w.unmeasured,
        record=w.record,
        doubt=w.doubt,
        contradicted_ns=w.contradicted_ns,
    )


STAGES = (what_if_replay, what_if_ranks, what_if_groups, what_if_dims, what_if_info)

"""The step monitor's analysis of every rank (:mod:`meshprof.analyze.steps`), beside the
cross-rank stages: independent of them, it starts first and runs on worker processes or a
second thread (:mod:`meshprof.report.executor`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from meshprof.analyze.compute.workload import workload_of
from meshprof.analyze.steps import StepAnalysis, StepOptions, analyze_recorded
from meshprof.report.stage import Key, stage
from meshprof.rundir import LoadedRun, resolve_layout

RANK_ANALYSES_BY_RANK: Key[dict[int, StepAnalysis]] = Key("rank_analyses_by_rank")
RANK_ANALYSES: Key[tuple[StepAnalysis, ...]] = Key("rank_analyses")


def analyze_ranks(
    run: LoadedRun,
    after_rank: Callable[[int], None] | None = None,
    only_ranks: Iterable[int] | None = None,
) -> dict[int, StepAnalysis]:
    """The step analysis of every loaded rank, or of ``only_ranks``; ``after_rank(r)`` is called once
    rank r is done."""
    out: dict[int, StepAnalysis] = {}
    wanted = sorted(run.ranks) if only_ranks is None else sorted(set(only_ranks) & set(run.ranks))
    for r in wanted:
        rd = run.ranks[r]
        mon = rd.meta.monitor
        names = rd.span_names or list((mon.span_names if mon is not None else None) or [])
        options = StepOptions.from_meta(
            mon,
            rank=r,
            layout=resolve_layout(rd.meta, run.manifest),
            workload=workload_of(rd.meta.step_detection, names),
        )
        out[r] = analyze_recorded(rd.spans, names, rd.events, rd.groups, rd.memory, options)
        if after_rank is not None:
            after_rank(r)
    return out


by_rank = stage(
    RANK_ANALYSES_BY_RANK, section=False, beside=True, per_rank=True, reads_events=True
)(analyze_ranks)


@stage(RANK_ANALYSES)
def rank_analyses(rank_analyses_by_rank: dict[int, StepAnalysis]) -> tuple[StepAnalysis, ...]:
    """The analyses in rank order."""
    return tuple(a for _, a in sorted(rank_analyses_by_rank.items()))


STAGES = (by_rank, rank_analyses)

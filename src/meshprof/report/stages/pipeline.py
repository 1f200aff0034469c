"""The pipeline bubble of all stages on the aligned clock, and the bottlenecks: the step
monitor's rules on every rank merged across ranks, and the cross-rank rules
(:mod:`meshprof.analyze.compute.pipeline_bubble`, :mod:`meshprof.analyze.run.conclusions.run_bottlenecks`)."""

from __future__ import annotations

from meshprof.analyze.compute.pipeline_bubble import (
    PipelineBubble,
    StageTimeline,
    measure_pipeline_bubble,
)
from meshprof.analyze.run.conclusions.run_bottlenecks import RunBottleneck, run_bottlenecks
from meshprof.analyze.run.events.clock import ClockAlignment
from meshprof.analyze.run.stragglers.stragglers import StragglerReport
from meshprof.analyze.run.types import MemoryImbalance
from meshprof.analyze.steps import StepAnalysis
from meshprof.records.rank_meta import MonitorSettings
from meshprof.report.stage import Key, ReportOptions, stage
from meshprof.rundir import LoadedRun, resolve_layout

PIPELINE: Key[PipelineBubble | None] = Key("pipeline")
BOTTLENECKS: Key[tuple[RunBottleneck, ...]] = Key("bottlenecks")


@stage(PIPELINE)
def pipeline(run: LoadedRun, clock: ClockAlignment) -> PipelineBubble | None:
    """The bubble of every pipeline group, from its stages' spans on the aligned clock (None
    without pipeline parallelism)."""
    mon = MonitorSettings()
    layout = None
    for rd in run.ranks.values():
        mon = rd.meta.monitor or MonitorSettings()
        layout = resolve_layout(rd.meta, run.manifest)
        if layout is not None:
            break
    if layout is None or layout.pp <= 1:
        return None
    stages = [
        StageTimeline(
            r,
            rd.spans,
            rd.span_names or list((rd.meta.monitor or MonitorSettings()).span_names or []),
            clock.offset(r),
        )
        for r, rd in sorted(run.ranks.items())
    ]
    return measure_pipeline_bubble(
        stages,
        layout,
        str(mon.schedule or ""),
        int(mon.microbatches or 0),
        int(mon.virtual_stages or 1),
        warmup_steps=int(mon.warmup_steps or 0),
    )


@stage(BOTTLENECKS)
def bottlenecks(
    stragglers: StragglerReport,
    memory: MemoryImbalance,
    rank_analyses_by_rank: dict[int, StepAnalysis],
    pipeline: PipelineBubble | None,
    options: ReportOptions,
) -> tuple[RunBottleneck, ...]:
    """Every bottleneck, most severe first."""
    sampled = memory.max_rank >= 0
    return run_bottlenecks(
        stragglers,
        memory.imbalance if sampled else None,
        memory.max_rank if sampled else None,
        rank_analyses_by_rank,
        pipeline,
        extra=options.bottlenecks,
    )


STAGES = (pipeline, bottlenecks)

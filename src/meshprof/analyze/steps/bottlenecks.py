"""Analysis step (last): run the bottleneck rules (:mod:`meshprof.analyze.steps.rules`) on the
figures the other steps filled; findings are ordered most severe first."""

from __future__ import annotations

from meshprof.analyze.compute.workload import Workload, workload_of
from meshprof.analyze.steps.options import StepOptions
from meshprof.analyze.steps.rules import (
    Bottleneck,
    rule_data_loading,
    rule_exposed_comm,
    rule_memory,
    rule_pipeline,
    rule_tp,
)
from meshprof.analyze.steps.timeline import StepTimeline
from meshprof.analyze.steps.types import StepAnalysis, updated
from meshprof.records.finding import severity_order


def add_bottlenecks(a: StepAnalysis, t: StepTimeline, o: StepOptions) -> StepAnalysis:
    """Fill ``bottlenecks`` (none without analyzed steps). Gradient advice only for a rank
    that trains (:attr:`StepOptions.workload`, or a training phase among its phases)."""
    if not a.steps:
        return a
    th = o.thresholds
    mem, pl = a.memory, a.pipeline
    work = o.workload
    if work is not Workload.TRAINING and workload_of(None, (p.name for p in a.phases)) is (
        Workload.TRAINING
    ):
        work = Workload.TRAINING
    by_dim = {c.dimension: c.exposed_share for c in a.comm}
    found: list[Bottleneck | None] = [
        rule_exposed_comm(a.comm_exposed_share, by_dim, th, work),
        rule_memory(mem.peak_fraction, mem.peak_bytes, mem.capacity_bytes, th) if mem else None,
        rule_pipeline(pl.utilization, pl.bubble, pl.bubble_theory, pl.stages, pl.microbatches, th)
        if pl
        else None,
        rule_tp(a.tp_efficiency, th, work) if a.tp_efficiency is not None else None,
        rule_data_loading(a.data_loading_share, th),
    ]
    out = [b for b in found if b is not None]
    out.sort(key=lambda b: severity_order(b.severity))
    return updated(a, bottlenecks=out)

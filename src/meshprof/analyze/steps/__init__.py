"""Where a rank's step time goes: a pure function over its spans, collectives and memory samples.

:func:`analyze_steps` measures the rank's steps once (:func:`~.timeline.build_timeline`: the
steps after warm-up, their phases, and the union of the collectives inside every window), makes
the :class:`StepAnalysis` with step time and throughput (:func:`~.throughput.step_times`), then
runs the chain :data:`STEPS`: small functions with one signature,
``(analysis, timeline, options) -> analysis``, each filling its own fields. The definitions of
the figures are in each step's module:

* phases and data loading — :mod:`.phases`;
* communication (total, exposed, hidden) per parallel dimension, DP and TP efficiency, the
  per-step rows — :mod:`.communication`;
* the stage-local pipeline bubble — :mod:`.bubble`;
* the time ledger (wall time by cause, summing exactly) — :mod:`.ledger`;
* memory — :mod:`.memory`; FLOPs and MFU — :mod:`.flops`;
* bottleneck findings — :mod:`.bottlenecks` (last: it reads the others' figures).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from meshprof.analyze.steps.bottlenecks import add_bottlenecks
from meshprof.analyze.steps.bubble import add_pipeline
from meshprof.analyze.steps.communication import add_communication
from meshprof.analyze.steps.ledger import add_ledger
from meshprof.analyze.steps.memory_stats import add_memory
from meshprof.analyze.steps.mfu import add_flops
from meshprof.analyze.steps.options import StepOptions
from meshprof.analyze.steps.phases import add_phases
from meshprof.analyze.steps.throughput import step_times
from meshprof.analyze.steps.timeline import StepTimeline, build_timeline
from meshprof.analyze.steps.types import (
    CommDimStats,
    Distribution,
    FlopsStats,
    MemoryStats,
    PhaseStats,
    PipelineStats,
    StepAnalysis,
    StepRow,
)
from meshprof.config import BottleneckThresholds
from meshprof.layout import Layout

AnalysisStep = Callable[[StepAnalysis, StepTimeline, StepOptions], StepAnalysis]
"""One step of the chain: returns the analysis with its own fields filled."""

STEPS: tuple[AnalysisStep, ...] = (
    add_phases,
    add_communication,
    add_pipeline,
    add_ledger,
    add_memory,
    add_flops,
    add_bottlenecks,
)
"""The default chain, in order (bottlenecks last)."""


def run_steps(
    t: StepTimeline, o: StepOptions, steps: Sequence[AnalysisStep] = STEPS
) -> StepAnalysis:
    """The analysis of a measured timeline: step times, then each step of ``steps`` in turn."""
    a = step_times(t, o)
    for step in steps:
        a = step(a, t, o)
    return a


def analyze_recorded(
    spans: np.ndarray,
    span_names: Sequence[str],
    events: np.ndarray,
    groups: Sequence[Any],
    memory: np.ndarray,
    options: StepOptions,
) -> StepAnalysis:
    """Analyze one rank's recorded arrays (see :func:`analyze_steps`) with ``options``."""
    t = build_timeline(
        spans,
        span_names,
        events,
        groups,
        memory,
        options.layout,
        options.warmup_steps,
        options.skip_steps,
    )
    return run_steps(t, options)


def analyze_steps(
    spans: np.ndarray,
    span_names: Sequence[str],
    events: np.ndarray,
    groups: Sequence[Any],
    memory: np.ndarray,
    *,
    rank: int = 0,
    layout: Layout | None = None,
    schedule: str = "",
    microbatches: int = 0,
    virtual_stages: int = 1,
    flops_per_step: float | None = None,
    peak_tflops: float | None = None,
    thresholds: BottleneckThresholds | None = None,
    warmup_steps: int = 0,
) -> StepAnalysis:
    """Analyze one rank. ``spans``/``events``/``memory`` are SPAN_DTYPE, EVENT_DTYPE and
    MEMORY_DTYPE arrays on the same clock; ``groups`` index the events' group codes. The
    keywords are the fields of :class:`StepOptions`."""
    options = StepOptions(
        rank=rank,
        layout=layout,
        schedule=schedule,
        microbatches=microbatches,
        virtual_stages=virtual_stages,
        flops_per_step=flops_per_step,
        peak_tflops=peak_tflops,
        thresholds=thresholds or BottleneckThresholds(),
        warmup_steps=warmup_steps,
    )
    return analyze_recorded(spans, span_names, events, groups, memory, options)


__all__ = [
    "STEPS",
    "AnalysisStep",
    "CommDimStats",
    "Distribution",
    "FlopsStats",
    "MemoryStats",
    "PhaseStats",
    "PipelineStats",
    "StepAnalysis",
    "StepOptions",
    "StepRow",
    "StepTimeline",
    "analyze_recorded",
    "analyze_steps",
    "build_timeline",
    "run_steps",
]

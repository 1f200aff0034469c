"""Analysis step: this stage's pipeline bubble, as one stage sees it.

Per step, bubble = 1 − (union of this stage's forward/backward chunk intervals) / (the schedule
window: the top-level phase, not itself a chunk, that overlaps the chunks most; the step when
there is none). Averaged over steps; utilization = 1 − bubble. One stage cannot see the whole
schedule's makespan, so this is a lower bound (the joint figure:
:func:`meshprof.analyze.compute.pipeline_bubble.measure_pipeline_bubble`). Theory:
:func:`meshprof.analyze.compute.pipeline_bubble.pipeline_bubble_theory`.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from meshprof.analyze.compute.intervals import clipped_total
from meshprof.analyze.compute.pipeline_bubble import pipeline_bubble_theory
from meshprof.analyze.steps.options import StepOptions
from meshprof.analyze.steps.timeline import StepSpan, StepTimeline
from meshprof.analyze.steps.types import PipelineStats, StepAnalysis


def step_bubble(st: StepSpan) -> float | None:
    """The bubble fraction of one step (None without chunks or with an empty window)."""
    chunks = [p for p in st.phases if p.is_chunk]
    if not chunks:
        return None
    cs = np.asarray([p.start_ns for p in chunks], dtype=np.int64)
    ce = cs + np.asarray([p.duration_ns for p in chunks], dtype=np.int64)
    lo_w, hi_w = st.start_ns, st.start_ns + st.duration_ns
    best = -1
    for p in st.phases:
        if p.depth != 1:
            continue
        lo = p.start_ns
        hi = lo + p.duration_ns
        ov = clipped_total(cs, ce, lo, hi)
        if ov > best and not p.is_chunk:
            best, lo_w, hi_w = ov, lo, hi
    window = hi_w - lo_w
    return 1.0 - clipped_total(cs, ce, lo_w, hi_w) / window if window > 0 else None


def add_pipeline(a: StepAnalysis, t: StepTimeline, o: StepOptions) -> StepAnalysis:
    """Fill ``pipeline`` when the stage recorded micro-batch chunks."""
    bubbles = [b for b in map(step_bubble, t.steps) if b is not None]
    if not bubbles:
        return a
    p = o.layout.pp if o.layout is not None else 0
    m = o.microbatches
    bubble = float(np.mean(bubbles))
    pipeline = PipelineStats(
        schedule=o.schedule or "unknown",
        stages=p,
        microbatches=m,
        virtual_stages=o.virtual_stages,
        bubble=bubble,
        bubble_theory=pipeline_bubble_theory(o.schedule, p, m, o.virtual_stages),
        utilization=1.0 - bubble,
    )
    return replace(a, pipeline=pipeline)

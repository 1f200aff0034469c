"""Analysis step: this stage's pipeline bubble, as one stage sees it.

Per step, bubble = 1 − (union of this stage's forward/backward chunk intervals) / (the schedule
window: the top-level phase, not itself a chunk, that overlaps the chunks most; the step when
there is none). Averaged over steps; utilization = 1 − bubble. One stage cannot see the whole
schedule's makespan, so this is a lower bound (the joint figure:
:func:`meshprof.analyze.compute.pipeline_bubble.measure_pipeline_bubble`). Theory:
:func:`meshprof.analyze.compute.pipeline_bubble.pipeline_bubble_theory`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshprof.analyze.compute.intervals import Segments
from meshprof.analyze.compute.pipeline_bubble import pipeline_bubble_theory
from meshprof.analyze.steps.exposure import exposure
from meshprof.analyze.steps.options import StepOptions
from meshprof.analyze.steps.timeline import StepTimeline
from meshprof.analyze.steps.types import PipelineStats, StepAnalysis, updated


@dataclass(frozen=True, slots=True)
class ChunkCover:
    """How much of each top-level phase and each step the step's micro-batch chunks cover (the
    union of the chunks of any depth, ns)."""

    has_chunks: np.ndarray
    """Per step: it has chunks (bool)."""
    in_top: np.ndarray
    """Per top-level phase (in :attr:`.exposure.Exposure.top` order): chunks inside it."""
    in_step: np.ndarray
    """Per step: chunks inside the step."""


def chunk_cover(t: StepTimeline) -> ChunkCover | None:
    """The chunks' cover of ``t`` (None without any chunk; computed once per timeline)."""
    if "chunks" in t.cache:
        got = t.cache["chunks"]
        return got if isinstance(got, ChunkCover) else None
    ph, st = t.phases, t.steps
    out = None
    ch = np.flatnonzero(ph.is_chunk)
    if len(ch):
        ch = ch[np.lexsort((ph.start_ns[ch], ph.step_index[ch]))]  # by step, then start
        ck = ph.step_index[ch]
        cs = ph.start_ns[ch]
        steps = np.arange(t.count, dtype=np.int64)
        lo = np.searchsorted(ck, steps, side="left")
        hi = np.searchsorted(ck, steps, side="right")
        segs = Segments(cs, cs + ph.duration_ns[ch], lo, hi, st.start_ns)
        e = exposure(t)
        a = np.concatenate([ph.start_ns[e.top], st.start_ns])
        b = np.concatenate([a[: len(e.top)] + ph.duration_ns[e.top], st.start_ns + st.duration_ns])
        got = segs.clipped_totals(None, np.concatenate([e.top_step, steps]), a, b)
        out = ChunkCover(hi > lo, got[: len(e.top)], got[len(e.top) :])
    t.cache["chunks"] = out
    return out


def schedule_window(t: StepTimeline, cover: ChunkCover, strict: bool) -> np.ndarray:
    """Per step, the position (in :attr:`.exposure.Exposure.top`) of its top-level phase, not
    itself a chunk, that the chunks cover most (the first of equals); -1 where there is none
    (``strict``: none that they cover at all)."""
    e = exposure(t)
    ok = ~t.phases.is_chunk[e.top]
    if strict:
        ok &= cover.in_top > 0
    out = np.full(t.count, -1, dtype=np.int64)
    cand = np.flatnonzero(ok)
    if len(cand):
        k = e.top_step[cand]
        order = np.lexsort((-cover.in_top[cand], k))  # stable: the first of equals leads
        k = k[order]
        lead = np.r_[True, k[1:] != k[:-1]]
        out[k[lead]] = cand[order[lead]]
    return out


def step_bubbles(t: StepTimeline) -> list[float]:
    """The bubble fraction of each step with chunks and a non-empty window, in step order."""
    cover = chunk_cover(t)
    if cover is None:
        return []
    e = exposure(t)
    ph, st = t.phases, t.steps
    w = schedule_window(t, cover, strict=False)
    window, inside = st.duration_ns, cover.in_step
    if len(e.top):
        has, wi = w >= 0, np.maximum(w, 0)
        window = np.where(has, ph.duration_ns[e.top][wi], window)
        inside = np.where(has, cover.in_top[wi], inside)
    keep = cover.has_chunks & (window > 0)
    return (1.0 - inside[keep] / window[keep]).tolist()


def add_pipeline(a: StepAnalysis, t: StepTimeline, o: StepOptions) -> StepAnalysis:
    """Fill ``pipeline`` when the stage recorded micro-batch chunks."""
    bubbles = step_bubbles(t)
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
    return updated(a, pipeline=pipeline)

"""The pipeline bubble measured from all stages' timelines, and its theory.

A stage's bubble is idle time inside the pipeline schedule's *makespan*: from the moment the
first stage starts the schedule to the moment the last stage finishes it. One stage alone cannot
see the makespan (the last stage returns from ``schedule.step`` before the first stage finishes
its last backward), so the stage-local figure of :func:`meshprof.analyze.steps.analyze_steps` is a
lower bound; this function joins the stages of each pipeline group on a common clock:

    bubble(stage, step) = 1 − busy(stage, step) / makespan(group, step)

busy = union of the stage's micro-batch chunk spans (``pp_forward``, ``pp_backward``,
``pp_backward_weight``); makespan = latest end − earliest start of the schedule window (the
top-level phase that contains the chunks) over the group's stages. The result averages over
stages and steps; theory is (p−1)/(m+p−1) for GPipe and 1F1B.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from meshprof.analyze.compute.intervals import clipped_total
from meshprof.events import PIPELINE_CHUNKS, SPAN_KINDS
from meshprof.layout import Layout

_PHASE = SPAN_KINDS.index("phase")


def pipeline_bubble_theory(schedule: str, p: int, m: int, v: int = 1) -> float | None:
    """Theoretical bubble fraction: (p−1)/(m+p−1) for GPipe and 1F1B, (p−1)/(v·m+p−1) for
    interleaved 1F1B; None for schedules without a closed form here (zero-bubble variants)."""
    if p <= 1 or m <= 0:
        return None
    s = schedule.lower().replace("_", "").replace("-", "")
    if "interleaved1f1b" in s or (s.startswith("interleaved") and "zero" not in s):
        return (p - 1) / (v * m + p - 1)
    if (
        s in ("gpipe", "schedulegpipe", "1f1b", "schedule1f1b", "loopedbfs", "scheduleloopedbfs")
        or s == ""
    ):
        return (p - 1) / (m + p - 1)
    return None


@dataclass(frozen=True, slots=True)
class StageTimeline:
    """One stage's spans, with the offset (ns) that puts its clock on the common one."""

    rank: int
    spans: np.ndarray
    names: Sequence[str]
    offset_ns: int = 0


@dataclass(frozen=True, slots=True)
class PipelineBubble:
    """Measured pipeline bubble over all pipeline groups."""

    schedule: str
    stages: int
    microbatches: int
    bubble: float
    """Mean over stages and steps of 1 − busy / makespan."""
    bubble_theory: float | None
    utilization: float
    per_stage: dict[int, float]
    """rank -> mean bubble of that stage."""
    steps: int


def _windows(t: StageTimeline) -> dict[int, tuple[int, int, int]]:
    """step -> (window start, window end, busy ns) on the common clock."""
    names = list(t.names)
    ph = t.spans[t.spans["kind"] == _PHASE]
    out: dict[int, tuple[int, int, int]] = {}
    if len(ph) == 0:
        return out
    is_chunk = np.array(
        [names[i] in PIPELINE_CHUNKS if i < len(names) else False for i in ph["name"]]
    )
    for step in np.unique(ph["step"][is_chunk]):
        m = ph["step"] == step
        chunks = ph[m & is_chunk]
        cs = chunks["start_ns"].astype(np.int64) + t.offset_ns
        ce = cs + chunks["duration_ns"].astype(np.int64)
        lo, hi = int(cs.min()), int(ce.max())
        top = ph[m & ~is_chunk & (ph["depth"] == 1)]
        for p in top:  # the schedule window: the top-level phase holding the chunks
            ps = int(p["start_ns"]) + t.offset_ns
            pe = ps + int(p["duration_ns"])
            if ps <= lo and pe >= hi:
                lo, hi = ps, pe
                break
        out[int(step)] = (lo, hi, clipped_total(cs, ce, lo, hi))
    return out


def measure_pipeline_bubble(
    stages: Sequence[StageTimeline],
    layout: Layout,
    schedule: str = "",
    microbatches: int = 0,
    virtual_stages: int = 1,
    warmup_steps: int = 0,
) -> PipelineBubble | None:
    """The bubble of every pipeline group of ``layout`` from its stages' timelines (None when
    pp == 1 or no stage recorded micro-batch chunks). The first ``warmup_steps`` steps (shape
    inference and allocation happen in the first schedule step) are left out."""
    if layout.pp <= 1:
        return None
    by_rank: Mapping[int, dict[int, tuple[int, int, int]]] = {t.rank: _windows(t) for t in stages}
    groups: dict[tuple[int, int], list[int]] = {}
    for r in by_rank:
        d, tp_, _ = layout.coords(r)
        groups.setdefault((d, tp_), []).append(r)
    values: dict[int, list[float]] = {}
    steps_seen: set[int] = set()
    for ranks in groups.values():
        common = set.intersection(*(set(by_rank[r]) for r in ranks)) if ranks else set()
        for step in sorted(common)[warmup_steps:]:
            lo = min(by_rank[r][step][0] for r in ranks)
            hi = max(by_rank[r][step][1] for r in ranks)
            if hi <= lo:
                continue
            steps_seen.add(step)
            for r in ranks:
                values.setdefault(r, []).append(1.0 - by_rank[r][step][2] / (hi - lo))
    if not values:
        return None
    per_stage = {r: float(np.mean(v)) for r, v in sorted(values.items())}
    bubble = float(np.mean([x for v in values.values() for x in v]))
    return PipelineBubble(
        schedule=schedule or "unknown",
        stages=layout.pp,
        microbatches=microbatches,
        bubble=bubble,
        bubble_theory=pipeline_bubble_theory(schedule, layout.pp, microbatches, virtual_stages),
        utilization=1.0 - bubble,
        per_stage=per_stage,
        steps=len(steps_seen),
    )

"""Analysis step: time per named phase, and the share of the step spent loading data.

A phase's time in a step is the sum of its spans in that step (a name can occur several times);
its share is the mean over steps / the mean step time. Data loading is the phases named in
:data:`DATA_PHASES`.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from meshprof.analyze.steps.options import StepOptions
from meshprof.analyze.steps.timeline import StepTimeline
from meshprof.analyze.steps.types import Distribution, PhaseStats, StepAnalysis

DATA_PHASES = ("data", "data_loading", "dataloader")
"""Phase names that mean waiting for the next batch."""


def add_phases(a: StepAnalysis, t: StepTimeline, o: StepOptions) -> StepAnalysis:
    """Fill ``phases`` (longest first) and ``data_loading_share``."""
    totals: dict[str, list[float]] = {}
    data_time: list[float] = []
    for st in t.steps:
        per_name: dict[str, float] = {}
        for p in st.phases:
            per_name[p.name] = per_name.get(p.name, 0.0) + float(p.duration_ns)
        for n, v in per_name.items():
            totals.setdefault(n, []).append(v)
        data_time.append(sum(v for n, v in per_name.items() if n in DATA_PHASES))
    stats = [
        PhaseStats(
            name=n, time=Distribution.of(v), share_of_step=a.share_of_step(float(np.mean(v)))
        )
        for n, v in totals.items()
    ]
    stats.sort(key=lambda p: -p.time.mean_ns)
    data_share = a.share_of_step(float(np.mean(data_time))) if t.steps else 0.0
    return replace(a, phases=stats, data_loading_share=data_share)

"""Analysis step: time per named phase, and the share of the step spent loading data.

A phase's time in a step is the sum of its spans in that step (a name can occur several times);
its share is the mean over steps / the mean step time. Data loading is the phases named in
:data:`DATA_PHASES`.
"""

from __future__ import annotations

import numpy as np

from meshprof.analyze.steps.options import StepOptions
from meshprof.analyze.steps.timeline import StepTimeline
from meshprof.analyze.steps.types import Distribution, PhaseStats, StepAnalysis, updated

DATA_PHASES = ("data", "data_loading", "dataloader")
"""Phase names that mean waiting for the next batch."""


def add_phases(a: StepAnalysis, t: StepTimeline, o: StepOptions) -> StepAnalysis:
    """Fill ``phases`` (longest first; equals in order of first occurrence) and
    ``data_loading_share``."""
    ph = t.phases
    n_st, n_names = t.count, len(ph.names)
    if not n_st:
        return updated(a, phases=[], data_loading_share=0.0)
    key = ph.step_index * n_names + ph.name
    # a name's time in a step: its spans' float(duration) added one by one, in recorded order
    per_step = np.bincount(key, weights=ph.duration_ns, minlength=n_st * n_names)
    per_step = per_step.reshape(n_st, n_names)
    occurs = np.bincount(key, minlength=n_st * n_names).reshape(n_st, n_names) > 0
    order = list(dict.fromkeys(ph.name.tolist()))  # by first occurrence
    every = set(np.flatnonzero(occurs.all(axis=0)).tolist())
    data = [n for n, name in enumerate(ph.names) if name in DATA_PHASES]
    # (sums of whole nanoseconds: exact in any order)
    data_time = per_step[:, data].sum(axis=1) if data else np.zeros(n_st)
    # the names of every step at once, with the data loading time; the others one by one
    in_all = [n for n in order if n in every]
    *got, data_dist = Distribution.of_rows(np.vstack([per_step[:, in_all].T, data_time]))
    times = dict(zip(in_all, got, strict=True))
    stats = []
    for n in order:
        time = times[n] if n in times else Distribution.of(per_step[occurs[:, n], n])
        stats.append(
            PhaseStats(name=ph.names[n], time=time, share_of_step=a.share_of_step(time.mean_ns))
        )
    stats.sort(key=lambda p: -p.time.mean_ns)
    data_share = a.share_of_step(data_dist.mean_ns)
    return updated(a, phases=stats, data_loading_share=data_share)

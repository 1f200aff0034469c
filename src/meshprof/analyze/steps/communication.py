"""Analysis step: communication per parallel dimension, how much of it is exposed, DP and TP
efficiency, and the per-step rows.

* **Communication time** (total) — the length of the union of the step's collective intervals
  [issue, completion], overall and per parallel dimension (measured by the timeline).
* **Exposed communication** — communication on the step's critical path, i.e. time the training
  thread spent waiting for it. For each top-level phase (and the rest of the step outside any
  phase) the thread's *blocked* time is wall time − its CPU time (``time.thread_time_ns``); the
  exposed part of the phase is min(blocked, communication inside the phase). A synchronous
  collective blocks the thread, so it is fully exposed; an asynchronous one (DDP buckets, FSDP2
  prefetch) running while the thread computes is *hidden*. Hidden = total − exposed. Per
  dimension, a phase's exposed time is split in proportion to each dimension's communication in
  that phase (the rest of the step's: by the dimensions' share of the whole step). Measured
  for all steps at once by :mod:`.exposure`.
* **DP efficiency** — 1 − exposed DP communication / step time.
* **TP efficiency** — 1 − TP communication inside forward and backward / forward+backward time
  (TP collectives sit between the layers' matmuls, so they are on the critical path).
"""

from __future__ import annotations

import numpy as np

from meshprof.analyze.steps.exposure import exposure
from meshprof.analyze.steps.options import StepOptions
from meshprof.analyze.steps.timeline import StepTimeline
from meshprof.analyze.steps.types import (
    CommDimStats,
    PackedRows,
    StepAnalysis,
    pack_row_values,
    updated,
)


def tp_efficiency(t: StepTimeline) -> float | None:
    """1 − TP communication inside forward/backward phases / their time (None without any).
    (Sums of whole nanoseconds: the same floats as summing them step by step.)"""
    ph = t.phases
    fb_sum = float(int(ph.duration_ns[ph.is_fb].sum()))
    return 1.0 - (float(int(ph.tp_ns[ph.is_fb].sum())) / fb_sum) if fb_sum > 0 else None


def step_rows(t: StepTimeline) -> PackedRows:
    """The per-step rows (ns; :class:`StepRow`'s fields, packed): exposed communication from
    :func:`~.exposure.exposure`."""
    st = t.steps
    exposed = exposure(t).total
    return pack_row_values(
        np.stack(
            [
                st.step,
                st.duration_ns,
                st.cpu_ns,
                st.comm_ns,
                exposed,
                st.duration_ns - exposed,
                st.tokens,
                st.samples,
            ],
            axis=1,
        )
    )


def add_communication(a: StepAnalysis, t: StepTimeline, o: StepOptions) -> StepAnalysis:
    """Fill ``comm``, the communication shares, ``dp_efficiency``, ``tp_efficiency`` and
    ``per_step``."""
    dims = t.dimensions
    st = t.steps
    n_st = t.count
    comm: list[CommDimStats] = []
    # every mean over steps from one call: row i of a C-ordered float64 matrix is reduced as
    # np.mean of that row alone would be (pairwise, then / n), so the figures are the same
    nd = len(dims)
    means = (
        np.concatenate(
            [
                st.comm_by_dim,
                exposure(t).by_dim,
                st.count_by_dim,
                st.bytes_by_dim,
                st.comm_ns[None, :],
                exposure(t).total[None, :],
            ],
            dtype=np.float64,
        )
        .mean(axis=1)
        .tolist()
        if n_st
        else []
    )
    for di, d in enumerate(dims):
        tot = means[di] if n_st else 0.0
        exp = means[nd + di] if n_st else 0.0
        comm.append(
            CommDimStats(
                dimension=d,
                count=round(means[2 * nd + di]) if n_st else 0,
                bytes=int(means[3 * nd + di]) if n_st else 0,
                total_ns=tot,
                exposed_ns=exp,
                hidden_ns=max(tot - exp, 0.0),
                total_share=a.share_of_step(tot),
                exposed_share=a.share_of_step(exp),
            )
        )
    total_share = a.share_of_step(means[4 * nd]) if n_st else 0.0
    exposed_share = a.share_of_step(means[4 * nd + 1]) if n_st else 0.0
    layout = o.layout
    dp_eff: float | None = None
    if (layout is not None and layout.dp > 1) or "dp" in dims:
        dp_eff = 1.0 - next((c.exposed_share for c in comm if c.dimension == "dp"), 0.0)
    tp_eff: float | None = None
    if (layout is not None and layout.tp > 1) or "tp" in dims:
        tp_eff = tp_efficiency(t)
    return updated(
        a,
        step_rows(t) if n_st else None,
        comm=comm,
        comm_total_share=total_share,
        comm_exposed_share=exposed_share,
        dp_efficiency=dp_eff,
        tp_efficiency=tp_eff,
    )

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
  that phase (the rest of the step's: by the dimensions' share of the whole step).
* **DP efficiency** — 1 − exposed DP communication / step time.
* **TP efficiency** — 1 − TP communication inside forward and backward / forward+backward time
  (TP collectives sit between the layers' matmuls, so they are on the critical path).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from meshprof.analyze.steps.options import StepOptions
from meshprof.analyze.steps.timeline import StepSpan, StepTimeline
from meshprof.analyze.steps.types import CommDimStats, StepAnalysis, StepRow


@dataclass(frozen=True, slots=True)
class Exposure:
    """Exposed communication of one step (ns)."""

    total: float
    by_dim: dict[str, float]


def split(
    amount: float, per_dim: Sequence[int], dims: Sequence[str], out: dict[str, float]
) -> None:
    """Add ``amount`` to ``out`` split by each dimension's communication inside the window
    (``per_dim[i]``: dimension ``dims[i]``'s union length there, ns)."""
    if amount <= 0 or not dims:
        return
    tot = sum(per_dim)
    if tot <= 0:
        return
    for d, v in zip(dims, per_dim, strict=True):
        out[d] += amount * v / tot


def step_exposure(st: StepSpan, dims: Sequence[str]) -> Exposure:
    """Exposed communication of one step, phase by phase (top-level phases + the remainder)."""
    by_dim = dict.fromkeys(dims, 0.0)
    covered_wall = covered_cpu = covered_comm = 0
    total = 0.0
    for p in st.phases:
        if p.depth != 1:
            continue
        covered_wall += p.duration_ns
        covered_cpu += max(p.cpu_ns, 0)
        covered_comm += p.comm_ns
        blocked = p.duration_ns - p.cpu_ns if p.cpu_ns >= 0 else p.duration_ns
        exp = float(min(max(blocked, 0), p.comm_ns))
        total += exp
        # split(exp, p.comm_by_dim, dims, by_dim), inlined (called once per phase)
        if exp > 0 and dims:
            tot = sum(p.comm_by_dim)
            if tot > 0:
                for d, v in zip(dims, p.comm_by_dim, strict=True):
                    by_dim[d] += exp * v / tot
    rest_wall = st.duration_ns - covered_wall
    rest_comm = max(st.comm_ns - covered_comm, 0)
    if rest_comm > 0:
        cpu = st.cpu_ns
        rest_blocked = rest_wall - (cpu - covered_cpu) if cpu >= 0 else rest_wall
        exp = float(min(max(rest_blocked, 0), rest_comm))
        total += exp
        split(exp, st.comm_by_dim, dims, by_dim)
    return Exposure(total, by_dim)


def tp_efficiency(t: StepTimeline) -> float | None:
    """1 − TP communication inside forward/backward phases / their time (None without any)."""
    fb_time: list[float] = []
    tp_comm: list[float] = []
    for st in t.steps:
        fb_total = 0
        tp_in = 0.0
        for p in st.phases:
            if p.is_fb:
                fb_total += p.duration_ns
                tp_in += p.tp_ns
        fb_time.append(float(fb_total))
        tp_comm.append(tp_in)
    fb_sum = sum(fb_time)
    return 1.0 - (sum(tp_comm) / fb_sum) if fb_sum > 0 else None


def add_communication(a: StepAnalysis, t: StepTimeline, o: StepOptions) -> StepAnalysis:
    """Fill ``comm``, the communication shares, ``dp_efficiency``, ``tp_efficiency`` and
    ``per_step``."""
    dims = t.dimensions
    exposures = [step_exposure(st, dims) for st in t.steps]
    rows = [
        StepRow(
            step=st.step,
            duration_ns=st.duration_ns,
            cpu_ns=st.cpu_ns,
            comm_ns=int(st.comm_ns),
            exposed_comm_ns=int(e.total),
            compute_ns=st.duration_ns - int(e.total),
            tokens=st.tokens,
            samples=st.samples,
        )
        for st, e in zip(t.steps, exposures, strict=True)
    ]
    comm: list[CommDimStats] = []
    # every mean over steps from one call: row i of a C-ordered float64 matrix is reduced as
    # np.mean of that row alone would be (pairwise, then / n), so the figures are the same
    nd = len(dims)
    means = (
        np.asarray(
            [
                *([float(st.comm_by_dim[di]) for st in t.steps] for di in range(nd)),
                *([e.by_dim[d] for e in exposures] for d in dims),
                *([st.count_by_dim[di] for st in t.steps] for di in range(nd)),
                *([st.bytes_by_dim[di] for st in t.steps] for di in range(nd)),
                [r.comm_ns for r in rows],
                [r.exposed_comm_ns for r in rows],
            ],
            dtype=np.float64,
        )
        .mean(axis=1)
        .tolist()
        if rows
        else []
    )
    for di, d in enumerate(dims):
        tot = means[di] if rows else 0.0
        exp = means[nd + di] if rows else 0.0
        comm.append(
            CommDimStats(
                dimension=d,
                count=round(means[2 * nd + di]) if rows else 0,
                bytes=int(means[3 * nd + di]) if rows else 0,
                total_ns=tot,
                exposed_ns=exp,
                hidden_ns=max(tot - exp, 0.0),
                total_share=a.share_of_step(tot),
                exposed_share=a.share_of_step(exp),
            )
        )
    total_share = a.share_of_step(means[4 * nd]) if rows else 0.0
    exposed_share = a.share_of_step(means[4 * nd + 1]) if rows else 0.0
    layout = o.layout
    dp_eff: float | None = None
    if (layout is not None and layout.dp > 1) or "dp" in dims:
        dp_eff = 1.0 - next((c.exposed_share for c in comm if c.dimension == "dp"), 0.0)
    tp_eff: float | None = None
    if (layout is not None and layout.tp > 1) or "tp" in dims:
        tp_eff = tp_efficiency(t)
    return replace(
        a,
        comm=comm,
        comm_total_share=total_share,
        comm_exposed_share=exposed_share,
        dp_efficiency=dp_eff,
        tp_efficiency=tp_eff,
        per_step=rows,
    )

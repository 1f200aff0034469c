"""First step of the step analysis: one rank's recorded arrays → a :class:`StepTimeline`.

The timeline holds the analyzed steps (after warm-up), each with its phases, and every
communication figure the later steps need, already measured: the length of the union of the
step's collectives [issue, completion] inside the step, inside each top-level phase (overall
and per parallel dimension) and, for tensor parallelism, inside each forward/backward phase.
A step's collectives are those issued inside it. Times are nanoseconds on the rank's clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from meshprof.analyze.compute.intervals import Segments
from meshprof.events import PIPELINE_CHUNKS, SPAN_KINDS
from meshprof.layout import Layout, dimension_of

FB_PHASES = ("forward", "backward", "forward_backward")
"""Phases whose time is forward and backward compute (for TP efficiency)."""
_STEP = SPAN_KINDS.index("step")
_PHASE = SPAN_KINDS.index("phase")


class PhaseSpan(NamedTuple):
    """One phase of a step, with the communication measured inside it. (A named tuple, not a
    frozen dataclass: a report at 4,096 ranks makes ~330,000 of them, and a tuple is built
    ~3× faster.)"""

    name: str
    start_ns: int
    duration_ns: int
    cpu_ns: int
    """Thread CPU time inside the phase (negative: not measured)."""
    depth: int
    """1 for a top-level phase (directly inside the step)."""
    is_fb: bool
    """A forward/backward phase (:data:`FB_PHASES`)."""
    is_chunk: bool
    """A pipeline micro-batch chunk (:data:`meshprof.events.PIPELINE_CHUNKS`)."""
    comm_ns: int
    """Union of the step's collectives inside the phase (top-level phases; else 0)."""
    comm_by_dim: tuple[int, ...]
    """The same per dimension, in :attr:`StepTimeline.dimensions` order (top-level; else ())."""
    tp_ns: int
    """Union of the step's TP collectives inside the phase (forward/backward phases; else 0)."""


class StepSpan(NamedTuple):
    """One analyzed step, with its phases and the communication measured inside it (a named
    tuple, as :class:`PhaseSpan`)."""

    step: int
    start_ns: int
    duration_ns: int
    cpu_ns: int
    """Thread CPU time of the step (negative: not measured)."""
    tokens: int
    samples: int
    comm_ns: int
    """Union of the step's collectives inside the step."""
    comm_by_dim: tuple[int, ...]
    """The same per dimension."""
    count_by_dim: tuple[int, ...]
    """Collectives issued in the step, per dimension."""
    bytes_by_dim: tuple[int, ...]
    """Their nccl-tests bytes (max(in, out)), per dimension."""
    phases: tuple[PhaseSpan, ...]
    """Phases of the step issued inside it, in recorded order."""


@dataclass(frozen=True, slots=True)
class StepTimeline:
    """One rank's analyzed steps, measured (the input of every later analysis step)."""

    steps: tuple[StepSpan, ...]
    warmup_steps: int
    """Steps left out at the start."""
    dimensions: tuple[str, ...]
    """Parallel dimensions of the recorded collectives, sorted (dp, tp, pp, world, other, ...)."""
    memory: np.ndarray
    """The rank's memory samples (MEMORY_DTYPE)."""


def _group_fields(g: Any) -> tuple[Sequence[int], str]:
    """(members, description) of a group record (or its JSON object); the members as they are
    (a ``Members`` range is not expanded: the world group at 100,000 ranks, once per rank)."""
    if isinstance(g, dict):
        return tuple(g.get("ranks", ())), str(g.get("desc", ""))
    ranks = getattr(g, "ranks", None)
    return (ranks if ranks is not None else ()), str(getattr(g, "desc", None) or "")


@dataclass(frozen=True, slots=True)
class _Collectives:
    """The rank's completed collectives, sorted by issue time (int64 ns, codes, bytes)."""

    start: np.ndarray
    end: np.ndarray
    dim: np.ndarray
    """Index into ``dims`` of each collective's parallel dimension."""
    nbytes: np.ndarray
    """nccl-tests bytes: max(in, out)."""
    dims: list[str]
    """The dimensions that occur, sorted."""


def _collectives(events: np.ndarray, groups: Sequence[Any], layout: Layout | None) -> _Collectives:
    """Completed events (duration ≥ 0), sorted by start, each with its group's dimension
    (events of an unknown group: "other")."""
    dims = [dimension_of(m, layout, desc) for m, desc in map(_group_fields, groups)]
    done = events["duration_ns"] >= 0
    ev = events if done.all() else events[done]  # (a lean load holds completed events only)
    ev_start = ev["start_ns"].astype(np.int64)
    ev_end = ev_start + ev["duration_ns"].astype(np.int64)
    labels = [*dims, "other"]
    g = ev["group"].astype(np.int64)
    ev_label = np.where(g < len(dims), g, len(dims))
    dim_names = sorted({str(labels[i]) for i in np.unique(ev_label).tolist()})
    to_code = np.asarray([dim_names.index(x) if x in dim_names else -1 for x in labels])
    ev_dcode = to_code[ev_label] if len(ev) else np.zeros(0, dtype=np.int64)
    ev_bytes = np.maximum(ev["in_bytes"], ev["out_bytes"]).astype(np.int64)
    order = np.argsort(ev_start, kind="stable")
    return _Collectives(ev_start[order], ev_end[order], ev_dcode[order], ev_bytes[order], dim_names)


def _phases_of_steps(phases: np.ndarray, steps: np.ndarray) -> list[list[int]]:
    """Per step, the indices of its phases: same step number, issued inside the step, in
    recorded order."""
    p_step = phases["step"].astype(np.int64)
    p_order = np.argsort(p_step, kind="stable")
    p_sorted = p_step[p_order]
    st_no = steps["step"].astype(np.int64)
    p_lo = np.searchsorted(p_sorted, st_no, side="left").tolist()
    p_hi = np.searchsorted(p_sorted, st_no, side="right").tolist()
    p_order_l = p_order.tolist()
    p_start = phases["start_ns"].astype(np.int64).tolist()
    t0s = steps["start_ns"].astype(np.int64)
    t1s = (t0s + steps["duration_ns"].astype(np.int64)).tolist()
    out = []
    for k, t0 in enumerate(t0s.tolist()):
        t1 = t1s[k]
        out.append([i for i in p_order_l[p_lo[k] : p_hi[k]] if t0 <= p_start[i] < t1])
    return out


@dataclass(frozen=True, slots=True)
class _Measured:
    """Union lengths (ns) per window, in window order: the top-level phases step by step, the
    forward/backward phases step by step, the steps; and per-step counts and bytes."""

    top: list[int]
    top_dim: list[list[int]]
    """[dimension][top-level phase window]."""
    fb_tp: list[int]
    """TP communication per forward/backward phase window."""
    step: list[int]
    step_dim: list[list[int]]
    count_dim: list[list[int]]
    bytes_dim: list[list[int]]


def _measure(
    c: _Collectives,
    steps: np.ndarray,
    phases: np.ndarray,
    step_ph: list[list[int]],
    is_fb: list[bool],
) -> _Measured:
    """Every per-step question ("communication of this subset of the step's collectives inside
    this window") for all steps at once (intervals.Segments): the step's collectives are those
    issued in [t0, t1), a contiguous range of the start-sorted events. One call per subset of
    the events (each computes that subset's union once) over all the windows."""
    st_start = steps["start_ns"].astype(np.int64)
    st_dur = steps["duration_ns"].astype(np.int64)
    seg_lo = np.searchsorted(c.start, st_start, side="left")
    seg_hi = np.maximum(np.searchsorted(c.start, st_start + st_dur, side="left"), seg_lo)
    segs = Segments(c.start, c.end, seg_lo, seg_hi, st_start)

    p_depth = phases["depth"].tolist()
    top = [(k, i) for k, ph_k in enumerate(step_ph) for i in ph_k if p_depth[i] == 1]
    fb = [(k, i) for k, ph_k in enumerate(step_ph) for i in ph_k if is_fb[i]]
    w_k = [k for k, _ in top + fb]
    w_i = [i for _, i in top + fb]
    p_start = phases["start_ns"].astype(np.int64)
    p_end = p_start + phases["duration_ns"].astype(np.int64)
    n_top, n_fb = len(top), len(fb)
    ws = np.concatenate([np.asarray(w_k, dtype=np.int64), np.arange(len(steps), dtype=np.int64)])
    wa = np.concatenate([p_start[np.asarray(w_i, dtype=np.int64)], st_start])
    wb = np.concatenate([p_end[np.asarray(w_i, dtype=np.int64)], st_start + st_dur])
    n_w = len(ws)
    top_sl, step_sl = slice(0, n_top), slice(n_top + n_fb, n_w)
    not_fb = np.r_[
        np.ones(n_top, dtype=bool),
        np.zeros(n_fb, dtype=bool),
        np.ones(n_w - n_top - n_fb, dtype=bool),
    ]
    sel_w = np.flatnonzero(not_fb)

    def totals(sub: np.ndarray | None, which: np.ndarray) -> np.ndarray:
        out = np.zeros(n_w, dtype=np.int64)
        out[which] = segs.clipped_totals(sub, ws[which], wa[which], wb[which])
        return out

    all_w = totals(None, sel_w)
    m = _Measured(all_w[top_sl].tolist(), [], [0] * n_fb, all_w[step_sl].tolist(), [], [], [])
    tp_code = c.dims.index("tp") if "tp" in c.dims else -1
    for di in range(len(c.dims)):
        sub = c.dim == di
        # the tp subset also answers the fb windows
        w = totals(sub, np.arange(n_w) if di == tp_code else sel_w)
        m.top_dim.append(w[top_sl].tolist())
        m.step_dim.append(w[step_sl].tolist())
        if di == tp_code:
            m.fb_tp[:] = w[n_top : n_top + n_fb].tolist()
        cs = np.zeros(len(sub) + 1, dtype=np.int64)
        np.cumsum(sub, out=cs[1:])
        m.count_dim.append((cs[seg_hi] - cs[seg_lo]).tolist())
        np.cumsum(np.where(sub, c.nbytes, 0), out=cs[1:])
        m.bytes_dim.append((cs[seg_hi] - cs[seg_lo]).tolist())
    return m


def _phase_spans(
    phases: np.ndarray,
    names: list[str],
    step_ph: list[list[int]],
    is_fb: list[bool],
    m: _Measured,
) -> list[tuple[PhaseSpan, ...]]:
    """Per step, its phases with their measured communication (windows taken in the order
    :func:`_measure` made them)."""
    p_nm = phases["name"].tolist()
    p_start = phases["start_ns"].astype(np.int64).tolist()
    p_dur = phases["duration_ns"].astype(np.int64).tolist()
    p_cpu = phases["cpu_ns"].astype(np.int64).tolist()
    p_depth = phases["depth"].tolist()
    p_label = [names[i] if i < len(names) else str(i) for i in p_nm]
    p_is_chunk = [i < len(names) and names[i] in PIPELINE_CHUNKS for i in p_nm]
    out: list[tuple[PhaseSpan, ...]] = []
    top_w = fb_w = 0
    for ph_k in step_ph:
        made: list[PhaseSpan] = []
        for i in ph_k:
            comm, tp = 0, 0
            by_dim: tuple[int, ...] = ()
            if p_depth[i] == 1:
                comm, by_dim = m.top[top_w], tuple(c[top_w] for c in m.top_dim)
                top_w += 1
            if is_fb[i]:
                tp = m.fb_tp[fb_w]
                fb_w += 1
            made.append(
                PhaseSpan(
                    name=p_label[i],
                    start_ns=p_start[i],
                    duration_ns=p_dur[i],
                    cpu_ns=p_cpu[i],
                    depth=p_depth[i],
                    is_fb=is_fb[i],
                    is_chunk=p_is_chunk[i],
                    comm_ns=comm,
                    comm_by_dim=by_dim,
                    tp_ns=tp,
                )
            )
        out.append(tuple(made))
    return out


def build_timeline(
    spans: np.ndarray,
    span_names: Sequence[str],
    events: np.ndarray,
    groups: Sequence[Any],
    memory: np.ndarray,
    layout: Layout | None,
    warmup_steps: int,
    skip_steps: Sequence[int] = (),
) -> StepTimeline:
    """Measure one rank. ``spans``/``events``/``memory`` are SPAN_DTYPE, EVENT_DTYPE and
    MEMORY_DTYPE arrays on the same clock; ``groups`` index the events' group codes. Steps are
    taken in start order; the first ``warmup_steps`` (at most all but one) are left out, and
    the steps numbered in ``skip_steps`` (meshprof's own instrumented ones) unless that would
    leave none."""
    names = list(span_names)
    steps_all = spans[(spans["kind"] == _STEP)]
    steps_all = steps_all[np.argsort(steps_all["start_ns"], kind="stable")]
    warm = min(warmup_steps, max(len(steps_all) - 1, 0))
    steps = steps_all[warm:]
    if len(skip_steps) and len(steps):
        keep = ~np.isin(steps["step"], np.asarray(skip_steps, dtype=np.int64))
        if keep.any():
            steps = steps[keep]
    phases = spans[spans["kind"] == _PHASE]
    is_fb = [i < len(names) and names[i] in FB_PHASES for i in phases["name"].tolist()]
    coll = _collectives(events, groups, layout)
    step_ph = _phases_of_steps(phases, steps)
    m = _measure(coll, steps, phases, step_ph, is_fb)
    step_phases = _phase_spans(phases, names, step_ph, is_fb, m)
    rows = zip(
        steps["step"].astype(np.int64).tolist(),
        steps["start_ns"].astype(np.int64).tolist(),
        steps["duration_ns"].astype(np.int64).tolist(),
        steps["cpu_ns"].astype(np.int64).tolist(),
        steps["tokens"].astype(np.int64).tolist(),
        steps["samples"].astype(np.int64).tolist(),
        strict=True,
    )
    out = tuple(
        StepSpan(
            step=s_no,
            start_ns=t0,
            duration_ns=dur,
            cpu_ns=cpu,
            tokens=tok,
            samples=smp,
            comm_ns=m.step[k],
            comm_by_dim=tuple(c[k] for c in m.step_dim),
            count_by_dim=tuple(c[k] for c in m.count_dim),
            bytes_by_dim=tuple(c[k] for c in m.bytes_dim),
            phases=step_phases[k],
        )
        for k, (s_no, t0, dur, cpu, tok, smp) in enumerate(rows)
    )
    return StepTimeline(out, warm, tuple(coll.dims), memory)

"""First step of the step analysis: one rank's recorded arrays → a :class:`StepTimeline`.

The timeline holds the analyzed steps (after warm-up), each with its phases, and every
communication figure the later steps need, already measured: the length of the union of the
step's collectives [issue, completion] inside the step, inside each top-level phase (overall
and per parallel dimension) and, for tensor parallelism, inside each forward/backward phase.
A step's collectives are those issued inside it. Times are nanoseconds on the rank's clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from meshprof.analyze.compute.intervals import Segments
from meshprof.events import MEMORY_DTYPE, PIPELINE_CHUNKS, SPAN_KINDS
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
class StepColumns:
    """The analyzed steps, column by column: int64 arrays of one entry per step (S), and
    [dimension, step] arrays (D × S, dimensions in :attr:`StepTimeline.dimensions` order)."""

    step: np.ndarray
    start_ns: np.ndarray
    duration_ns: np.ndarray
    cpu_ns: np.ndarray
    """Thread CPU time of the step (negative: not measured)."""
    tokens: np.ndarray
    samples: np.ndarray
    comm_ns: np.ndarray
    """Union of the step's collectives inside the step (ns)."""
    comm_by_dim: np.ndarray
    """The same per dimension (D × S, ns)."""
    count_by_dim: np.ndarray
    """Collectives issued in the step, per dimension (D × S)."""
    bytes_by_dim: np.ndarray
    """Their nccl-tests bytes (max(in, out)), per dimension (D × S)."""


@dataclass(frozen=True, slots=True)
class PhaseColumns:
    """The phases of the analyzed steps, column by column (P entries): step after step, each
    step's phases in recorded order (the order of :attr:`StepSpan.phases`)."""

    step_index: np.ndarray
    """Index of the phase's step in :class:`StepColumns` (int64, non-decreasing)."""
    name: np.ndarray
    """Index of the phase's name in :attr:`names` (int64)."""
    names: tuple[str, ...]
    """The distinct phase names (a name index the span-name table lacks: its number)."""
    start_ns: np.ndarray
    duration_ns: np.ndarray
    cpu_ns: np.ndarray
    """Thread CPU time inside the phase (negative: not measured)."""
    depth: np.ndarray
    """1 for a top-level phase (directly inside the step)."""
    is_fb: np.ndarray
    """A forward/backward phase (:data:`FB_PHASES`; bool)."""
    is_chunk: np.ndarray
    """A pipeline micro-batch chunk (:data:`meshprof.events.PIPELINE_CHUNKS`; bool)."""
    comm_ns: np.ndarray
    """Union of the step's collectives inside the phase (top-level phases; else 0; ns)."""
    comm_by_dim: np.ndarray
    """The same per dimension (D × P; top-level phases; else 0; ns)."""
    tp_ns: np.ndarray
    """Union of the step's TP collectives inside the phase (forward/backward phases; else 0)."""

    def labels(self) -> list[str]:
        """Each phase's name."""
        return [self.names[i] for i in self.name.tolist()]


@dataclass(frozen=True, slots=True)
class StepTimeline:
    """One rank's analyzed steps, measured (the input of every later analysis step), as
    columns: :attr:`steps` per step, :attr:`phases` per phase of those steps."""

    steps: StepColumns
    phases: PhaseColumns
    warmup_steps: int
    """Steps left out at the start."""
    dimensions: tuple[str, ...]
    """Parallel dimensions of the recorded collectives, sorted (dp, tp, pp, world, other, ...)."""
    memory: np.ndarray
    """The rank's memory samples (MEMORY_DTYPE)."""
    cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """Figures derived from the timeline that several analysis steps read, computed once
    (:func:`meshprof.analyze.steps.exposure.exposure`, the pipeline chunks' cover)."""

    @property
    def count(self) -> int:
        """Analyzed steps."""
        return len(self.steps.step)


def _i64(values: Any) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def timeline_of_spans(
    steps: Sequence[StepSpan],
    dimensions: Sequence[str],
    memory: np.ndarray | None = None,
    warmup_steps: int = 0,
) -> StepTimeline:
    """The timeline of steps already measured one by one (the live ledger's), as columns."""
    nd = len(dimensions)
    flat = [(k, p) for k, st in enumerate(steps) for p in st.phases]
    names = sorted({p.name for _, p in flat})
    code = {n: i for i, n in enumerate(names)}
    zeros = (0,) * nd
    cols = StepColumns(
        step=_i64([st.step for st in steps]),
        start_ns=_i64([st.start_ns for st in steps]),
        duration_ns=_i64([st.duration_ns for st in steps]),
        cpu_ns=_i64([st.cpu_ns for st in steps]),
        tokens=_i64([st.tokens for st in steps]),
        samples=_i64([st.samples for st in steps]),
        comm_ns=_i64([st.comm_ns for st in steps]),
        comm_by_dim=_i64([st.comm_by_dim for st in steps]).reshape(len(steps), nd).T,
        count_by_dim=_i64([st.count_by_dim for st in steps]).reshape(len(steps), nd).T,
        bytes_by_dim=_i64([st.bytes_by_dim for st in steps]).reshape(len(steps), nd).T,
    )
    phases = PhaseColumns(
        step_index=_i64([k for k, _ in flat]),
        name=_i64([code[p.name] for _, p in flat]),
        names=tuple(names),
        start_ns=_i64([p.start_ns for _, p in flat]),
        duration_ns=_i64([p.duration_ns for _, p in flat]),
        cpu_ns=_i64([p.cpu_ns for _, p in flat]),
        depth=_i64([p.depth for _, p in flat]),
        is_fb=np.asarray([p.is_fb for _, p in flat], dtype=bool),
        is_chunk=np.asarray([p.is_chunk for _, p in flat], dtype=bool),
        comm_ns=_i64([p.comm_ns for _, p in flat]),
        comm_by_dim=_i64([p.comm_by_dim or zeros for _, p in flat]).reshape(len(flat), nd).T,
        tp_ns=_i64([p.tp_ns for _, p in flat]),
    )
    mem = memory if memory is not None else np.zeros(0, dtype=MEMORY_DTYPE)
    return StepTimeline(cols, phases, warmup_steps, tuple(dimensions), mem)


def _group_fields(g: Any) -> tuple[Sequence[int], str, Sequence[str]]:
    """(members, description, DeviceMesh names) of a group record (or its JSON object); the
    members as they are (a ``Members`` range is not expanded: the world group at 100,000
    ranks, once per rank)."""
    if isinstance(g, dict):
        names = g.get("mesh_dims") or ()
        return tuple(g.get("ranks", ())), str(g.get("desc", "")), tuple(map(str, names))
    ranks = getattr(g, "ranks", None)
    names = getattr(g, "mesh_dims", None) or ()
    return (ranks if ranks is not None else ()), str(getattr(g, "desc", None) or ""), names


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
    dims = [dimension_of(m, layout, d, names) for m, d, names in map(_group_fields, groups)]
    done = events["duration_ns"] >= 0
    ev = events if done.all() else events[done]  # (a lean load holds completed events only)
    ev_start = ev["start_ns"].astype(np.int64)
    ev_end = ev_start + ev["duration_ns"].astype(np.int64)
    labels = [*dims, "other"]
    g = ev["group"].astype(np.int64)
    ev_label = np.where(g < len(dims), g, len(dims))
    dim_names = sorted({str(labels[i]) for i in np.flatnonzero(np.bincount(ev_label)).tolist()})
    to_code = np.asarray([dim_names.index(x) if x in dim_names else -1 for x in labels])
    ev_dcode = to_code[ev_label] if len(ev) else np.zeros(0, dtype=np.int64)
    ev_bytes = np.maximum(ev["in_bytes"], ev["out_bytes"]).astype(np.int64)
    if (ev_start[1:] >= ev_start[:-1]).all():  # (recorded in issue order: nearly always)
        return _Collectives(ev_start, ev_end, ev_dcode, ev_bytes, dim_names)
    order = np.argsort(ev_start, kind="stable")
    return _Collectives(ev_start[order], ev_end[order], ev_dcode[order], ev_bytes[order], dim_names)


def _phases_of_steps(
    phases: np.ndarray, st_no: np.ndarray, t0: np.ndarray, t1: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(phase row, step index) of every phase of the steps: same step number, issued inside
    the step [t0, t1); step after step, each step's in recorded order."""
    p_step = phases["step"].astype(np.int64)
    p_order = np.argsort(p_step, kind="stable")
    p_sorted = p_step[p_order]
    lo = np.searchsorted(p_sorted, st_no, side="left")
    n = np.searchsorted(p_sorted, st_no, side="right") - lo
    k = np.repeat(np.arange(len(st_no), dtype=np.int64), n)
    first = np.cumsum(n) - n
    rows = p_order[np.arange(len(k), dtype=np.int64) - first[k] + lo[k]]
    p_start = phases["start_ns"][rows].astype(np.int64)
    inside = (t0[k] <= p_start) & (p_start < t1[k])
    return rows[inside], k[inside]


@dataclass(frozen=True, slots=True)
class _Measured:
    """Union lengths (ns) of the step's collectives, overall and per dimension, inside each
    top-level phase and each step; TP inside each forward/backward phase; counts and bytes."""

    top: np.ndarray
    top_dim: np.ndarray
    """D × top-level phases."""
    fb_tp: np.ndarray
    step: np.ndarray
    step_dim: np.ndarray
    """D × steps."""
    count_dim: np.ndarray
    bytes_dim: np.ndarray


def _measure(
    c: _Collectives,
    t0: np.ndarray,
    t1: np.ndarray,
    top: tuple[np.ndarray, np.ndarray, np.ndarray],
    fb: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> _Measured:
    """Every per-step question ("union of this subset of the step's collectives inside this
    window") for all steps at once, with one :class:`Segments` call: a step's collectives are
    those issued in [t0, t1); subset 0 is every collective, subset 1 + d those of dimension d,
    and each (subset, step) is one segment (the subset's collectives of the step: a contiguous
    range of its start-sorted ones). ``top`` and ``fb`` are (step index, start, end) of the
    top-level and the forward/backward phase windows."""
    n_st, nd, n = len(t0), len(c.dims), len(c.start)
    order = np.argsort(c.dim, kind="stable")  # by dimension, in start order within each
    # of the first i collectives (start order), how many are of each dimension, and their bytes
    of_dim = c.dim == np.arange(nd, dtype=np.int64)[:, None]
    counts = np.zeros((2 * nd, n + 1), dtype=np.int64)
    np.cumsum(np.concatenate([of_dim, of_dim * c.nbytes]), axis=1, out=counts[:, 1:])
    lo_all = np.searchsorted(c.start, t0, side="left")
    hi_all = np.maximum(np.searchsorted(c.start, t1, side="left"), lo_all)
    # a step's collectives of dimension d: a range of its block (start order within it)
    block = n + counts[:nd, -1].cumsum() - counts[:nd, -1]
    lo = np.concatenate([lo_all[None, :], block[:, None] + counts[:nd, lo_all]])
    hi = np.concatenate([hi_all[None, :], block[:, None] + counts[:nd, hi_all]])
    segs = Segments(
        np.concatenate([c.start, c.start[order]]),
        np.concatenate([c.end, c.end[order]]),
        lo.ravel(),
        hi.ravel(),
        np.concatenate([t0] * (nd + 1)),
    )
    k_top, a_top, b_top = top
    k_fb, a_fb, b_fb = fb
    n_top = len(k_top)
    tp = c.dims.index("tp") if "tp" in c.dims else -1
    with_fb = tp >= 0 and len(k_fb) > 0
    # windows: every subset's top-level phases, then its steps, then TP's fb phases
    q_of = np.arange(nd + 1, dtype=np.int64)[:, None] * n_st
    seg = np.concatenate(
        [
            (q_of + np.concatenate([k_top, np.arange(n_st, dtype=np.int64)])).ravel(),
            *([(1 + tp) * n_st + k_fb] if with_fb else []),
        ]
    )
    wa = np.concatenate([*[a_top, t0] * (nd + 1), *([a_fb] if with_fb else [])])
    wb = np.concatenate([*[b_top, t1] * (nd + 1), *([b_fb] if with_fb else [])])
    got = segs.clipped_totals(None, seg, wa, wb)
    per_q = got[: (nd + 1) * (n_top + n_st)].reshape(nd + 1, n_top + n_st)
    fb_tp = got[(nd + 1) * (n_top + n_st) :]
    return _Measured(
        top=per_q[0, :n_top],
        top_dim=per_q[1:, :n_top],
        fb_tp=fb_tp if with_fb else np.zeros(len(k_fb), dtype=np.int64),
        step=per_q[0, n_top:],
        step_dim=per_q[1:, n_top:],
        count_dim=counts[:nd, hi_all] - counts[:nd, lo_all],
        bytes_dim=counts[nd:, hi_all] - counts[nd:, lo_all],
    )


def _names(codes: np.ndarray, span_names: list[str]) -> tuple[np.ndarray, tuple[str, ...]]:
    """(name index of each phase, the distinct names) of phases of span-name codes ``codes``
    (a code the table lacks is named by its number)."""
    used = np.flatnonzero(np.bincount(codes)).tolist()
    labels = [span_names[i] if i < len(span_names) else str(i) for i in used]
    distinct = sorted(set(labels))
    to_name = np.zeros(used[-1] + 1 if used else 0, dtype=np.int64)
    to_name[used] = [distinct.index(x) for x in labels]
    return to_name[codes], tuple(distinct)


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
    kind = spans["kind"]
    steps_all = spans[kind == _STEP]
    steps_all = steps_all[np.argsort(steps_all["start_ns"], kind="stable")]
    warm = min(warmup_steps, max(len(steps_all) - 1, 0))
    steps = steps_all[warm:]
    if len(skip_steps) and len(steps):
        keep = ~np.isin(steps["step"], np.asarray(skip_steps, dtype=np.int64))
        if keep.any():
            steps = steps[keep]
    st_no = steps["step"].astype(np.int64)
    t0 = steps["start_ns"].astype(np.int64)
    dur = steps["duration_ns"].astype(np.int64)
    t1 = t0 + dur
    all_phases = spans[kind == _PHASE]
    rows, k = _phases_of_steps(all_phases, st_no, t0, t1)
    ph = all_phases[rows]
    name, names = _names(ph["name"].astype(np.int64), list(span_names))
    is_fb = np.asarray([x in FB_PHASES for x in names], dtype=bool)[name]
    is_chunk = np.asarray([x in PIPELINE_CHUNKS for x in names], dtype=bool)[name]
    p_start = ph["start_ns"].astype(np.int64)
    p_dur = ph["duration_ns"].astype(np.int64)
    p_end = p_start + p_dur
    depth = ph["depth"].astype(np.int64)
    top = np.flatnonzero(depth == 1)
    fb = np.flatnonzero(is_fb)
    coll = _collectives(events, groups, layout)
    m = _measure(coll, t0, t1, (k[top], p_start[top], p_end[top]), (k[fb], p_start[fb], p_end[fb]))
    nd, n_ph = len(coll.dims), len(ph)
    comm = np.zeros(n_ph, dtype=np.int64)
    comm[top] = m.top
    comm_by_dim = np.zeros((nd, n_ph), dtype=np.int64)
    comm_by_dim[:, top] = m.top_dim
    tp_ns = np.zeros(n_ph, dtype=np.int64)
    tp_ns[fb] = m.fb_tp
    phases = PhaseColumns(
        step_index=k,
        name=name,
        names=names,
        start_ns=p_start,
        duration_ns=p_dur,
        cpu_ns=ph["cpu_ns"].astype(np.int64),
        depth=depth,
        is_fb=is_fb,
        is_chunk=is_chunk,
        comm_ns=comm,
        comm_by_dim=comm_by_dim,
        tp_ns=tp_ns,
    )
    cols = StepColumns(
        step=st_no,
        start_ns=t0,
        duration_ns=dur,
        cpu_ns=steps["cpu_ns"].astype(np.int64),
        tokens=steps["tokens"].astype(np.int64),
        samples=steps["samples"].astype(np.int64),
        comm_ns=m.step,
        comm_by_dim=m.step_dim,
        count_by_dim=m.count_dim,
        bytes_by_dim=m.bytes_dim,
    )
    return StepTimeline(cols, phases, warm, tuple(coll.dims), memory)

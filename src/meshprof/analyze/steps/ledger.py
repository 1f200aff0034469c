"""Analysis step: the rank's time ledger — its analysed steps' wall time split into causes
(:class:`meshprof.records.ledger.TimeCause`), the parts summing to the wall time exactly.

A step is taken phase by phase (its top-level phases, then the rest of the step outside them),
with the exposed communication of each measured as :mod:`.communication` measures it (blocked
time, capped by the communication inside, split over the dimensions by their communication):

* a phase's exposed communication goes to ``exposed_comm_<dim>`` (dp, tp, pp, other);
* the rest of a data-loading phase (:data:`~.phases.DATA_PHASES`) to ``data_loading``, of an
  optimizer or checkpoint phase (:data:`OPTIMIZER_PHASES`) to ``optimizer``;
* in the pipeline schedule's window (the top-level phase that holds the stage's micro-batch
  chunks most, or the step when the chunks are its top-level phases), the time not covered by a
  chunk is ``pipeline_bubble`` — the stage's pipeline communication there included (a stage
  waiting for its neighbour is in the bubble);
* the rest of any other phase is ``compute``;
* the rest of the step outside its phases is ``idle`` (unattributed) when the step has phases,
  else ``compute`` (a step recorded without phases is compute and communication only).

The straggler wait is carved out of the exposed communication across ranks
(:mod:`meshprof.analyze.run.conclusions.ledger`): one rank cannot see who it waited for.
"""

from __future__ import annotations

import numpy as np

from meshprof.analyze.steps.bubble import chunk_cover, schedule_window
from meshprof.analyze.steps.exposure import exposure
from meshprof.analyze.steps.options import StepOptions
from meshprof.analyze.steps.phases import DATA_PHASES
from meshprof.analyze.steps.timeline import StepSpan, StepTimeline, timeline_of_spans
from meshprof.analyze.steps.types import StepAnalysis, updated
from meshprof.records.ledger import TimeCause, exposed_cause

OPTIMIZER_PHASES = ("optimizer", "optimizer_step", "optim", "checkpoint", "ckpt", "save")
"""Phase names of the optimizer step and of checkpointing."""

CAUSES = tuple(c.value for c in TimeCause)
"""Every cause, in :class:`TimeCause` order (a ledger lists them all, 0 when none)."""

_COL = {c: i for i, c in enumerate(CAUSES)}
_DATA, _OPT, _BUBBLE, _COMPUTE, _IDLE = (
    _COL[c]
    for c in (
        TimeCause.DATA_LOADING,
        TimeCause.OPTIMIZER,
        TimeCause.BUBBLE,
        TimeCause.COMPUTE,
        TimeCause.IDLE,
    )
)


def _pick(cond: np.ndarray, yes: np.ndarray | float, no: np.ndarray | float) -> np.ndarray:
    return np.where(cond, yes, no)


def step_parts(t: StepTimeline) -> np.ndarray:
    """Each step's wall time by cause (steps × :data:`CAUSES`, float64 ns summing to the step's
    duration), phase by phase: each step's parts are summed in the order of a loop over its
    top-level phases (each one's exposed shares by dimension, then the rest of the phase), then
    the rest of the step (its exposed shares, then the rest), from 0.0 (``np.bincount`` adds
    its weights one by one in index order)."""
    e = exposure(t)
    ph = t.phases
    dims = t.dimensions
    nd, n_st, nc = len(dims), t.count, len(CAUSES)
    n_top = len(e.top)
    pp = dims.index("pp") if "pp" in dims else -1
    dim_cause = np.asarray([_COL[exposed_cause(d)] for d in dims], dtype=np.int64)
    cover = chunk_cover(t)
    win = np.zeros(n_top, dtype=bool)
    in_bubble = np.zeros(n_st, dtype=bool)
    idle = np.zeros(n_top, dtype=np.int64)
    dur = ph.duration_ns[e.top]
    if cover is not None:
        w = schedule_window(t, cover, strict=True)
        win[w[w >= 0]] = True
        in_bubble = (w < 0) & cover.has_chunks
        idle = dur - cover.in_top  # the window's time the chunks leave uncovered
    shares = e.shares
    pp_exp = np.zeros(n_top)
    if pp >= 0 and win.any():  # the window's pipeline share is its bubble, not exposed pp
        pp_exp = _pick(win, shares[pp], 0.0)
        shares = shares.copy()
        shares[pp] = _pick(win, 0.0, shares[pp])
    base = dur - e.exposed
    names = ph.names
    data = np.asarray([n in DATA_PHASES for n in names], dtype=bool)[ph.name[e.top]]
    opt = np.asarray([n in OPTIMIZER_PHASES for n in names], dtype=bool)[ph.name[e.top]] & ~data
    in_win = win & ~data & ~opt
    x = idle - pp_exp
    x = _pick(x < 0.0, 0.0, x)  # max(x, 0.0)
    extra = _pick(base < x, base, x)  # min(x, base)
    k = e.top_step[:, None] * nc
    slots_top = np.empty((n_top, nd + 2), dtype=np.int64)
    slots_top[:, :nd] = k + dim_cause
    cause = _pick(data, _DATA, _pick(opt, _OPT, _pick(in_win, _BUBBLE, _COMPUTE)))
    slots_top[:, nd] = k[:, 0] + cause
    slots_top[:, nd + 1] = k[:, 0] + _COMPUTE
    w_top = np.empty((n_top, nd + 2))
    w_top[:, :nd] = shares.T
    w_top[:, nd] = _pick(in_win, pp_exp + extra, base)
    w_top[:, nd + 1] = _pick(in_win, base - extra, 0.0)
    ks = np.arange(n_st, dtype=np.int64)[:, None] * nc
    slots_rest = np.empty((n_st, nd + 1), dtype=np.int64)
    slots_rest[:, :nd] = ks + dim_cause
    if pp >= 0:
        slots_rest[:, pp] = _pick(in_bubble, ks[:, 0] + _BUBBLE, slots_rest[:, pp])
    slots_rest[:, nd] = ks[:, 0] + _pick(in_bubble, _BUBBLE, _pick(e.has_top, _IDLE, _COMPUTE))
    w_rest = np.empty((n_st, nd + 1))
    w_rest[:, :nd] = e.rest_shares.T
    r = e.rest_wall - e.rest_exposed
    w_rest[:, nd] = _pick(r < 0.0, 0.0, r)  # max(r, 0.0)
    parts = np.bincount(
        np.concatenate([slots_top.ravel(), slots_rest.ravel()]),
        weights=np.concatenate([w_top.ravel(), w_rest.ravel()]),
        minlength=n_st * nc,
    )
    return parts.reshape(n_st, nc)


def step_ledger(st: StepSpan, dims: tuple[str, ...]) -> dict[str, float]:
    """One step's wall time by cause (ns, floats summing to the step's duration)."""
    return dict(zip(CAUSES, step_parts(timeline_of_spans([st], dims))[0].tolist(), strict=True))


def whole_ns(parts: dict[str, float], wall_ns: int) -> dict[str, int]:
    """``parts`` in whole ns summing to ``wall_ns`` exactly: each part rounded down, the
    remainders handed out largest first (a part is never negative)."""
    floors = {k: max(int(v), 0) for k, v in parts.items()}
    left = wall_ns - sum(floors.values())
    if left > 0:
        order = sorted(parts, key=lambda k: -(parts[k] - int(parts[k])))
        for k in order[:left]:
            floors[k] += 1
        left -= min(left, len(order))
        floors[TimeCause.IDLE] += left  # (only when the floats fell short by more than one ns each)
    elif left < 0:  # the floats overshot (rounding): take it from the largest parts
        for k in sorted(floors, key=lambda k: -floors[k]):
            take = min(floors[k], -left)
            floors[k] -= take
            left += take
            if left == 0:
                break
    return floors


def add_ledger(a: StepAnalysis, t: StepTimeline, o: StepOptions) -> StepAnalysis:
    """Fill ``ledger``: the analysed steps' wall time by cause (ns, summing to their total;
    the steps' parts summed step after step, from 0.0)."""
    parts = step_parts(t)
    totals = np.cumsum(parts, axis=0)[-1].tolist() if len(parts) else [0.0] * len(CAUSES)
    wall = int(t.steps.duration_ns.sum())
    return updated(
        a, ledger=whole_ns(dict(zip(CAUSES, totals, strict=True)), wall), ledger_wall_ns=wall
    )

"""Exposed communication of every analyzed step, phase by phase, for all steps at once: the walk
:mod:`.communication` (exposed time per dimension) and :mod:`.ledger` (wall time by cause) share.

For each top-level phase the thread's *blocked* time is wall − CPU time (the wall time when the
CPU time is not measured); the phase's exposed communication is min(max(blocked, 0), the
communication inside it). The rest of the step, outside its top-level phases: blocked = its
wall time − (the step's CPU time − the phases' measured CPU time), exposed = min(max(blocked,
0), the communication outside the phases) when there is any. An exposed amount is split over
the dimensions in proportion to each one's communication inside the phase (the rest: inside
the step) when both are positive.

The figures are those of a loop over the steps and their phases, bit for bit: every integer is
exact, and each float accumulated here is summed in the loop's order (``np.bincount`` adds its
weights one by one in index order, from 0.0).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshprof.analyze.steps.timeline import StepTimeline


@dataclass(frozen=True, slots=True)
class Exposure:
    """Exposed communication (ns) of a timeline's top-level phases and steps."""

    top: np.ndarray
    """Index of each top-level phase in the timeline's phase columns (step by step)."""
    top_step: np.ndarray
    """Its step's index."""
    exposed: np.ndarray
    """Exposed communication of each top-level phase (float64, whole ns)."""
    shares: np.ndarray
    """D × top-level phases: its split over the dimensions (float64; 0.0 where not split)."""
    rest_wall: np.ndarray
    """Per step: wall time outside its top-level phases (int64)."""
    rest_exposed: np.ndarray
    """Per step: exposed communication outside them (float64, whole ns; 0.0 without any
    communication there)."""
    rest_shares: np.ndarray
    """D × steps: its split over the dimensions (float64; 0.0 where not split)."""
    has_top: np.ndarray
    """Per step: it has top-level phases (bool)."""
    total: np.ndarray
    """Per step: exposed communication in all (int64)."""
    by_dim: np.ndarray
    """D × steps: exposed communication per dimension, phase shares then the rest's, summed
    in that order (float64)."""


def _split(amount_i: np.ndarray, amount: np.ndarray, per_dim: np.ndarray) -> np.ndarray:
    """amount × comm_d / Σ comm (float64, D × n) where the amount and Σ comm are positive,
    else 0.0 (the same float operations as ``amount * v / tot`` on Python numbers)."""
    tot = per_dim.sum(axis=0)
    ok = (amount_i > 0) & (tot > 0)
    return np.where(ok, amount * per_dim / np.where(tot > 0, tot, 1), 0.0)


def _segment_sums(values: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Row sums of ``values`` (int64, m × n) over the column ranges bounds[k]:bounds[k+1]."""
    cs = np.zeros((len(values), values.shape[1] + 1), dtype=np.int64)
    np.cumsum(values, axis=1, out=cs[:, 1:])
    return cs[:, bounds[1:]] - cs[:, bounds[:-1]]


def exposure(t: StepTimeline) -> Exposure:
    """The exposed communication of every top-level phase and step of ``t`` (computed once
    per timeline)."""
    got = t.cache.get("exposure")
    if isinstance(got, Exposure):
        return got
    ph, st = t.phases, t.steps
    n_st = t.count
    top = np.flatnonzero(ph.depth == 1)
    k = ph.step_index[top]
    dur, cpu, comm = ph.duration_ns[top], ph.cpu_ns[top], ph.comm_ns[top]
    exp_i = np.minimum(np.maximum(np.where(cpu >= 0, dur - cpu, dur), 0), comm)
    exp = exp_i.astype(np.float64)
    shares = _split(exp_i, exp, ph.comm_by_dim[:, top])
    bounds = np.searchsorted(k, np.arange(n_st + 1, dtype=np.int64))
    cov_wall, cov_cpu, cov_comm, cov_exp = _segment_sums(
        np.stack([dur, np.maximum(cpu, 0), comm, exp_i]), bounds
    )
    rest_wall = st.duration_ns - cov_wall
    rest_comm = np.maximum(st.comm_ns - cov_comm, 0)
    rest_blocked = np.where(st.cpu_ns >= 0, rest_wall - (st.cpu_ns - cov_cpu), rest_wall)
    rest_i = np.where(rest_comm > 0, np.minimum(np.maximum(rest_blocked, 0), rest_comm), 0)
    rest = rest_i.astype(np.float64)
    rest_shares = _split(rest_i, rest, st.comm_by_dim)
    nd = len(t.dimensions)
    slot = (np.arange(nd, dtype=np.int64)[:, None] * n_st + k).ravel()
    by_dim = np.bincount(slot, weights=shares.ravel(), minlength=nd * n_st).reshape(nd, n_st)
    out = Exposure(
        top=top,
        top_step=k,
        exposed=exp,
        shares=shares,
        rest_wall=rest_wall,
        rest_exposed=rest,
        rest_shares=rest_shares,
        has_top=bounds[1:] > bounds[:-1],
        total=cov_exp + rest_i,
        by_dim=by_dim + rest_shares,
    )
    t.cache["exposure"] = out
    return out

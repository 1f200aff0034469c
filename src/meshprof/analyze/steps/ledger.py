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
(:mod:`meshprof.analyze.run.ledger`): one rank cannot see who it waited for.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from meshprof.analyze.compute.intervals import clipped_total
from meshprof.analyze.steps.options import StepOptions
from meshprof.analyze.steps.phases import DATA_PHASES
from meshprof.analyze.steps.timeline import PhaseSpan, StepSpan, StepTimeline
from meshprof.analyze.steps.types import StepAnalysis
from meshprof.records.ledger import TimeCause, exposed_cause

OPTIMIZER_PHASES = ("optimizer", "optimizer_step", "optim", "checkpoint", "ckpt", "save")
"""Phase names of the optimizer step and of checkpointing."""

CAUSES = tuple(c.value for c in TimeCause)
"""Every cause, in :class:`TimeCause` order (a ledger lists them all, 0 when none)."""


def _exposed(blocked: int, comm_ns: int) -> float:
    return float(min(max(blocked, 0), comm_ns))


def _window(st: StepSpan, chunks: list[PhaseSpan]) -> PhaseSpan | None:
    """The top-level non-chunk phase overlapping the chunks most (None: the step itself)."""
    if not chunks:
        return None
    cs = np.asarray([p.start_ns for p in chunks], dtype=np.int64)
    ce = cs + np.asarray([p.duration_ns for p in chunks], dtype=np.int64)
    best, found = 0, None
    for p in st.phases:
        if p.depth != 1 or p.is_chunk:
            continue
        ov = clipped_total(cs, ce, p.start_ns, p.start_ns + p.duration_ns)
        if ov > best:
            best, found = ov, p
    return found


def _chunk_union(chunks: list[PhaseSpan], lo: int, hi: int) -> int:
    cs = np.asarray([p.start_ns for p in chunks], dtype=np.int64)
    ce = cs + np.asarray([p.duration_ns for p in chunks], dtype=np.int64)
    return int(clipped_total(cs, ce, lo, hi))


def step_ledger(st: StepSpan, dims: tuple[str, ...]) -> dict[str, float]:
    """One step's wall time by cause (ns, floats summing to the step's duration)."""
    parts = dict.fromkeys(CAUSES, 0.0)
    pp = dims.index("pp") if "pp" in dims else -1
    chunks = [p for p in st.phases if p.is_chunk]
    window = _window(st, chunks)
    top = [p for p in st.phases if p.depth == 1]
    covered_wall = covered_cpu = covered_comm = 0
    for p in top:
        covered_wall += p.duration_ns
        covered_cpu += max(p.cpu_ns, 0)
        covered_comm += p.comm_ns
        blocked = p.duration_ns - p.cpu_ns if p.cpu_ns >= 0 else p.duration_ns
        exp = _exposed(blocked, p.comm_ns)
        pp_exp = 0.0
        tot = sum(p.comm_by_dim)
        if exp > 0 and tot > 0:
            for d, v in zip(dims, p.comm_by_dim, strict=True):
                share = exp * v / tot
                if p is window and d == "pp":
                    pp_exp = share
                else:
                    parts[exposed_cause(d)] += share
        base = p.duration_ns - exp
        if p.name in DATA_PHASES:
            parts[TimeCause.DATA_LOADING] += base
        elif p.name in OPTIMIZER_PHASES:
            parts[TimeCause.OPTIMIZER] += base
        elif p is window:
            idle = p.duration_ns - _chunk_union(chunks, p.start_ns, p.start_ns + p.duration_ns)
            extra = min(max(idle - pp_exp, 0.0), base)
            parts[TimeCause.BUBBLE] += pp_exp + extra
            parts[TimeCause.COMPUTE] += base - extra
        else:
            parts[TimeCause.COMPUTE] += base
    rest_wall = st.duration_ns - covered_wall
    rest_comm = max(st.comm_ns - covered_comm, 0)
    rest_exp = 0.0
    if rest_comm > 0:
        cpu = st.cpu_ns
        rest_blocked = rest_wall - (cpu - covered_cpu) if cpu >= 0 else rest_wall
        rest_exp = _exposed(rest_blocked, rest_comm)
    in_bubble = window is None and bool(chunks)  # the chunks are the step's own phases
    tot = sum(st.comm_by_dim)
    if rest_exp > 0 and tot > 0:
        for i, (d, v) in enumerate(zip(dims, st.comm_by_dim, strict=True)):
            cause = TimeCause.BUBBLE if in_bubble and i == pp else exposed_cause(d)
            parts[cause] += rest_exp * v / tot
    rest = max(rest_wall - rest_exp, 0.0)
    if in_bubble:
        parts[TimeCause.BUBBLE] += rest
    elif top:
        parts[TimeCause.IDLE] += rest
    else:
        parts[TimeCause.COMPUTE] += rest
    return parts


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
    """Fill ``ledger``: the analysed steps' wall time by cause (ns, summing to their total)."""
    totals = dict.fromkeys(CAUSES, 0.0)
    wall = 0
    for st in t.steps:
        wall += st.duration_ns
        for k, v in step_ledger(st, t.dimensions).items():
            totals[k] += v
    return replace(a, ledger=whole_ns(totals, wall), ledger_wall_ns=wall)

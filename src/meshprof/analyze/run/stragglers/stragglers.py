"""Stragglers and imbalance: which rank is slow, and in which phase.

Per step and rank (each rank's own clock; durations need no alignment):

- step time = the step span's duration;
- communication time = the part of the step covered by the rank's collectives and send/recv
  (the union of their [issue, completion] intervals, so overlapping async ops count once);
- compute time = step time − the time the rank waited for communication (so a rank that waits
  is not blamed for it), by the what-if's model of the rank's chain of events
  (:func:`~meshprof.analyze.run.replay.replay_record.own_compute`): a blocking op is waited for whole,
  an async op (DDP buckets, FSDP prefetch, isend) only where the program waited for it — its
  flight while the rank computes is compute, not waiting (the union of the events' intervals
  would count it as communication, and the ranks whose async collectives wait longest — those
  that are *not* slow — would look as if they computed less); on a sampled run, step time −
  communication time;
- wait time = the sum of the rank's waits (see :mod:`meshprof.analyze.run.events.match`) in collectives
  issued during the step.

On a run loaded as a sample of its collectives (``EventTable.sample_fraction`` f < 1) the
communication and wait times are the sample's, scaled by 1/f (communication at most the window).

Per rank, compute_i = the median over the steps every loaded rank recorded (the median ignores a
slow first step). The straggler score is ``compute_i / median_over_ranks(compute) − 1``.
A rank is named a straggler when its score exceeds ``threshold`` (default 5 %), its excess compute
exceeds ``min_excess_ns`` (default 50 µs, against timer noise), AND it arrived last in more than
``last_share_min`` (default half) of the collectives it took part in whose order of arrival is
resolved. A collective's order is resolved when its arrival skew is at least
max(2 × the clock alignment's largest uncertainty, min(4 × the lower quartile of all skews,
``min_excess_ns``)): the lower quartile is how closely members arrive when none waits (timer and
launch jitter), and a skew of ``min_excess_ns`` is a wait whatever the jitter. Collectives that
every member reaches within that margin (blocking collectives issued back to back: after the
first has waited for the slow rank, who is "last" at the next is noise) count for no rank, so
they do not dilute the share of the rank everybody waits for at the first. (DDP's bucket
all_reduces are issued asynchronously during backward: every one of them waits for the slow
rank, so they all count.) On a sampled run the threshold is at least two robust
standard deviations (1.4826 × MAD) of the scores of 8 or more ranks: compute is then step time
minus a scaled estimate of communication, and the estimate's noise reaches several per cent. Its
slow phase is the phase
whose compute time (duration minus communication inside it, median over steps) exceeds the median
of that phase across ranks by the most.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from meshprof.analyze.run.events.clock import ClockAlignment
from meshprof.analyze.run.events.match import CollectiveMatch, arrived_last_share
from meshprof.analyze.run.events.table import EventTable
from meshprof.analyze.run.replay.replay_chains import (
    build_chains,
    chain_signatures,
    pipeline_stages,
)
from meshprof.analyze.run.replay.replay_record import own_compute
from meshprof.analyze.run.stragglers.straggler_measures import measure_ranks
from meshprof.records.codec import NOT_IN_JSON, json_key
from meshprof.rundir import LoadedRun

DEFAULT_THRESHOLD = 0.05
DEFAULT_LAST_SHARE = 0.5
DEFAULT_MIN_EXCESS_NS = 50_000
WAITED_BATCH = 2_000_000
"""Events per batch of steps whose compute :func:`_waited_compute` measures at once."""


@dataclass(frozen=True, slots=True)
class RankScore:
    """One rank's place against the others."""

    rank: int
    """Global rank."""
    compute_ns: float
    """Median compute time per step (ns); NaN without steps."""
    score: float
    """compute / median(compute) − 1 (0.10 = 10 % more compute than the median rank)."""
    arrived_last: int
    """Collectives (≥ 2 members present) this rank arrived at last."""
    collectives: int
    """Collectives (≥ 2 members present) this rank took part in whose order of arrival is
    resolved (skew above :attr:`StragglerReport.resolution_ns`)."""
    last_share: float = field(init=False)
    """arrived_last / collectives (0 without collectives)."""

    def __post_init__(self) -> None:
        share = self.arrived_last / self.collectives if self.collectives else 0.0
        object.__setattr__(self, "last_share", share)


@dataclass(frozen=True, slots=True)
class Straggler:
    """A rank named slow, with the evidence."""

    rank: int
    """Global rank."""
    score: float
    """Straggler score (see module docstring)."""
    excess_ns: float
    """Compute time per step above the median rank (ns)."""
    last_share: float
    """Fraction of its collectives it arrived at last."""
    phase: str
    """The phase where it is slow ("" when no phase was recorded)."""
    phase_excess_ns: float
    """That phase's compute time above the phase's median across ranks (ns per step)."""
    phase_median_ns: float
    """The phase's median compute time across ranks (ns per step)."""


@dataclass(frozen=True, slots=True)
class StragglerReport:
    """Per-step, per-rank times and the stragglers found in them."""

    ranks: tuple[int, ...] = field(metadata=NOT_IN_JSON)
    """Rows of the matrices."""
    steps: tuple[int, ...]
    """Columns of the matrices: step numbers, sorted."""
    step_ns: np.ndarray
    """float [rank, step]: step time (ns), NaN where the rank has no such step."""
    compute_ns: np.ndarray = field(metadata=NOT_IN_JSON)
    """float [rank, step]: compute time (ns)."""
    comm_ns: np.ndarray = field(metadata=NOT_IN_JSON)
    """float [rank, step]: communication time (ns)."""
    wait_ns: np.ndarray = field(metadata=NOT_IN_JSON)
    """float [rank, step]: waiting time (ns)."""
    common_steps: tuple[int, ...] = field(metadata=NOT_IN_JSON)
    """Steps every loaded rank recorded (the ones scores use)."""
    scores: tuple[RankScore, ...]
    """One per rank, rank order."""
    phases: tuple[str, ...]
    """Phase names (columns of :attr:`phase_ns`)."""
    phase_ns: np.ndarray
    """float [rank, phase]: median compute time of the phase per step (ns), NaN if absent."""
    phase_median_ns: np.ndarray = field(metadata=NOT_IN_JSON)
    """float [phase]: median of :attr:`phase_ns` across ranks (ns), NaN where no rank has it."""
    stragglers: tuple[Straggler, ...] = field(metadata=json_key("named"))
    """Ranks named slow, worst first; empty for a balanced run."""
    threshold: float
    """Score above which a rank may be named (fraction)."""
    last_share_min: float
    """Arrived-last share above which a rank may be named."""
    resolution_ns: int
    """Arrival skew (ns) a collective must reach for its last rank to count (order resolved):
    max(2 × the clock alignment's largest uncertainty, min(4 × lower quartile of the skews,
    min_excess_ns))."""
    note: str
    """Why nothing could be scored, if so."""


def _waited_compute(
    run: LoadedRun,
    table: EventTable,
    ranks: tuple[int, ...],
    steps: tuple[int, ...],
    compute: np.ndarray,
) -> None:
    """``compute`` [rank, step] set, where the rank has events in the step, to the step minus
    the time it waited for communication by the what-if's model
    (:func:`~meshprof.analyze.run.replay.replay_record.own_compute`: a blocking op is waited for
    whole, an async op only where the program waited for it), each rank on its own clock."""
    n_off = max(int(table.rank.max(initial=0)), max(run.ranks)) + 1
    zero = np.zeros(n_off, dtype=np.int64)
    dims = sorted({gr.dimension for gr in table.groups})
    dim_of_gid = np.asarray([dims.index(gr.dimension) for gr in table.groups] or [0])
    stage = pipeline_stages(table, n_off)
    row_of = {r: i for i, r in enumerate(ranks)}
    col_of = {s: i for i, s in enumerate(steps)}
    # steps in batches of about WAITED_BATCH events (a bounded transient whatever the run)
    per_step = max(len(table) / max(len(steps), 1), 1.0)
    size = max(int(WAITED_BATCH // per_step), 1)
    for b0 in range(0, len(steps), size):
        part = steps[b0 : b0 + size]
        ch = build_chains(run, table, zero, part)
        if not len(ch.c_rank):
            continue
        dimc = dim_of_gid[table.gid[ch.row]]
        sig = chain_signatures(ch, table.op[ch.row], dimc, stage)
        got = own_compute(table, ch, sig)
        rows = np.asarray([row_of.get(int(r), -1) for r in ch.c_rank.tolist()], dtype=np.int64)
        cols = np.asarray([col_of[part[i]] for i in ch.c_step.tolist()], dtype=np.int64)
        has = np.bincount(ch.chain, minlength=len(ch.c_rank)) > 0
        ok = (rows >= 0) & has
        compute[rows[ok], cols[ok]] = got[ok]
        del ch, dimc, sig, got


def find_stragglers(
    run: LoadedRun,
    table: EventTable,
    clock: ClockAlignment,
    match: CollectiveMatch,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    last_share_min: float = DEFAULT_LAST_SHARE,
    min_excess_ns: float = DEFAULT_MIN_EXCESS_NS,
) -> StragglerReport:
    """Per-step times, straggler scores and named stragglers (see the module docstring)."""
    ranks = tuple(sorted(run.ranks))
    # the lower quartile of arrival skews: how closely the members arrive when none waits
    multi = match.present >= 2
    jitter_ns = float(np.percentile(match.skew_ns[multi], 25)) if multi.any() else 0.0
    resolution_ns = int(max(2 * clock.max_uncertainty_ns, min(4 * jitter_ns, min_excess_ns)))
    last = arrived_last_share(match, resolution_ns)
    f = table.sample_fraction
    got = measure_ranks(run, table, clock, match, ranks)
    steps, common = got.steps, got.common
    step_ns, comm_ns, wait_ns = got.step_ns, got.comm_ns, got.wait_ns
    phase_names, phase_ns = list(got.phase_names), got.phase_ns
    scol = {s: i for i, s in enumerate(steps)}
    compute = step_ns - comm_ns
    if f >= 1 and len(table) and steps:
        _waited_compute(run, table, ranks, steps, compute)
    ccols = [scol[s] for s in common]
    med_rank = np.median(compute[:, ccols], axis=1) if ccols else np.full(len(ranks), np.nan)
    ref = float(np.median(med_rank)) if ccols else float("nan")
    score = med_rank / ref - 1 if ccols and ref > 0 else np.zeros(len(ranks))
    scores = tuple(
        RankScore(r, float(med_rank[i]), float(score[i]), *last.get(r, (0, 0)))
        for i, r in enumerate(ranks)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        phase_med = (
            np.nanmedian(phase_ns, axis=0) if phase_names else np.full(0, np.nan, dtype=float)
        )
    stragglers = []
    named_above = threshold
    finite = np.asarray([s.score for s in scores if np.isfinite(s.score)], dtype=float)
    if f < 1 and len(finite) >= 8:
        mad = float(np.median(np.abs(finite - np.median(finite))))
        named_above = max(threshold, 2 * 1.4826 * mad)
    for i, s in enumerate(scores):
        excess = s.compute_ns - ref if ccols else 0.0
        if s.score > named_above and excess > min_excess_ns and s.last_share > last_share_min:
            phase, pex, pmed = "", 0.0, 0.0
            if phase_names:
                ex = phase_ns[i] - phase_med
                if np.any(~np.isnan(ex)):
                    j = int(np.nanargmax(ex))
                    phase, pex, pmed = phase_names[j], float(ex[j]), float(phase_med[j])
            stragglers.append(
                Straggler(s.rank, s.score, float(excess), s.last_share, phase, pex, pmed)
            )
    stragglers.sort(key=lambda x: -x.score)
    note = (
        ""
        if ccols
        else ("no step spans recorded" if not steps else "no step recorded by every rank")
    )
    return StragglerReport(
        ranks=ranks,
        steps=steps,
        step_ns=step_ns,
        compute_ns=compute,
        comm_ns=comm_ns,
        wait_ns=wait_ns,
        common_steps=common,
        scores=scores,
        phases=tuple(phase_names),
        phase_ns=phase_ns,
        phase_median_ns=phase_med,
        stragglers=tuple(stragglers),
        threshold=named_above,
        last_share_min=last_share_min,
        resolution_ns=resolution_ns,
        note=note,
    )

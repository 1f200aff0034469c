"""When things changed: change points in each rank's compute per step and in the job's step time,
and the latest regime the report analyses when one began mid-run.

Series (ns per step, over the steps every rank recorded, the first one left out as warm-up):

* **compute** of a rank: its step's wall time minus the union of its collectives' intervals
  inside the step (what it did other than communicate or wait for it). A rank that turns slow
  shows here; its peers, who wait for it, do not;
* **step** of the job: the median over ranks of the step's wall time (every rank's step is slow
  when one is: one series for the job).

Detection (binary segmentation, mean-shift CUSUM): a series is first despiked, each value clipped
to the moving median of its 5 steps ± :data:`SPIKE_K` robust standard deviations of the
step-to-step noise (one checkpoint or GC pause is not a regime; a level shift stays whole:
:mod:`meshprof.analyze.compute.despike`); the split maximizing
the two-sample statistic |mean(left) − mean(right)| / (σ·√(1/k + 1/(n−k))) is a change when that
statistic is at least :data:`Z` (σ from the median absolute first difference, blind to the level
shift itself), the medians of the two sides differ by at least :data:`MIN_SHIFT` of the earlier
one (and :data:`MIN_SHIFT_NS`), and each side has :data:`MIN_SEGMENT` steps; then each side is
searched again, up to :data:`MAX_CHANGES` per series. A rank's compute change is kept when it
moves by at least :data:`MIN_STEP_SHARE` of the job's step time around it.

The **latest regime** starts at the latest change of any series; when it began mid-run, the
report analyses the steps since (:func:`latest_regime`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from meshprof.analyze.compute.despike import despike, despike_rows, step_noise
from meshprof.analyze.run.events.window import StepWindow, step_spans
from meshprof.rundir import LoadedRun

Z = 8.0
"""Two-sample statistic (in robust standard deviations of the step-to-step noise) a split needs:
high, because the best of n splits is taken."""
MIN_SHIFT = 0.05
"""Smallest change of the median, as a fraction of the earlier median."""
MIN_STEP_SHARE = 0.05
"""Smallest change of a rank's compute, as a fraction of the job's step time around it (the
larger of its medians before and after): a rank's compute moving by less than this does not
change what the job does (a busy neighbour on a shared host, a short burst)."""
MIN_SHIFT_NS = 20_000
"""Smallest change of the median (ns)."""
MIN_SEGMENT = 5
"""Steps a regime needs on each side of a change."""
SPIKE_K = 6.0
"""Noise deviations from its moving median beyond which a step's value is a spike (clipped)."""
MAX_CHANGES = 3
"""Changes searched for per series."""


@dataclass(frozen=True, slots=True)
class Change:
    """One change point (``report --json``'s ``changes.changes``)."""

    rank: int | None
    """The rank whose series changed; None for the job's step time."""
    metric: str
    """"compute" (a rank's compute per step) or "step" (the job's step time)."""
    step: int
    """The first step of the new regime."""
    t_ns: int
    """When that step started (ns since the epoch, that rank's clock; the job: the lowest rank)."""
    before_ns: float
    """Median of the series over the previous regime (ns per step)."""
    after_ns: float
    """Median over the new regime (ns per step)."""


@dataclass(frozen=True, slots=True)
class StepSeries:
    """Per-step series of the run (over the steps every rank recorded)."""

    steps: np.ndarray
    """Step numbers (int64, ascending)."""
    ranks: tuple[int, ...]
    """Rank of each row."""
    compute_ns: np.ndarray
    """(ranks, steps) float64: compute per step."""
    step_ns: np.ndarray
    """(ranks, steps) float64: wall time per step."""
    start_ns: np.ndarray
    """(ranks, steps) int64: when each step started, the rank's clock."""


def step_series(run: LoadedRun) -> StepSeries | None:
    """The per-step series of the ranks with step spans, over their common steps (None: fewer
    than 2·:data:`MIN_SEGMENT` + 1 common steps, or no steps)."""
    per: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
    common: np.ndarray | None = None
    for r in sorted(run.ranks):
        rd = run.ranks[r]
        st = step_spans(rd)
        if not len(st):
            continue
        steps, first = np.unique(st["step"].astype(np.int64), return_index=True)
        s0 = st["start_ns"][first].astype(np.int64)
        s1 = s0 + st["duration_ns"][first].astype(np.int64)
        per[r] = (steps, s0, s1, _comm_in(rd.events, s0, s1))
        common = steps if common is None else np.intersect1d(common, steps, assume_unique=True)
    if common is None or len(common) < 2 * MIN_SEGMENT + 2:
        return None
    common = common[1:]  # the first step: warm-up (compilation, allocator, caches)
    ranks = tuple(per)
    shape = (len(ranks), len(common))
    compute, wall = np.empty(shape), np.empty(shape)
    start = np.empty(shape, dtype=np.int64)
    for i, r in enumerate(ranks):
        steps, s0, s1, comm = per[r]
        idx = np.searchsorted(steps, common)
        wall[i] = (s1 - s0)[idx]
        compute[i] = wall[i] - comm[idx]
        start[i] = s0[idx]
    return StepSeries(common, ranks, compute, wall, start)


def _comm_in(events: np.ndarray, s0: np.ndarray, s1: np.ndarray) -> np.ndarray:
    """Per step [s0, s1): the union of the events' [start, start + duration) inside it (ns)."""
    out = np.zeros(len(s0), dtype=np.float64)
    if not len(events) or not len(s0):
        return out
    d = events["duration_ns"].astype(np.int64)
    ok = d >= 0
    a = events["start_ns"][ok].astype(np.int64)
    b = a + d[ok]
    order = np.argsort(a, kind="stable")
    a, b = a[order], b[order]
    # merge overlapping intervals (async collectives overlap each other)
    run_end = np.maximum.accumulate(b)
    new = np.ones(len(a), dtype=bool)
    new[1:] = a[1:] > run_end[:-1]
    starts = a[new]
    ends = np.maximum.reduceat(run_end, np.flatnonzero(new)) if len(a) else b
    # clip the merged intervals to each step: total covered length inside [s0, s1)
    cum = np.concatenate([[0], np.cumsum(ends - starts)])

    def covered(t: np.ndarray) -> np.ndarray:  # union length in (-inf, t)
        i = np.searchsorted(starts, t, side="right")  # intervals starting before t
        full = cum[np.maximum(i - 1, 0)]
        last_s = starts[np.maximum(i - 1, 0)]
        last_e = ends[np.maximum(i - 1, 0)]
        part = np.clip(t - last_s, 0, last_e - last_s)
        return np.where(i > 0, full + part, 0)

    return (covered(s1) - covered(s0)).astype(np.float64)


def _best_split(x: np.ndarray, m: int) -> tuple[int, float]:
    """(k, statistic / σ) of the best mean-shift split with ≥ m points a side (k = 0: none)."""
    n = len(x)
    if n < 2 * m:
        return 0, 0.0
    sigma = step_noise(x)
    cs = np.cumsum(x)
    k = np.arange(m, n - m + 1)
    left = cs[k - 1] / k
    right = (cs[-1] - cs[k - 1]) / (n - k)
    stat = np.abs(left - right) / np.sqrt(1.0 / k + 1.0 / (n - k))
    j = int(np.argmax(stat))
    floor = max(sigma, 1e-9 * max(abs(float(np.median(x))), 1.0), 1.0)
    return int(k[j]), float(stat[j] / floor)


def _segments(x: np.ndarray, lo: int, hi: int, out: list[int], budget: list[int]) -> None:
    if budget[0] <= 0:
        return
    seg = x[lo:hi]
    k, z = _best_split(seg, MIN_SEGMENT)
    if k == 0 or z < Z:
        return
    before, after = float(np.median(seg[:k])), float(np.median(seg[k:]))
    if abs(after - before) < max(MIN_SHIFT * abs(before), MIN_SHIFT_NS):
        return
    budget[0] -= 1
    out.append(lo + k)
    _segments(x, lo, lo + k, out, budget)
    _segments(x, lo + k, hi, out, budget)


def change_points(x: np.ndarray) -> list[int]:
    """Indices where a new regime of ``x`` starts (ascending)."""
    x = despike(np.asarray(x, dtype=np.float64), SPIKE_K)
    out: list[int] = []
    _segments(x, 0, len(x), out, [MAX_CHANGES])
    return sorted(out)


def _describe(
    x: np.ndarray,
    cuts: Sequence[int],
    rank: int | None,
    metric: str,
    s: StepSeries,
    row: int,
    job: np.ndarray | None = None,
) -> list[Change]:
    """The changes at ``cuts`` of ``x``; with ``job`` (the job's step time), those of at least
    :data:`MIN_STEP_SHARE` of it."""
    cuts = list(cuts)
    while True:  # drop the smallest change under the share, then measure the others again
        bounds = [0, *cuts, len(x)]
        rows = []
        for i, c in enumerate(cuts):
            lo, hi = bounds[i], bounds[i + 2]
            before, after = float(np.median(x[lo:c])), float(np.median(x[c:hi]))
            around = (
                max(float(np.median(job[lo:c])), float(np.median(job[c:hi])))
                if job is not None
                else 0.0
            )
            rows.append((abs(after - before) - MIN_STEP_SHARE * around, c, before, after))
        small = [r for r in rows if r[0] < 0]
        if not small:
            break
        cuts.remove(min(small)[1])
    return [
        Change(rank, metric, int(s.steps[c]), int(s.start_ns[row, c]), before, after)
        for _, c, before, after in rows
    ]


def find_changes(s: StepSeries | None) -> tuple[Change, ...]:
    """Every change point of the ranks' compute and of the job's step time, by step."""
    if s is None:
        return ()
    out: list[Change] = []
    job = np.median(s.step_ns, axis=0)
    # screen all ranks at once: one split each; search further only where it passes
    x = despike_rows(s.compute_ns, SPIKE_K) if len(s.ranks) else s.compute_ns
    for i, r in enumerate(s.ranks):
        k, z = _best_split(x[i], MIN_SEGMENT)
        if k and z >= Z:
            cuts = change_points(s.compute_ns[i])
            out += _describe(s.compute_ns[i], cuts, r, "compute", s, i, job)
    out += _describe(job, change_points(job), None, "step", s, 0)
    out.sort(key=lambda c: (c.step, c.metric, -1 if c.rank is None else c.rank))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Timeline:
    """When things changed, and which steps the report analysed (``report --json``'s
    ``changes``)."""

    changes: tuple[Change, ...]
    """Every change point, by step."""
    first_step: int
    """The run's first step over the ranks' common steps (-1: no steps)."""
    last_step: int
    """Its last step (-1: no steps)."""
    window_lo: int | None
    """First step analysed (None: from the first)."""
    window_hi: int | None
    """Steps analysed end before this one (None: to the last)."""
    reason: str
    """Why a window: "" (the whole run), "asked" (``--steps``, ``--since``, ``--until``) or
    "latest_regime" (something changed mid-run: the steps since the latest change)."""

    @property
    def windowed(self) -> bool:
        """Whether the report analysed part of the run."""
        return self.window_lo is not None or self.window_hi is not None


def latest_regime(changes: Sequence[Change], last_step: int) -> StepWindow | None:
    """The steps since the latest change (None: nothing changed)."""
    if not changes:
        return None
    start = max(c.step for c in changes)
    return StepWindow(start, last_step + 1)


__all__ = [
    "MAX_CHANGES",
    "MIN_SEGMENT",
    "MIN_SHIFT",
    "MIN_SHIFT_NS",
    "MIN_STEP_SHARE",
    "Change",
    "StepSeries",
    "Timeline",
    "Z",
    "change_points",
    "find_changes",
    "latest_regime",
    "step_series",
]

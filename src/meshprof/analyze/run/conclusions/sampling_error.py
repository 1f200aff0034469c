"""What a report computed on a sample of the collectives rests on, and how far its main figures
can be off (:class:`SamplingInfo`).

The sample is the loader's (:mod:`meshprof.rundir.sampling`): every collective whose
(group, seq) hash falls below the fraction f, on every member rank. Errors of the figures
against the whole run:

- **p50 latency** of each op and size bucket: a distribution-free interval from the binomial
  distribution of the order statistics: the p50 of the whole run lies between the sample's
  ``q = 0.5 ∓ z·√(0.25 / n)·√(1 − f)`` quantiles (z = 1.96: 95 %), where n is the number of
  sampled *collectives* in the row (the members' copies of one collective are not independent)
  and √(1 − f) the finite-population correction (the whole run is the population; f = 1 gives
  no error);
- **communication share** of each rank: the Horvitz–Thompson standard error of a Bernoulli
  sample, ``√((1 − f) / f² · Σ d²) / step time`` over the rank's sampled durations d
  (exact when its collectives do not overlap in time).

Units: ns, fractions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshprof.analyze.compute.sorting import RowsByKey
from meshprof.analyze.run.conclusions.tables import size_keys, sorted_pct, split_size_key
from meshprof.analyze.run.events.table import EventTable
from meshprof.analyze.run.stragglers.stragglers import StragglerReport
from meshprof.analyze.run.types import SizeRow

Z_95 = 1.959963984540054
"""Normal quantile of a two-sided 95 % interval."""


@dataclass(frozen=True, slots=True)
class LatencyInterval:
    """The p50 latency of one op and size bucket, with the interval the whole run's lies in."""

    op: str
    size_bucket: int
    """Bytes (power of two; 0 for empty messages)."""
    collectives: int
    """Sampled collectives in the row (events / mean group size)."""
    p50_ns: float
    """The sample's p50 (as the size table shows)."""
    low_ns: float
    """Lower end of the 95 % interval (ns)."""
    high_ns: float
    """Upper end (ns)."""


@dataclass(frozen=True, slots=True)
class SamplingInfo:
    """How the report was sampled and the resulting error of its main figures."""

    fraction: float
    """Fraction of the collectives loaded (by the (group, seq) hash, on every member)."""
    reason: str
    """Why: "--sample" or the memory budget that chose it, in words."""
    events_recorded: int
    """Event rows in the rank files."""
    events_loaded: int
    """Completed events the sample kept (what the analyses read)."""
    collectives: int
    """Collectives (group, seq) matched in the sample."""
    confidence: float
    """Of the latency intervals (0.95)."""
    latency_p50_rel_error: float
    """Largest relative half-width of the p50 latency intervals over the size rows with at
    least 10 sampled collectives (fraction of the p50; 0 when none)."""
    comm_share_error: float
    """Largest standard error of a rank's communication share (absolute, as a fraction)."""
    latency: tuple[LatencyInterval, ...]
    """One per size row, in the size table's order."""


def latency_intervals(
    table: EventTable, rows: tuple[SizeRow, ...], z: float = Z_95
) -> tuple[LatencyInterval, ...]:
    """The p50 interval of each size row (see the module docstring)."""
    if not len(table):
        return ()
    f = table.sample_fraction
    fpc = float(np.sqrt(max(1.0 - f, 0.0)))
    key = size_keys(table)
    by_key = RowsByKey(key)
    sizes = table.group_sizes().astype(np.float64)
    op_index = {o: i for i, o in enumerate(table.ops)}
    out = []
    for row in rows:
        o = op_index.get(row.op, -1)
        idx = np.zeros(0, dtype=np.int64)
        for k in by_key.keys.tolist():
            if split_size_key(int(k)) == (o, row.size_bucket):
                idx = by_key.rows(int(k))
                break
        if not len(idx):
            continue
        d = np.sort(table.duration_ns[idx])
        n = max(float(len(idx) / np.mean(sizes[table.gid[idx]])), 1.0)
        half = z * float(np.sqrt(0.25 / n)) * fpc
        lo = sorted_pct(d, 100 * max(0.5 - half, 0.0))
        hi = sorted_pct(d, 100 * min(0.5 + half, 1.0))
        out.append(LatencyInterval(row.op, row.size_bucket, round(n), row.p50_ns, lo, hi))
    return tuple(out)


def comm_share_errors(table: EventTable, s: StragglerReport) -> np.ndarray:
    """float per rank of ``s.ranks``: standard error of its communication share (fraction)."""
    f = table.sample_fraction
    out = np.zeros(len(s.ranks))
    if f >= 1 or not len(table):
        return out
    by_rank = RowsByKey(table.rank)
    with np.errstate(all="ignore"):
        step_tot = np.nansum(s.step_ns, axis=1) if s.steps else np.zeros(len(s.ranks))
    for i, r in enumerate(s.ranks):
        d = table.duration_ns[by_rank.rows(r)].astype(np.float64)
        if step_tot[i] > 0:
            out[i] = float(np.sqrt((1 - f) / f**2 * float(np.dot(d, d)))) / float(step_tot[i])
    return out


def sampling_info(
    table: EventTable,
    s: StragglerReport,
    rows: tuple[SizeRow, ...],
    collectives: int,
    events_recorded: int,
    reason: str,
) -> SamplingInfo:
    """The :class:`SamplingInfo` of a report computed on ``table`` (a sample)."""
    lat = latency_intervals(table, rows)
    rel = [
        max(x.p50_ns - x.low_ns, x.high_ns - x.p50_ns) / x.p50_ns
        for x in lat
        if x.collectives >= 10 and x.p50_ns > 0
    ]
    share = comm_share_errors(table, s)
    return SamplingInfo(
        fraction=table.sample_fraction,
        reason=reason,
        events_recorded=events_recorded,
        events_loaded=len(table),
        collectives=collectives,
        confidence=0.95,
        latency_p50_rel_error=float(max(rel, default=0.0)),
        comm_share_error=float(share.max()) if len(share) else 0.0,
        latency=lat,
    )

"""Per-op, per-rank, per-group and per-message-size statistics of collectives.

Counts, bytes and duration totals are exact for the whole run: they are accumulated as events are
flushed, before the ring buffer can evict anything. Percentiles are exact (computed from retained
events) while nothing has been evicted or dropped; after that they come from a log-bucket sketch
(DDSketch's mapping) whose estimates are within ``relative_error`` of the true quantile value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from meshprof.events import (
    FLAG_DROPPED,
    FLAG_UNSAMPLED,
    STATUS_CODES,
    bandwidth_arrays,
    nccl_tests_size_array,
    size_bucket_array,
)

DIMENSIONS = ("op", "rank", "group", "size")
ALL_RANKS = -1
"""Rank part of a statistics key when per-rank tracking is off (ProfilerConfig.track_per_rank)."""
ALL_GROUPS = "*"
"""Group part of a statistics key when per-group tracking is off (ProfilerConfig.track_per_group)."""


class Sketch:
    """Relative-error quantile sketch over positive integers (nanoseconds).

    Value v > 0 falls in bucket i = ceil(log_gamma(v)), gamma = (1 + a) / (1 - a); the bucket's
    representative 2 * gamma**i / (gamma + 1) is within a * v of every value in it.
    """

    __slots__ = ("bins", "gamma", "log_gamma", "relative_error", "zeros")

    def __init__(self, relative_error: float = 0.01) -> None:
        self.relative_error = relative_error
        self.gamma = (1 + relative_error) / (1 - relative_error)
        self.log_gamma = math.log(self.gamma)
        self.bins: dict[int, int] = {}
        self.zeros = 0

    @property
    def count(self) -> int:
        return self.zeros + sum(self.bins.values())

    def add_many(self, values: np.ndarray) -> None:
        v = np.asarray(values, dtype=np.float64)
        pos = v > 0
        self.zeros += int((~pos).sum())
        if pos.any():
            idx = np.ceil(np.log(v[pos]) / self.log_gamma).astype(np.int64)
            uniq, counts = np.unique(idx, return_counts=True)
            bins = self.bins
            for i, c in zip(uniq.tolist(), counts.tolist(), strict=True):
                bins[i] = bins.get(i, 0) + c

    def merge(self, other: Sketch) -> None:
        self.zeros += other.zeros
        for i, c in other.bins.items():
            self.bins[i] = self.bins.get(i, 0) + c

    def quantile(self, q: float) -> float:
        n = self.count
        if n == 0:
            return float("nan")
        rank = q * (n - 1)
        seen = self.zeros
        if rank < seen:
            return 0.0
        for i in sorted(self.bins):
            seen += self.bins[i]
            if seen > rank:
                return 2.0 * self.gamma**i / (self.gamma + 1.0)
        return 2.0 * self.gamma ** max(self.bins) / (self.gamma + 1.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "relative_error": self.relative_error,
            "zeros": self.zeros,
            "bins": {str(k): v for k, v in self.bins.items()},
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Sketch:
        s = cls(float(d["relative_error"]))
        s.zeros = int(d.get("zeros", 0))
        s.bins = {int(k): int(v) for k, v in d.get("bins", {}).items()}
        return s


@dataclass(slots=True)
class AggRow:
    """Exact running totals for one (rank, op, group, size bucket) key."""

    count: int = 0
    timed: int = 0
    errors: int = 0
    total_bytes: int = 0
    total_ns: int = 0
    min_ns: int = 0
    max_ns: int = 0
    algbw_sum: float = 0.0
    busbw_sum: float = 0.0
    inflight: int = 0
    """Of ``count``: issued and not completed at the read (no duration: not timed)."""


Key = tuple[int, str, str, int]  # (rank, op name, group name, size bucket bytes)


class Accumulator:
    """Exact aggregates and latency sketches per (rank, op, group, size bucket)."""

    def __init__(self, relative_error: float = 0.01) -> None:
        self.relative_error = relative_error
        self.rows: dict[Key, AggRow] = {}
        self.sketches: dict[Key, Sketch] = {}
        self.dropped = 0  # timed events not retained (min duration; sampled-out ones excluded)

    def add_chunk(
        self,
        chunk: np.ndarray,
        rank: int,
        op_name: Callable[[int], str],
        group_name: Callable[[int], str],
        group_size: Callable[[int], int],
    ) -> None:
        """Fold a chunk of EVENT_DTYPE rows into the totals. Pending rows (ops in flight) count
        as issued (``count``, ``inflight``, bytes) and not in the times; they are folded only
        into a read's copy (:meth:`copy`), never into the running totals."""
        if len(chunk) == 0:
            return
        gidx = chunk["group"].astype(np.int64)
        sizes = np.array([group_size(int(g)) for g in range(int(gidx.max()) + 1)], dtype=np.int64)[
            gidx
        ]
        s_bytes = nccl_tests_size_array(chunk["op"], chunk["in_bytes"], chunk["out_bytes"], sizes)
        dur = chunk["duration_ns"]
        timed = dur >= 0
        alg, bus = bandwidth_arrays(
            chunk["op"], chunk["in_bytes"], chunk["out_bytes"], np.maximum(dur, 0), sizes
        )
        buckets = size_bucket_array(s_bytes)
        errors = chunk["status"] == STATUS_CODES["error"]
        pending = chunk["status"] == STATUS_CODES["pending"]
        flags = chunk["flags"]
        self.dropped += int((((flags & FLAG_DROPPED) != 0) & ((flags & FLAG_UNSAMPLED) == 0)).sum())
        # one int64 key per event (op | group | bucket index): a 1-D unique is ~10x faster than
        # np.unique(axis=0) on a (n, 3) array, and this runs once per 1024 events
        bucket_values, bucket_idx = np.unique(buckets, return_inverse=True)
        packed = (chunk["op"].astype(np.int64) << 32) | (gidx << 8) | bucket_idx.reshape(-1)
        uniq, inverse = np.unique(packed, return_inverse=True)
        inverse = inverse.reshape(-1)
        for k, u in enumerate(uniq.tolist()):
            opc, g, b = u >> 32, (u >> 8) & 0xFFFFFF, int(bucket_values[u & 0xFF])
            m = inverse == k
            key: Key = (rank, op_name(opc), group_name(g), b)
            row = self.rows.get(key)
            if row is None:
                row = self.rows[key] = AggRow()
                self.sketches[key] = Sketch(self.relative_error)
            mt = m & timed
            d = dur[mt]
            row.count += int(m.sum())
            row.errors += int(errors[m].sum())
            row.inflight += int(pending[m].sum())
            row.total_bytes += int(s_bytes[m].sum())
            if len(d):
                dmin, dmax = int(d.min()), int(d.max())
                row.min_ns = dmin if row.timed == 0 else min(row.min_ns, dmin)
                row.max_ns = max(row.max_ns, dmax)
                row.timed += len(d)
                row.total_ns += int(d.sum())
                row.algbw_sum += float(alg[mt].sum())
                row.busbw_sum += float(bus[mt].sum())
                self.sketches[key].add_many(d)

    def add_untimed(
        self, rank: int, op: str, group: str, bucket: int, nbytes: int, count: int = 1
    ) -> None:
        """Count collectives that sampling chose not to time."""
        key: Key = (rank, op, group, bucket)
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = AggRow()
            self.sketches[key] = Sketch(self.relative_error)
        row.count += count
        row.total_bytes += nbytes

    def merge(self, other: Accumulator) -> None:
        for key, r in other.rows.items():
            mine = self.rows.get(key)
            if mine is None:
                mine = self.rows[key] = AggRow()
                self.sketches[key] = Sketch(self.relative_error)
            if r.timed:
                mine.min_ns = r.min_ns if mine.timed == 0 else min(mine.min_ns, r.min_ns)
                mine.max_ns = max(mine.max_ns, r.max_ns)
            mine.count += r.count
            mine.timed += r.timed
            mine.errors += r.errors
            mine.total_bytes += r.total_bytes
            mine.total_ns += r.total_ns
            mine.algbw_sum += r.algbw_sum
            mine.busbw_sum += r.busbw_sum
            mine.inflight += r.inflight
            self.sketches[key].merge(other.sketches[key])
        self.dropped += other.dropped

    def copy(self) -> Accumulator:
        """An independent copy (a read folds its ops in flight into one)."""
        out = Accumulator(self.relative_error)
        out.merge(self)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "relative_error": self.relative_error,
            "dropped": self.dropped,
            "rows": [
                {
                    "rank": k[0],
                    "op": k[1],
                    "group": k[2],
                    "bucket": k[3],
                    **asdict(r),
                    "sketch": self.sketches[k].to_dict(),
                }
                for k, r in self.rows.items()
            ],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Accumulator:
        acc = cls(float(d.get("relative_error", 0.01)))
        acc.dropped = int(d.get("dropped", 0))
        names = set(AggRow.__dataclass_fields__)
        for r in d.get("rows", []):
            key: Key = (int(r["rank"]), str(r["op"]), str(r["group"]), int(r["bucket"]))
            acc.rows[key] = AggRow(**{k: v for k, v in r.items() if k in names})
            acc.sketches[key] = Sketch.from_dict(r["sketch"])
        return acc


@dataclass(frozen=True, slots=True)
class OpStats:
    """Statistics of one slice of collectives (one op, rank, group or size bucket).

    Durations in nanoseconds; bandwidths are means over timed events in GB/s (nccl-tests).
    """

    dimension: str
    """Which dimension this row slices: "op", "rank", "group" or "size"."""
    key: str
    """The slice: op name, rank number, group name, or the bucket's upper bound in bytes."""
    count: int
    """Collectives issued (exact, sampled-out ones and those still in flight included)."""
    timed: int
    """Collectives that were timed (sampled)."""
    errors: int
    total_bytes: int
    """Sum of the nccl-tests buffer size S over all collectives."""
    total_ns: int
    min_ns: int
    mean_ns: float
    max_ns: int
    p50_ns: float
    p95_ns: float
    p99_ns: float
    mean_algbw_gbps: float
    mean_busbw_gbps: float
    exact_percentiles: bool
    """True when p50/p95/p99 come from every timed event, False when from the sketch."""
    inflight: int = 0
    """Of ``count``: collectives issued and not completed at the read (in flight: no duration
    yet, so not in the times, percentiles or bandwidths)."""

    def to_dict(self) -> dict[str, Any]:
        """Plain dict; NaN (no timed event) becomes None so the JSON stays valid."""
        return {
            k: (None if isinstance(v, float) and math.isnan(v) else v)
            for k, v in asdict(self).items()
        }


@dataclass(frozen=True, slots=True)
class StatsReport:
    """Statistics along every dimension, plus how percentiles were computed."""

    by_op: list[OpStats]
    by_rank: list[OpStats]
    by_group: list[OpStats]
    by_size: list[OpStats]
    percentiles: str
    """"exact" or "sketch"."""
    sketch_relative_error: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "by_op": [s.to_dict() for s in self.by_op],
            "by_rank": [s.to_dict() for s in self.by_rank],
            "by_group": [s.to_dict() for s in self.by_group],
            "by_size": [s.to_dict() for s in self.by_size],
            "percentiles": self.percentiles,
            "sketch_relative_error": self.sketch_relative_error,
        }


def _dim_value(key: Key, dim: str) -> str:
    rank, op, group, bucket = key
    return {"op": op, "rank": str(rank), "group": group, "size": str(bucket)}[dim]


def compute_stats(
    acc: Accumulator,
    exact_samples: dict[Key, np.ndarray] | None,
) -> StatsReport:
    """Statistics per op, rank, group and size bucket.

    ``exact_samples`` maps each key to every timed duration of that key (from retained events),
    or is None when the buffer has evicted or dropped events, in which case the sketches give the
    percentiles.
    """
    exact = exact_samples is not None
    out: dict[str, list[OpStats]] = {}
    for dim in DIMENSIONS:
        slices: dict[str, list[Key]] = {}
        for key in acc.rows:
            if (dim == "rank" and key[0] == ALL_RANKS) or (dim == "group" and key[2] == ALL_GROUPS):
                continue  # that dimension is not tracked
            slices.setdefault(_dim_value(key, dim), []).append(key)
        rows: list[OpStats] = []
        for value, keys in slices.items():
            rows.append(_slice_stats(dim, value, keys, acc, exact_samples))
        if dim in ("rank", "size"):
            rows.sort(key=lambda s: int(s.key))
        else:
            rows.sort(key=lambda s: -s.total_ns)
        out[dim] = rows
    return StatsReport(
        by_op=out["op"],
        by_rank=out["rank"],
        by_group=out["group"],
        by_size=out["size"],
        percentiles="exact" if exact else "sketch",
        sketch_relative_error=acc.relative_error,
    )


def _slice_stats(
    dim: str,
    value: str,
    keys: Iterable[Key],
    acc: Accumulator,
    exact_samples: dict[Key, np.ndarray] | None,
) -> OpStats:
    count = timed = errors = total_bytes = total_ns = max_ns = inflight = 0
    min_ns = -1
    alg = bus = 0.0
    sketch = Sketch(acc.relative_error)
    samples: list[np.ndarray] = []
    for key in keys:
        r = acc.rows[key]
        count += r.count
        timed += r.timed
        errors += r.errors
        inflight += r.inflight
        total_bytes += r.total_bytes
        total_ns += r.total_ns
        if r.timed:
            min_ns = r.min_ns if min_ns < 0 else min(min_ns, r.min_ns)
            max_ns = max(max_ns, r.max_ns)
        alg += r.algbw_sum
        bus += r.busbw_sum
        if exact_samples is not None:
            samples.append(exact_samples.get(key, np.empty(0, dtype=np.int64)))
        else:
            sketch.merge(acc.sketches[key])
    if exact_samples is not None:
        allv = np.concatenate(samples) if samples else np.empty(0)
        if len(allv):
            p50, p95, p99 = (float(x) for x in np.percentile(allv, [50, 95, 99]))
        else:
            p50 = p95 = p99 = float("nan")
    else:
        p50, p95, p99 = sketch.quantile(0.5), sketch.quantile(0.95), sketch.quantile(0.99)
    return OpStats(
        dimension=dim,
        key=value,
        count=count,
        timed=timed,
        errors=errors,
        total_bytes=total_bytes,
        total_ns=total_ns,
        min_ns=max(min_ns, 0),
        mean_ns=total_ns / timed if timed else float("nan"),
        max_ns=max_ns,
        p50_ns=p50,
        p95_ns=p95,
        p99_ns=p99,
        mean_algbw_gbps=alg / timed if timed else 0.0,
        mean_busbw_gbps=bus / timed if timed else 0.0,
        exact_percentiles=exact_samples is not None,
        inflight=inflight,
    )

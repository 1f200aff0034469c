"""The cross-rank report's tables, each a pure function of the loaded run and the analyses
before it: the per-rank table, peak-memory imbalance, the step-time heatmap, communication share
by parallelism dimension, latency and bandwidth by message size, and matching per group.

Units: ns, bytes, fractions, GB/s (1e9 B/s).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Iterator

import numpy as np

from meshprof.analyze.compute import intervals
from meshprof.analyze.compute.sorting import RowsByKey
from meshprof.analyze.run.events.match import CollectiveMatch
from meshprof.analyze.run.events.table import EventTable
from meshprof.analyze.run.stragglers.stragglers import StragglerReport
from meshprof.analyze.run.types import (
    GroupRow,
    MemoryImbalance,
    RankRow,
    SizeRow,
    SkewHistogram,
    StepHeatmap,
)
from meshprof.events import OP_CODES, bandwidth_arrays, size_bucket_array
from meshprof.rundir import LoadedRun

HEATMAP_STEPS = 200
"""Steps the heatmap shows (the last ones)."""


def peak_memory_bytes(mem: np.ndarray) -> int:
    """Peak memory of one rank's samples (bytes): the device peak where the device was sampled,
    else the largest host RSS, peak or allocated value; -1 without samples."""
    if not len(mem):
        return -1
    dev = mem["peak"][mem["peak"] >= 0]
    if len(dev) and (mem["allocated"] >= 0).any():
        return int(dev.max())
    for col in ("rss", "peak", "allocated"):
        v = mem[col][mem[col] >= 0]
        if len(v):
            return int(v.max())
    return -1


_BW_CHUNK = 1 << 16  # rows per bandwidth chunk (its temporaries stay a few MB)


def recorded_by_size(run: LoadedRun) -> dict[tuple[str, int], int] | None:
    """(op, size bucket) -> exact collectives issued, summed over the loaded ranks' statistics
    (None when some rank file carries none)."""
    out: dict[tuple[str, int], int] = {}
    for rd in run.ranks.values():
        stats = rd.meta.stats
        if not isinstance(stats, dict) or "rows" not in stats:
            return None
        for r in stats["rows"]:
            try:
                key = (str(r["op"]), int(r["bucket"]))
                out[key] = out.get(key, 0) + int(r["count"])
            except (KeyError, TypeError, ValueError):
                return None
    return out


def with_recorded(
    rows: tuple[SizeRow, ...], recorded: dict[tuple[str, int], int] | None
) -> tuple[SizeRow, ...]:
    if recorded is None:
        return rows
    return tuple(
        dataclasses.replace(x, recorded=recorded.get((x.op, x.size_bucket), x.count)) for x in rows
    )


def size_rows(table: EventTable, match: CollectiveMatch | None = None) -> tuple[SizeRow, ...]:
    """Latency and bandwidth per op and power-of-two message-size bucket (sorted by op, size);
    with ``match``, each row's median wait for late members too (``SizeRow.wait_p50_ns``)."""
    if not len(table):
        return ()
    code_of = np.asarray([OP_CODES.get(o, OP_CODES["custom"]) for o in table.ops], dtype=np.int64)
    key = size_keys(table)
    waits = _wait_p50_by_key(key, match) if match is not None else {}
    rows = []
    sizes = table.group_sizes()
    counts = np.bincount(key)
    for k in np.flatnonzero(counts).tolist():
        o, b = split_size_key(k)
        # the key's durations, then its algbw, then its busbw (one column at a time, gathered
        # chunk by chunk: no row list of the key is held), each sorted in place: the
        # percentiles copy nothing (numpy's median and percentile would each copy the column)
        d = np.empty(int(counts[k]), dtype=table.duration_ns.dtype)
        for pos, ci in _rows_of_key(key, k):
            d[pos : pos + len(ci)] = table.duration_ns[ci]
        bw_p50 = []
        for which in (0, 1):
            bw = np.empty(len(d))
            for pos, ci in _rows_of_key(key, k):
                sz = table.size_bytes[ci]
                bw[pos : pos + len(ci)] = bandwidth_arrays(
                    np.full(len(ci), code_of[o]),
                    sz,
                    sz,
                    d[pos : pos + len(ci)],
                    sizes[table.gid[ci]],
                )[which]
            bw.sort()
            bw_p50.append(sorted_pct(bw, 50))
            del bw
        d.sort()
        rows.append(
            SizeRow(
                table.ops[o],
                b,
                len(d),
                sorted_pct(d, 50),
                sorted_pct(d, 95),
                bw_p50[0],
                bw_p50[1],
                wait_p50_ns=waits.get(k, math.nan),
            )
        )
        del d
    return tuple(sorted(rows, key=lambda r: (r.op, r.size_bucket)))


def _wait_p50_by_key(key: np.ndarray, match: CollectiveMatch) -> dict[int, float]:
    """Size key -> median wait of its matched collectives' members (ns)."""
    if not len(match.member_row):
        return {}
    by_key = RowsByKey(key[match.member_row])  # one sort, not one pass over members per key
    out = {}
    for k in by_key.keys.tolist():
        w = match.member_wait_ns[by_key.rows(k)]  # (a copy, sorted in place)
        w.sort()
        out[int(k)] = sorted_pct(w, 50)
    return out


def _rows_of_key(key: np.ndarray, k: int) -> Iterator[tuple[int, np.ndarray]]:
    """(position among the key's rows, rows) of the rows whose key is ``k``, in row order, a
    chunk of the table at a time."""
    pos = 0
    for c0 in range(0, len(key), _BW_CHUNK * 4):
        ci = np.flatnonzero(key[c0 : c0 + _BW_CHUNK * 4] == k)
        if len(ci):
            ci += c0
            yield pos, ci
            pos += len(ci)


def size_keys(table: EventTable) -> np.ndarray:
    """int32 per row: op · 128 + (exponent of the power-of-two size bucket + 1; 0 for empty
    messages), computed in chunks (4 B per row in all, no full-length sort). The rows of one
    (op, bucket) are then those equal to one key (:func:`split_size_key`)."""
    n = len(table)
    key = np.empty(n, dtype=np.int32)
    for c0 in range(0, n, _BW_CHUNK):
        c1 = min(c0 + _BW_CHUNK, n)
        bucket = size_bucket_array(table.size_bytes[c0:c1])
        exp = np.zeros(c1 - c0, dtype=np.int64)
        pos = bucket > 0
        exp[pos] = np.log2(bucket[pos]).astype(np.int64) + 1
        exp += table.op[c0:c1].astype(np.int64) * 128
        key[c0:c1] = exp
    return key


def split_size_key(key: int) -> tuple[int, int]:
    """(op code, size bucket in bytes) of a :func:`size_keys` value."""
    o, e = divmod(key, 128)
    return o, 0 if e == 0 else 1 << (e - 1)


def sorted_pct(v: np.ndarray, q: float) -> float:
    """``np.percentile(v, q)`` (linear interpolation) of an already sorted array."""
    pos = (len(v) - 1) * (q / 100)
    i = int(np.floor(pos))
    j = min(i + 1, len(v) - 1)
    lo, hi = float(v[i]), float(v[j])
    t = pos - i
    # numpy's lerp, for identical results
    return hi - (hi - lo) * (1 - t) if t >= 0.5 else lo + (hi - lo) * t


def group_rows(table: EventTable, m: CollectiveMatch) -> tuple[GroupRow, ...]:
    """Matching statistics per process group (groups with at least one collective)."""
    rows = []
    skew = m.skew_ns
    # summed in chunks of members (bincount's float and int64 copies stay a few MB; the waits
    # are whole ns, so the float sums are exact in any order)
    wait_by_coll = np.zeros(len(m))
    for c0 in range(0, len(m.member_coll), _BW_CHUNK * 16):
        c1 = c0 + _BW_CHUNK * 16
        wait_by_coll += np.bincount(
            m.member_coll[c0:c1], weights=m.member_wait_ns[c0:c1], minlength=len(m)
        )
    by_group = RowsByKey(m.gid)  # one sort, not one pass over every collective per group
    complete = m.complete
    multi = m.present >= 2
    for g, ref in enumerate(table.groups):
        sel = by_group.rows(g)
        if not len(sel):
            continue
        ok = sel[multi[sel]]
        rows.append(
            GroupRow(
                ref.name,
                ref.desc,
                ref.dimension,
                len(ref.ranks),
                len(sel),
                int((~complete[sel]).sum()),
                float(np.median(skew[ok])) if len(ok) else 0.0,
                float(skew[ok].max()) if len(ok) else 0.0,
                int(wait_by_coll[sel].sum()),
            )
        )
    return tuple(rows)


def comm_share_by_dimension(
    run: LoadedRun, table: EventTable, s: StragglerReport
) -> tuple[tuple[str, ...], np.ndarray]:
    """(dimensions, share): ``share[i, j]`` is the time rank ``s.ranks[i]`` spent in collectives
    of dimension ``dimensions[j]``'s groups (union of intervals, inside its step spans; all its
    events without steps) over its total step time. Dimensions: dp, tp, pp first."""
    dims = tuple(
        sorted(
            {g.dimension for g in table.groups},
            key=lambda d: ("dp", "tp", "pp").index(d) if d in ("dp", "tp", "pp") else 9,
        )
    )
    out = np.zeros((len(s.ranks), len(dims)))
    gdim = np.asarray([dims.index(g.dimension) for g in table.groups] or [0], dtype=np.int8)
    gdim_row = gdim[table.gid]
    start_all, dur_all = table.start_ns, table.duration_ns
    by_rank = RowsByKey(table.rank)
    for i, r in enumerate(s.ranks):
        mine = by_rank.rows(r)
        end_mine = start_all[mine] + dur_all[mine]  # one rank's ends, not the whole column
        st = run.ranks[r].spans
        st = st[st["kind"] == 0]
        if len(st):
            a = st["start_ns"].astype(np.int64)
            b = a + st["duration_ns"].astype(np.int64)
        elif len(mine):
            a = np.asarray([start_all[mine].min()])
            b = np.asarray([end_mine.max()])
        else:
            continue
        total = float((b - a).sum())
        gd = gdim_row[mine]
        for j in range(len(dims)):
            pick = gd == j
            us, ue = intervals.union(start_all[mine[pick]], end_mine[pick])
            cov = intervals.covered(us, ue, a, b)
            if table.sample_fraction < 1:  # a sample: scaled as in find_stragglers
                cov = np.minimum(cov / table.sample_fraction, b - a)
            out[i, j] = float(cov.sum()) / total if total > 0 else 0.0
    return dims, out


def rank_rows(run: LoadedRun, table: EventTable, s: StragglerReport) -> tuple[RankRow, ...]:
    """The per-rank table: means over each rank's recorded steps."""
    with np.errstate(all="ignore"):
        step_mean = (
            np.nanmean(np.where(np.isnan(s.step_ns), np.nan, s.step_ns), axis=1)
            if s.steps
            else np.full(len(s.ranks), np.nan)
        )
        comm_tot = np.nansum(s.comm_ns, axis=1)
        wait_tot = np.nansum(s.wait_ns, axis=1)
        step_tot = np.nansum(s.step_ns, axis=1)
    rows = []
    by_rank = RowsByKey(table.rank)
    for i, r in enumerate(s.ranks):
        rd = run.ranks[r]
        nsteps = int(np.sum(~np.isnan(s.step_ns[i]))) if s.steps else 0
        p50, p95, p99 = step_percentiles(s.step_ns[i] if s.steps else np.zeros(0))
        sc = s.scores[i]
        has_time = bool(nsteps and step_tot[i] > 0)
        rows.append(
            RankRow(
                rank=r,
                host=str(rd.meta.hostname or ""),
                steps=nsteps,
                step_ns=float(step_mean[i]) if nsteps else float("nan"),
                step_p50_ns=p50,
                step_p95_ns=p95,
                step_p99_ns=p99,
                steps_per_s=steps_per_second(rd.spans),
                compute_ns=float((step_tot[i] - comm_tot[i]) / nsteps) if nsteps else float("nan"),
                comm_share=float(comm_tot[i] / step_tot[i]) if has_time else float("nan"),
                wait_share=float(wait_tot[i] / step_tot[i]) if has_time else float("nan"),
                peak_memory_bytes=peak_memory_bytes(rd.memory),
                score=sc.score,
                last_share=sc.last_share,
                events=by_rank.count(r),
            )
        )
    return tuple(rows)


def step_percentiles(step_ns: np.ndarray) -> tuple[float, float, float]:
    """P50, P95, P99 of one rank's step times (ns; NaN entries, steps it did not record, left
    out; linear interpolation); NaNs without steps."""
    v = step_ns[~np.isnan(step_ns)] if len(step_ns) else step_ns
    if not len(v):
        return float("nan"), float("nan"), float("nan")
    p50, p95, p99 = np.percentile(v, [50, 95, 99]).tolist()
    return float(p50), float(p95), float(p99)


def steps_per_second(spans: np.ndarray) -> float:
    """Steps completed per second over the time the steps cover (first start to last end):
    the request rate when each forward is a step. NaN without steps or elapsed time."""
    st = spans[spans["kind"] == 0] if len(spans) else spans
    if not len(st):
        return float("nan")
    t0 = st["start_ns"].astype(np.int64)
    t1 = t0 + st["duration_ns"].astype(np.int64)
    elapsed = int(t1.max() - t0.min())
    return float(len(st) * 1e9 / elapsed) if elapsed > 0 else float("nan")


def mean_step_ns(rows: tuple[RankRow, ...]) -> float:
    """Mean over ranks of their mean step time (ns); NaN when no rank recorded a step."""
    steps = [r.step_ns for r in rows if not np.isnan(r.step_ns)]
    return float(np.mean(steps)) if steps else float("nan")


def memory_imbalance(rows: tuple[RankRow, ...]) -> MemoryImbalance:
    """The highest peak against the median peak of the ranks that sampled memory."""
    valid = {r.rank: r.peak_memory_bytes for r in rows if r.peak_memory_bytes >= 0}
    if not valid:
        return MemoryImbalance(-1, -1, -1, 0.0)
    mr = max(valid, key=lambda r: valid[r])
    med = int(np.median(list(valid.values())))
    return MemoryImbalance(mr, valid[mr], med, valid[mr] / med - 1 if med > 0 else 0.0)


def step_heatmap(s: StragglerReport, max_steps: int = HEATMAP_STEPS) -> StepHeatmap:
    """Step time per rank for the last ``max_steps`` steps, with the median and maximum cell."""
    m = s.step_ns[:, -max_steps:] if s.steps else np.zeros((len(s.ranks), 0))
    present = bool(np.any(~np.isnan(m)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        med = float(np.nanmedian(m)) if present else 0.0
        hi = float(np.nanmax(m)) if present else 0.0
    return StepHeatmap(
        ranks=s.ranks,
        steps=s.steps[-max_steps:],
        step_ns=tuple(tuple(float(v) for v in row) for row in m.tolist()),
        median_ns=med,
        max_ns=hi,
    )


SKEW_EDGES_NS = (0, *(round(10 ** (3 + i / 4)) for i in range(29)))
"""Skew histogram edges: 0, then 1 µs to 10 s, four per decade."""


def skew_histogram(m: CollectiveMatch) -> SkewHistogram:
    """The arrival skews of the collectives with at least two members present, binned on
    :data:`SKEW_EDGES_NS`."""
    skew = m.skew_ns[m.present >= 2]
    idx = np.searchsorted(np.asarray(SKEW_EDGES_NS, dtype=np.int64), skew, side="right") - 1
    counts = (
        np.bincount(idx, minlength=len(SKEW_EDGES_NS))
        if len(skew)
        else np.zeros(len(SKEW_EDGES_NS), dtype=np.int64)
    )
    return SkewHistogram(SKEW_EDGES_NS, tuple(int(c) for c in counts[: len(SKEW_EDGES_NS)]))

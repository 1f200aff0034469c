"""Interval arithmetic on nanosecond timelines: the one place that merges and measures intervals.

Intervals are half-open ``[start, end)`` in integer nanoseconds (int64 numpy arrays); lengths
are nanoseconds (int). Used by the step analysis, the cross-rank report (stragglers), the Kineto
breakdown and the decorator.
"""

from __future__ import annotations

import numpy as np

from meshprof.analyze.compute.sorting import stable_argsort


def union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge overlapping intervals; returns sorted disjoint (starts, ends)."""
    if len(starts) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    s = np.asarray(starts, dtype=np.int64)
    order = stable_argsort(s)
    s = s[order]
    e = np.asarray(ends, dtype=np.int64)[order]
    run_max = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > run_max[:-1]
    idx = np.flatnonzero(new)
    out_s = s[idx]
    out_e = np.maximum.reduceat(e, idx)
    return out_s, out_e


def total(starts: np.ndarray, ends: np.ndarray) -> int:
    """Length of the union of the intervals."""
    s, e = union(starts, ends)
    return int((e - s).sum())


def clipped_total(starts: np.ndarray, ends: np.ndarray, lo: int, hi: int) -> int:
    """Length of the union of the intervals inside [lo, hi)."""
    if len(starts) == 0 or hi <= lo:
        return 0
    s = np.clip(np.asarray(starts, dtype=np.int64), lo, hi)
    e = np.clip(np.asarray(ends, dtype=np.int64), lo, hi)
    return total(s, e)


def covered(us: np.ndarray, ue: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Length of [a, b) covered by the disjoint sorted intervals (us, ue), per window (int64).
    Windows with b <= a cover 0."""
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    if not len(us) or not len(a):
        return np.zeros(len(a), dtype=np.int64)
    cum = np.zeros(len(us) + 1, dtype=np.int64)
    np.cumsum(ue - us, out=cum[1:])
    i = np.searchsorted(ue, a, side="right")
    j = np.searchsorted(us, b, side="left")
    has = j > i
    ii, jj = np.minimum(i, len(us) - 1), np.maximum(j - 1, 0)
    tot = cum[np.maximum(j, i)] - cum[i]
    tot -= np.where(has, np.maximum(a - us[ii], 0), 0)
    tot -= np.where(has, np.maximum(ue[jj] - b, 0), 0)
    return np.maximum(tot, 0)


class Segments:
    """Many "union of a subset of intervals, clipped to a window" questions, answered at once.

    The intervals (sorted by start) are split into segments, each a contiguous range of them
    (``lo[k]:hi[k]``; ranges may overlap, an interval then belongs to several segments). For a
    subset of the intervals and windows ``[a, b)`` that each belong to one segment,
    :meth:`clipped_totals` gives, per window, ``clipped_total(starts[sub], ends[sub], a, b)`` over
    the subset's intervals of that segment only: the exact integers a loop over segments calling
    :func:`clipped_total` gives. Each segment's time range is moved onto its own stretch of one
    axis (a shift per segment, so lengths are unchanged), which turns the per-segment unions into
    one union and the per-window clipping into one ``searchsorted``.
    """

    def __init__(
        self,
        starts: np.ndarray,
        ends: np.ndarray,
        lo: np.ndarray,
        hi: np.ndarray,
        seg_min: np.ndarray,
    ) -> None:
        """``ends`` >= ``starts``; segment k holds intervals lo[k]:hi[k], sorted by start, whose
        starts are all >= seg_min[k] (the whole array need not be sorted: the step analysis
        passes several start-sorted blocks one after the other)."""
        lo = np.asarray(lo, dtype=np.int64)
        hi = np.maximum(np.asarray(hi, dtype=np.int64), lo)
        n = hi - lo
        total = int(n.sum())
        seg = np.repeat(np.arange(len(lo), dtype=np.int64), n)
        first = np.zeros(len(lo), dtype=np.int64)
        if len(lo) > 1:
            np.cumsum(n[:-1], out=first[1:])
        #: interval index of each (segment, member) row, segment by segment, in start order
        self.idx = (np.arange(total, dtype=np.int64) - first[seg] + lo[seg]) if total else seg
        s = np.asarray(starts, dtype=np.int64)[self.idx]
        e = np.asarray(ends, dtype=np.int64)[self.idx]
        self.seg_min = np.asarray(seg_min, dtype=np.int64).copy()
        # every member interval lies in [seg_min, seg_max]: clamping a window into it changes
        # nothing it covers
        self.seg_max = self.seg_min.copy()
        if total:
            np.maximum.at(self.seg_max, seg, e)
        span = self.seg_max - self.seg_min + 1
        self.base = np.zeros(len(lo), dtype=np.int64)
        if len(lo) > 1:
            np.cumsum(span[:-1], out=self.base[1:])
        shift = self.base - self.seg_min
        self.ks = s + shift[seg]
        self.ke = e + shift[seg]

    def key(self, seg: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Times of windows of segment ``seg`` on the shared axis (clamped into the segment)."""
        seg = np.asarray(seg, dtype=np.int64)
        lo = self.seg_min[seg]
        # (np.minimum/np.maximum: the same as np.clip, at ~half its fixed cost per call)
        t = np.minimum(np.maximum(np.asarray(t, dtype=np.int64), lo), self.seg_max[seg])
        return t - lo + self.base[seg]

    def clipped_totals(
        self, subset: np.ndarray | None, seg: np.ndarray, a: np.ndarray, b: np.ndarray
    ) -> np.ndarray:
        """Per window (seg[i], [a[i], b[i])): union length of the subset's intervals of that
        segment inside the window. ``subset`` is a boolean mask over the intervals (None: all)."""
        ks, ke = self.ks, self.ke
        if subset is not None:
            keep = np.asarray(subset, dtype=bool)[self.idx]
            ks, ke = ks[keep], ke[keep]
        a = np.asarray(a, dtype=np.int64)
        b = np.asarray(b, dtype=np.int64)
        if not len(ks) or not len(a):
            return np.zeros(len(a), dtype=np.int64)
        # already sorted by start: merge without sorting again
        run_max = np.maximum.accumulate(ke)
        new = np.ones(len(ks), dtype=bool)
        new[1:] = ks[1:] > run_max[:-1]
        first = np.flatnonzero(new)
        us, ue = ks[first], np.maximum.reduceat(ke, first)
        # both ends of every window onto the shared axis (:meth:`key`, the segment gathered
        # once); a window with b <= a covers 0 (:func:`covered`)
        seg = np.asarray(seg, dtype=np.int64)
        lo, hi = self.seg_min[seg], self.seg_max[seg]
        shift = self.base[seg] - lo
        ka = np.minimum(np.maximum(a, lo), hi) + shift
        kb = np.minimum(np.maximum(b, lo), hi) + shift
        return covered(us, ue, ka, kb)

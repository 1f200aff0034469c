"""Interval arithmetic on nanosecond timelines (numpy; intervals are [start, end))."""

from __future__ import annotations

import numpy as np


def union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge overlapping intervals; returns sorted disjoint (starts, ends)."""
    if len(starts) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.argsort(starts, kind="stable")
    s = np.asarray(starts, dtype=np.int64)[order]
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

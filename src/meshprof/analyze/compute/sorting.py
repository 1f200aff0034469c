"""Fast stable sorts for the analyzers' large integer columns.

``np.argsort(kind="stable")`` and ``np.lexsort`` on millions of int64 values take about a
second each; ``np.sort`` on int64 is vectorized and ten times faster. When a column's range and
the row count fit in 63 bits together, each value is packed with its row index into one int64
(value in the high bits, row in the low bits) and sorted with ``np.sort``: the row indices then
come out in the order a stable argsort gives (equal values keep their row order). Otherwise the
plain numpy sort is used. The results are identical either way.
"""

from __future__ import annotations

import itertools

import numpy as np


def stable_argsort(values: np.ndarray) -> np.ndarray:
    """``np.argsort(values, kind="stable")`` for an integer array (int64 indices)."""
    v = np.asarray(values)
    n = len(v)
    if n < 2:
        return np.arange(n, dtype=np.int64)
    lo = int(v.min())
    span = int(v.max()) - lo
    row_bits = max(int(n - 1).bit_length(), 1)
    if span.bit_length() + row_bits > 63:
        return np.argsort(v, kind="stable").astype(np.int64, copy=False)
    packed = v.astype(np.int64) - lo if lo else v.astype(np.int64)
    packed <<= row_bits
    packed |= np.arange(n, dtype=np.int64)
    packed.sort()
    packed &= (1 << row_bits) - 1
    return packed


def lexsort2(secondary: np.ndarray, primary: np.ndarray) -> np.ndarray:
    """``np.lexsort((secondary, primary))``: sort by ``primary``, ties by ``secondary``, then by
    row (int64 indices)."""
    o1 = stable_argsort(secondary)
    return o1[stable_argsort(np.asarray(primary)[o1])]


def unique_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` for a 1-d integer array."""
    v = np.asarray(values)
    if not len(v):
        return v.copy(), np.zeros(0, dtype=np.int64)
    o = stable_argsort(v)
    s = v[o]
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    np.not_equal(s[1:], s[:-1], out=new[1:])
    inv = np.empty(len(v), dtype=np.int64)
    inv[o] = np.cumsum(new) - 1
    return s[new], inv


def equal_runs(sorted_keys: np.ndarray, min_len: int = 1) -> list[tuple[int, int]]:
    """The runs of equal values of a sorted (or grouped) 1-d array as ``(lo, hi)`` index
    ranges, in order, keeping those of at least ``min_len`` elements."""
    k = np.asarray(sorted_keys)
    if not len(k):
        return []
    bounds = np.flatnonzero(np.r_[True, k[1:] != k[:-1], True]).tolist()
    return [(lo, hi) for lo, hi in itertools.pairwise(bounds) if hi - lo >= min_len]


def group_seq_key(gid: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """One int64 per (group, seq) that orders like the pair (group first) and is equal exactly
    when the pair is: ``gid · span + (seq − min seq)``, where span is the range of ``seq``;
    ``gid · 2**40 + seq`` when that is smaller (it orders the same for |seq| < 2**40)."""
    g = np.asarray(gid).astype(np.int64)
    q = np.asarray(seq).astype(np.int64)
    if not len(q):
        return g * (1 << 40) + q
    lo = int(q.min())
    span = int(q.max()) - lo + 1
    if span >= 1 << 40 or span * (int(g.max()) + 1) >= 1 << 62 or int(g.min()) < 0:
        return g * (1 << 40) + q
    return g * span + (q - lo)


class RowsByKey:
    """The rows of an integer column grouped by value, from one sort (or none when the column
    is already sorted, as :class:`~meshprof.analyze.run.events.table.EventTable`'s rank column is): the
    per-rank (per-group) loops of the analyzers take their rows from here instead of comparing
    the whole column with each value, which cost O(values × rows)."""

    __slots__ = ("_order", "_starts", "keys")

    def __init__(self, values: np.ndarray) -> None:
        v = np.asarray(values)
        if len(v) < 2 or bool(np.all(v[1:] >= v[:-1])):
            self._order: np.ndarray | None = None
            s = v
        else:
            order = stable_argsort(v)
            s = v[order]
            # 4 B per row kept, not 8 (the per-rank rows of millions of matched members)
            self._order = order.astype(np.int32) if len(v) < 2**31 else order
            del order
        cut = np.flatnonzero(np.r_[True, s[1:] != s[:-1]]) if len(s) else np.zeros(0, np.int64)
        self.keys = s[cut]
        self._starts = np.r_[cut, len(s)].astype(np.int64)

    def rows(self, key: int) -> np.ndarray:
        """Row indices (ascending) whose value is ``key``; empty when none."""
        i = int(np.searchsorted(self.keys, key))
        if i >= len(self.keys) or self.keys[i] != key:
            return np.zeros(0, dtype=np.int64)
        a, b = int(self._starts[i]), int(self._starts[i + 1])
        return np.arange(a, b, dtype=np.int64) if self._order is None else self._order[a:b]

    def count(self, key: int) -> int:
        i = int(np.searchsorted(self.keys, key))
        if i >= len(self.keys) or self.keys[i] != key:
            return 0
        return int(self._starts[i + 1] - self._starts[i])

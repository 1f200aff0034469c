"""Statistics per group code: many small groups' medians and spreads from a few array
operations (one sort each), instead of a Python loop of numpy calls per group (~15 µs a call:
400,000 groups at 100,000 ranks). A group code is an integer in [0, n); a member may carry a
second, finer code (a subgroup within its group)."""

from __future__ import annotations

import numpy as np


def grouped_median(x: np.ndarray, code: np.ndarray, n: int) -> np.ndarray:
    """Per code in [0, ``n``): the median of the float values ``x`` whose ``code`` it is, as
    ``np.median`` gives it (the middle value, or the mean of the two middle ones); NaN for a
    code without values. One sort for every group (a Python loop of ``np.median`` calls costs
    ~15 µs a group)."""
    order = np.lexsort((x, code))
    xs, cs = np.asarray(x, dtype=np.float64)[order], code[order]
    cnt = np.bincount(cs, minlength=n)
    start = np.cumsum(cnt) - cnt
    out = np.full(n, np.nan)
    has = cnt > 0
    lo = start[has] + (cnt[has] - 1) // 2
    hi = start[has] + cnt[has] // 2
    out[has] = (xs[lo] + xs[hi]) / 2
    return out


def group_spread(
    x: np.ndarray, g: np.ndarray, ng: int, sub: np.ndarray | None = None
) -> np.ndarray:
    """Per group code: the standard deviation of ``x`` over its members (0 for none); with
    ``sub`` (a code per member, within its group), about each subgroup's own mean (pooled)."""
    cnt = np.maximum(np.bincount(g, minlength=ng), 1)
    if sub is None:
        mean = np.bincount(g, weights=x, minlength=ng)[g] / cnt[g]
    else:
        sc = np.maximum(np.bincount(sub), 1)
        mean = np.bincount(sub, weights=x)[sub] / sc[sub]
    dev = x - mean
    return np.sqrt(np.bincount(g, weights=dev * dev, minlength=ng) / cnt)


def robust_group_spread(
    x: np.ndarray, g: np.ndarray, ng: int, sub: np.ndarray | None = None
) -> np.ndarray:
    """:func:`group_spread` by the median absolute deviation (× 1.4826: a normal sample's standard
    deviation), about each member's group median or, with ``sub``, its subgroup's (pooled over
    the group): a few outlying members do not move it. 0 for a group without members."""
    code = g if sub is None else sub
    n = ng if sub is None else int(sub.max(initial=-1)) + 1
    dev = np.abs(x - grouped_median(x, code, n)[code])
    out = 1.4826 * grouped_median(dev, g, ng)
    return np.nan_to_num(out, nan=0.0)


__all__ = ["group_spread", "grouped_median", "robust_group_spread"]

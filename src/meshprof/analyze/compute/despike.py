"""Spikes out of a per-step series, its level shifts kept: the robust first stage of a
change-point search.

A value is a spike when it lies more than ``k`` noise deviations from the median of the
:data:`HALF_WINDOW` steps either side of it (a moving median keeps a step edge where it is; a
run of up to :data:`HALF_WINDOW` odd steps, a checkpoint or a collector pause, is removed); it
is clipped to that median ± ``k`` deviations. The noise deviation is the robust standard
deviation of the first differences / √2, blind to a level shift itself.

Clipping at the series' *global* median ± k deviations, as both change-point searches did,
erases the step it should find when the steps after it are most of the series and quiet: the
values before it are all clipped to just under the new level, and the split drifts into the
new regime or is lost (a 300 ms decode fault from step 12 of 70 with 0.5 ms of noise was found
at step 14; a rank's compute going from 0.1 s to 0.3 s was missed in 43 % of such series).
"""

from __future__ import annotations

import numpy as np

HALF_WINDOW = 2
"""Steps either side of a value in its moving median (a window of 5)."""


def _row_noise(v: np.ndarray) -> np.ndarray:
    """:func:`step_noise` along the last axis of ``v`` (at least two values there)."""
    d = np.diff(v, axis=-1)
    mad = np.median(np.abs(d - np.median(d, axis=-1, keepdims=True)), axis=-1)
    return np.asarray(1.4826 * mad / np.sqrt(2.0))


def step_noise(x: np.ndarray) -> float:
    """Robust standard deviation of ``x``'s step-to-step noise (same units): 1.4826 × the
    median absolute deviation of its first differences / √2. 0 for fewer than two values."""
    v = np.asarray(x, dtype=np.float64)
    return float(_row_noise(v)) if len(v) >= 2 else 0.0


def moving_median(x: np.ndarray, half: int = HALF_WINDOW) -> np.ndarray:
    """The median of each value's window of ``2·half + 1`` values along the last axis (the ends
    padded with the edge values)."""
    v = np.asarray(x, dtype=np.float64)
    if v.shape[-1] == 0 or half <= 0:
        return v.copy()
    pad = [(0, 0)] * (v.ndim - 1) + [(half, half)]
    win = np.lib.stride_tricks.sliding_window_view(np.pad(v, pad, mode="edge"), 2 * half + 1, -1)
    return np.asarray(np.median(win, axis=-1))


def despike(x: np.ndarray, k: float, half: int = HALF_WINDOW) -> np.ndarray:
    """``x`` (finite values, in step order) with each value clipped to its moving median ±
    ``k`` × :func:`step_noise`; unchanged when the noise is 0 or the series is shorter than a
    window."""
    return despike_rows(np.asarray(x, dtype=np.float64)[None], k, half)[0]


def despike_rows(x: np.ndarray, k: float, half: int = HALF_WINDOW) -> np.ndarray:
    """:func:`despike` of each row of the 2-D ``x`` (one moving median for all rows)."""
    v = np.asarray(x, dtype=np.float64)
    if v.ndim != 2 or v.shape[1] < 2 * half + 1:
        return v
    sigma = _row_noise(v)[:, None]
    mid = moving_median(v, half)
    return np.where(sigma <= 0, v, np.clip(v, mid - k * sigma, mid + k * sigma))


__all__ = ["HALF_WINDOW", "despike", "despike_rows", "moving_median", "step_noise"]

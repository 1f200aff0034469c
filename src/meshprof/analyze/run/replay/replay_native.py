"""The what-if replay's level loop compiled (``replay_levels.c``), for :func:`replay.replay`.

The numpy loop in :mod:`meshprof.analyze.run.replay.replay` pays a fixed ~60 µs of Python and numpy calls
per dependency level; a run with tens of thousands of collectives per rank and step has as many
levels (50,000 at 8 ranks × 1M collectives: 3.3 s). The same loop in C is one pass over the
members × scenarios (milliseconds). It is plain C with no Python or numpy headers, compiled
with the system C compiler on first use (~0.3 s) into a cache directory and loaded with ctypes;
``meshprof report`` does not import torch (the native recorder's extension would cost seconds).

Cache: :func:`meshprof.native_build.cache_dir`, file ``replay-<hash of the source>.so``, built
once per host by :func:`meshprof.native_build.build_c_library` (under a file lock, so concurrent
reports build once). No compiler, a failed build or an unwritable cache: :func:`load` returns None and the
numpy loop runs (same results: ``tests/test_report_memory.py`` compares the two).
``MESHPROF_REPLAY=numpy`` forces the numpy loop.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

import numpy as np

from meshprof.native_build import build_c_library, cache_dir, source_hash

SOURCE = Path(__file__).with_name("replay_levels.c")
BLOCK_MEMBERS = 1 << 16
"""Members converted to int64 per call (levels are never split): a bounded transient, ~5 MB
(2¹⁸ was ~20 MB at the what-if's peak, for no measurable speed)."""

_loaded: Any = None
_tried = False


def load() -> Any:
    """The compiled loop (a ctypes function), or None when it cannot be had here. Never raises."""
    global _loaded, _tried
    if os.environ.get("MESHPROF_REPLAY", "") == "numpy":
        return None
    if _tried:
        return _loaded
    _tried = True
    try:
        target = cache_dir() / f"replay-{source_hash(SOURCE)}.so"
        if not target.exists() and not build_c_library([SOURCE], target):
            return None
        fn = ctypes.CDLL(str(target)).meshprof_replay_levels
    except Exception:
        return None
    i64p = np.ctypeslib.ndpointer(np.int64, flags="C_CONTIGUOUS")
    u8p = np.ctypeslib.ndpointer(np.uint8, flags="C_CONTIGUOUS")
    i64 = ctypes.c_int64
    fn.restype = None
    fn.argtypes = [i64, i64p, i64p, i64p, i64p, i64p, i64p, u8p, i64p, i64p, i64, i64p, i64,
                   i64, i64, i64p, i64p, i64p, i64p, i64, i64p, i64p, i64, i64p]  # fmt: skip
    _loaded = fn
    return fn


def run_levels(
    fn: Any,
    bounds: np.ndarray,
    chain: np.ndarray,
    coll: np.ndarray,
    gap: np.ndarray,
    new_gap: np.ndarray,
    join: np.ndarray,
    waits: np.ndarray,
    after: np.ndarray,
    const: np.ndarray,
    rows: list[np.ndarray],
    state: tuple[np.ndarray, ...],
) -> None:
    """Advance the replay's state (:data:`meshprof.analyze.run.replay.replay.State`: int64, C order)
    through every level, in blocks of whole levels of about :data:`BLOCK_MEMBERS` members
    (each block's columns converted to int64 once, then let go; the gap change
    ``new_gap - gap`` made per block)."""
    e_max, a_last, e_join, held, j_pos, j_slot = state
    k1, n_chains = e_max.shape
    n_held = held.shape[1]
    held_c = np.ascontiguousarray(held)
    cut = np.asarray(bounds, dtype=np.int64)
    widths = np.diff(cut)
    scratch = np.empty(2 * k1 * max(int(widths.max(initial=0)), 1), dtype=np.int64)
    jp_all = np.asarray(j_pos, dtype=np.int64)
    js_all = np.asarray(j_slot, dtype=np.int64)
    n_levels = len(cut) - 1
    l0 = 0
    while l0 < n_levels:
        lo = int(cut[l0])
        l1 = int(np.searchsorted(cut, lo + BLOCK_MEMBERS, side="right")) - 1
        l1 = min(max(l1, l0 + 1), n_levels)
        hi = int(cut[l1])
        sl = slice(lo, hi)

        def i64(a: np.ndarray, sl: slice = sl) -> np.ndarray:
            return np.ascontiguousarray(a[sl], dtype=np.int64)

        c = i64(coll)
        g = i64(gap)
        block_rows = np.empty((len(rows), hi - lo), dtype=np.int64)
        for r, row in enumerate(rows):
            block_rows[r] = row[sl]
        j0, j1 = np.searchsorted(jp_all, [lo, hi])
        fn(
            l1 - l0,
            np.ascontiguousarray(cut[l0 : l1 + 1] - lo),
            i64(chain),
            c,
            g,
            i64(new_gap) - g,
            i64(join),
            np.ascontiguousarray(waits[sl], dtype=np.uint8),
            i64(after),
            np.ascontiguousarray(const[c], dtype=np.int64),
            len(rows),
            block_rows,
            hi - lo,
            k1,
            n_chains,
            e_max,
            a_last,
            e_join,
            held_c,
            n_held,
            np.ascontiguousarray(jp_all[j0:j1] - lo),
            np.ascontiguousarray(js_all[j0:j1]),
            int(j1 - j0),
            scratch,
        )
        l0 = l1
    if held_c is not held:
        held[...] = held_c

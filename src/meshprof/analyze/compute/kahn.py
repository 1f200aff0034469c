"""Kahn's order over a graph held as numpy edge arrays, a wave at a time.

The replay's level computations (:mod:`meshprof.analyze.run.replay`) take the nodes of a graph
with no unplaced predecessor all at once (a *wave*), one Python iteration per wave, each on that
wave's out-edges only. :func:`kahn_waves` is that loop; the callers say what a wave does.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


def kahn_waves(
    out_dst: np.ndarray, out_at: np.ndarray, indeg: np.ndarray
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """The waves of Kahn's order: for each, ``(frontier, cnt, eidx, dst)``: the nodes of the wave,
    the number of out-edges of each, the indices of their out-edges (into ``out_dst``, the
    frontier's ranges concatenated) and those edges' targets.

    The graph is in CSR form: ``out_dst`` the edges' targets sorted by source, ``out_at`` [n + 1]
    where each node's edges start in it; ``indeg`` [n] the number of edges into each node, taken
    over (decremented as waves are placed). The waves end when no node is left without unplaced
    predecessors (on a cycle, before every node was placed: the caller counts the nodes) or when
    a wave has no out-edge (it is the last one yielded)."""
    frontier = np.flatnonzero(indeg == 0)
    while len(frontier):
        lo = out_at[frontier]
        cnt = out_at[frontier + 1] - lo
        total = int(cnt.sum())
        # the frontier's out-edges: ranges [lo, lo + cnt) concatenated
        eidx = np.repeat(lo - (np.cumsum(cnt) - cnt), cnt) + np.arange(total)
        dst = out_dst[eidx]
        yield frontier, cnt, eidx, dst
        if not total:
            return
        hit, times = np.unique(dst, return_counts=True)
        indeg[hit] -= times
        frontier = hit[indeg[hit] == 0]


__all__ = ["kahn_waves"]

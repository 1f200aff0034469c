"""The what-if replay's levels and level loop for runs whose collectives cannot be ordered one
collective at a time (the engine is :mod:`meshprof.analyze.run.replay.replay`).

Ops issued in crossed order on two ranks (1F1B stage pairs: send A then receive B on one, send
B then receive A on the other, neither waiting for its send: async ops, or eager sends) make
the collectives' dependency graph cyclic, though the program is not: an event waits for its
predecessor's *issue* and for the completions it joins, not for its predecessor's collective.
:func:`overlap_levels` levels arrivals and releases separately; :func:`levels_numpy_overlap`
takes each level's arrivals in issue order, then its releases.
"""

from __future__ import annotations

import numpy as np

from meshprof.analyze.compute.kahn import kahn_waves
from meshprof.analyze.compute.sorting import stable_argsort
from meshprof.analyze.run.replay.replay_chains import index_dtype
from meshprof.analyze.run.replay.replay_record import Recorded, fold_joins


def overlap_levels(rec: Recorded) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Levels where an event follows its predecessor's *issue* and the completions it joins,
    not its predecessor's collective (the model's own rule;
    :func:`~meshprof.analyze.run.replay.replay.levels` orders by collectives only, which makes ops
    issued in crossed order on two ranks a cycle). Returns the members in replay order (by
    collective level, then collective), the level boundaries in it, and each member's arrival
    level in that order; None on a real cycle (inconsistent matching).

    Nodes are the members' arrivals and the collectives' releases; edges (weight): a member's
    arrival → its collective's release (0); each member's predecessor's arrival → its arrival
    (0); a member's collective → the arrival of the member it joins (1), or, for a member
    that does not wait (its completion is its arrival + its duration), its arrival → that
    arrival (0). The longest path gives the levels (Kahn's order, one Python iteration per
    wave). A level is taken in two phases by :func:`levels_numpy_overlap`: the arrivals of that
    level, in chain order, then the releases."""
    n, ncoll = len(rec.coll), len(rec.const)
    node_t = index_dtype(n + ncoll)  # node ids: members, then collectives (int32 if they fit)
    coll = rec.coll.astype(node_t, copy=False)
    idx = np.arange(n, dtype=node_t)
    follows = np.flatnonzero(rec.pos > 0).astype(node_t)
    jn = np.flatnonzero(rec.join >= 0)
    target = rec.join[jn].astype(node_t)
    base = node_t(n)
    w_src = rec.waits[jn]
    src_j = np.where(w_src, coll[jn] + base, jn.astype(node_t)).astype(node_t)
    src = np.concatenate([idx, follows - 1, src_j])
    dst = np.concatenate([coll + base, follows, target])
    del idx, follows, target
    w = np.zeros(len(src), dtype=np.int8)
    w[len(src) - len(jn) :] = w_src
    del jn, src_j, w_src
    lvl = _weighted_kahn(src, dst, w, n + ncoll)
    if lvl is None:
        return None
    arrival, release = lvl[:n], lvl[n:]
    key = release[coll] * ncoll + coll.astype(np.int64)  # by level, then collective
    order = stable_argsort(key)
    del key
    ml = release[coll[order]]
    bounds = np.searchsorted(ml, np.arange(int(ml.max(initial=0)) + 2))
    return order, bounds, arrival[order]


def _weighted_kahn(src: np.ndarray, dst: np.ndarray, w: np.ndarray, nn: int) -> np.ndarray | None:
    """Longest-path level of each of ``nn`` nodes over the edges src → dst of weight ``w``
    (a wave of nodes at a time, in Kahn's order); None on a cycle. The edge arrays are
    taken over (each let go once it is sorted)."""
    o = stable_argsort(src).astype(index_dtype(len(src)), copy=False)
    indeg = np.bincount(dst, minlength=nn)
    out_dst, out_w = dst[o], w[o]
    del dst, w
    out_at = np.searchsorted(src[o], np.arange(nn + 1))
    del o, src
    lvl = np.zeros(nn, dtype=np.int64)
    placed = 0
    for frontier, cnt, eidx, d in kahn_waves(out_dst, out_at, indeg):
        placed += len(frontier)
        if len(d):
            np.maximum.at(lvl, d, np.repeat(lvl[frontier], cnt) + out_w[eidx].astype(np.int64))
    return lvl if placed == nn else None


def levels_numpy_overlap(
    m: dict[str, np.ndarray],
    bounds: np.ndarray,
    chain: np.ndarray,
    const: np.ndarray,
    rows: list[np.ndarray],
    state: tuple[np.ndarray, ...],
    arrival: np.ndarray,
) -> None:
    """The level loop for :func:`overlap_levels`' levels: at each level, first the arrivals
    of the members whose arrival level it is, chain by chain in issue order (each after its
    predecessor's issue, possibly made in the same level; a member that does not wait
    completes right there), then the releases and completions of the collectives of that
    level (this path runs only on runs :func:`~meshprof.analyze.run.replay.replay.levels` cannot
    order). A member's part in its release (its arrival, or its completion when it does not
    wait) waits in the level's scratch columns, or, when its collective is released at a later
    level, in a column of its own. ``state``: see :data:`meshprof.analyze.run.replay.replay.State`."""
    e_max, a_last, e_join, held, j_pos, j_slot = state
    c = m["coll"]
    g = m["gap"]
    delta = m["new_gap"] - g
    waits, after, join = m["waits"], m["after_ns"], m["join"]
    orig = m["orig"]
    n, k1 = len(c), e_max.shape[0]
    widths = np.diff(bounds)
    release = np.repeat(np.arange(len(widths), dtype=np.int64), widths)
    pend = arrival < release  # arrived at an earlier level than its collective's release
    slot = np.full(n, -1, dtype=np.int64)
    slot[pend] = np.arange(int(pend.sum()))
    parked = np.empty((k1, int(pend.sum())), dtype=np.int64)
    scratch = np.empty((k1, max(int(widths.max(initial=0)), 1)), dtype=np.int64)
    # arrival order: by arrival level, then by original member index (chain, then issue)
    a_order = stable_argsort(arrival.astype(np.int64) * max(n, 1) + orig)
    a_cut = np.searchsorted(arrival[a_order], np.arange(len(bounds)))
    cut = np.asarray(bounds).tolist()
    cols_k = np.arange(k1)[:, None]

    def moved_on(sel: np.ndarray, done: np.ndarray) -> None:
        """Members ``sel`` completed at ``done`` [k1, len(sel)]: their chains move on."""
        cs = chain[sel]
        np.maximum.at(e_max, (cols_k, cs[None, :]), done)
        jn = join[sel]
        nx = np.flatnonzero(jn == -1)
        if len(nx):
            np.maximum.at(e_join, (cols_k, cs[nx][None, :]), done[:, nx])
        hd = np.flatnonzero(jn >= 0)
        if len(hd):
            held[:, jn[hd]] = done[:, hd]

    for lvl in range(len(cut) - 1):
        lo, hi = cut[lvl], cut[lvl + 1]
        js = a_order[a_cut[lvl] : a_cut[lvl + 1]]
        if len(js):
            ch = chain[js]
            # a chain's members in this level, one round per rank within the chain
            first = np.r_[True, ch[1:] != ch[:-1]]
            run_start = np.maximum.accumulate(np.where(first, np.arange(len(js)), 0))
            r_in = np.arange(len(js)) - run_start
            for t in range(int(r_in.max()) + 1):
                sel = js[r_in == t]
                j0 = np.searchsorted(j_pos, sel)
                j1 = np.searchsorted(j_pos, sel, side="right")
                if (j1 > j0).any():
                    cnt = j1 - j0
                    at = np.repeat(j0 - (np.cumsum(cnt) - cnt), cnt) + np.arange(int(cnt.sum()))
                    fold_joins(e_join, held, chain[j_pos[at]], j_slot[at])
                cs = chain[sel]
                a = np.maximum(a_last[:, cs], e_join[:, cs])
                a += g[sel]
                cols = np.arange(len(sel))
                for r in rows:
                    a[r[sel], cols] += delta[sel]
                a_last[:, cs] = a
                nw = ~waits[sel]
                if nw.any():  # (it completes at its arrival + its duration)
                    a[:, nw] += after[sel[nw]]
                    moved_on(sel[nw], a[:, nw])
                later = pend[sel]
                if later.any():
                    parked[:, slot[sel[later]]] = a[:, later]
                now = ~later
                scratch[:, sel[now] - lo] = a[:, now]
        if hi == lo:
            continue
        a = scratch[:, : hi - lo]
        waited = np.flatnonzero(pend[lo:hi])
        if len(waited):
            a[:, waited] = parked[:, slot[lo + waited]]
        cc = c[lo:hi]
        new = np.r_[True, cc[1:] != cc[:-1]]  # a collective's first member
        starts = np.flatnonzero(new)
        rel = np.maximum.reduceat(a, starts, axis=1)
        np.maximum(rel, const[cc[starts]], out=rel)
        seg = np.cumsum(new) - 1
        wt = np.flatnonzero(waits[lo:hi])
        if len(wt):
            moved_on(lo + wt, rel[:, seg[wt]] + after[lo + wt])

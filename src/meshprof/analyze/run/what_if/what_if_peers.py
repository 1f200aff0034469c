"""The what-if's comparison of each rank with its peers (:mod:`meshprof.analyze.run.what_if.what_if`):
every compute gap and tail against its peers' median, the part of that excess that stands above
the steps' noise, and the distribution-free interval of a median saving (ns)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from meshprof.analyze.compute.sorting import equal_runs, lexsort2, stable_argsort
from meshprof.analyze.run.replay.replay_chains import Chains
from meshprof.analyze.run.replay.replay_record import Recorded

Z = 3.0
"""Standard errors a systematic excess must exceed (see :func:`systematic`): at 3, about 1 in
700 positions of a balanced rank passes by chance (a dimension's scenario sums them over every
rank)."""


def median_interval(x: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval for the median of ``x`` (the per-step savings): the
    order statistics x₍ₖ₎ and x₍ₙ₋ₖ₊₁₎ with the largest k whose binomial coverage
    1 − 2·P(Bin(n, ½) < k) is at least ``level``; the whole range (k = 1) when no k reaches it
    (fewer than 6 steps: 94 % with 5). NaN for no values."""
    v = np.sort(np.asarray(x, dtype=np.float64))
    n = len(v)
    if not n:
        return float("nan"), float("nan")
    cdf, rank = 0.0, 1
    for i in range(n // 2):  # cdf = P(Bin(n, 1/2) <= i)
        cdf += math.comb(n, i) / 2.0**n
        if 1 - 2 * cdf < level:
            break
        rank = i + 2
    return float(v[rank - 1]), float(v[n - rank])


def _others_median(x: np.ndarray) -> np.ndarray:
    """Per column of ``x`` [peer, position]: each row's median over the *other* rows (float;
    a lone row keeps its own values)."""
    p = x.shape[0]
    if p < 2:
        return x.astype(np.float64)
    o = np.argsort(x, axis=0, kind="stable")
    s = np.take_along_axis(x, o, axis=0).astype(np.float64)
    at = np.empty_like(o)  # each row's place in its column's order
    np.put_along_axis(at, o, np.broadcast_to(np.arange(p)[:, None], o.shape), axis=0)

    def kth(j: int) -> np.ndarray:  # the j-th smallest of the others
        return np.where(j < at, s[j][None, :], s[j + 1][None, :])

    q = p - 1
    if q % 2:
        return kth(q // 2)
    return (kth(q // 2 - 1) + kth(q // 2)) / 2


@dataclass(frozen=True, slots=True)
class Peers:
    """What each member and chain is compared with (see :func:`_peer_references`)."""

    ref: np.ndarray
    """int64 [member]: its peers' median gap at its position (its own gap without peers)."""
    tref: np.ndarray
    """int64 [chain]: its peers' median tail."""
    peers: np.ndarray
    """int64 [chain]: peers compared with (0: none)."""


def peer_references(rec: Recorded, ch: Chains, sig: np.ndarray, n_steps: int) -> Peers:
    """Each member's gap and each chain's tail as the median over its *peers*: the other chains
    of the same step and signature (:func:`~meshprof.analyze.run.replay.replay_chains.chain_signatures`: the same pipeline stage and sequence
    of (op, dimension); ranks of different stages are never peers: at one position one may be
    in a forward and the other in a backward; the rank itself is left out, so that with one
    peer a slow rank is compared with a normal one, not with the mean of the two)."""
    nch = len(ch.c_rank)
    ref, tref = rec.gap.copy(), rec.tail.copy()
    peers = np.zeros(nch, dtype=np.int64)
    corder = lexsort2(ch.c_step, sig)
    key = sig[corder] * (n_steps + 1) + ch.c_step[corder]
    for lo, hi in equal_runs(key, min_len=2):
        cs = corder[lo:hi]
        peers[cs] = hi - lo - 1
        tref[cs] = np.rint(_others_median(rec.tail[cs][:, None])[:, 0]).astype(np.int64)
        k = int(rec.c_len[cs[0]])
        if k:
            idx = rec.c_first[cs][:, None] + np.arange(k)[None, :]
            ref[idx] = np.rint(_others_median(rec.gap[idx])).astype(np.int64)
    return Peers(ref, tref, peers)


def systematic(
    ex: np.ndarray, tex: np.ndarray, rec: Recorded, ch: Chains, sig: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each member's and chain's *systematic* excess: at each position of a rank's chains of
    one signature, the median over the replayed steps of its excess there, when that stands
    above the steps' noise (more than :data:`Z` standard errors of the median: 1.2533 × the
    standard deviation over steps / √steps), else 0 (also where the rank's chains of that
    signature are in one step only). Never negative: a scenario only takes off compute. Also
    returns, per chain, whether it was measured (another chain of its rank has its
    signature)."""
    e = np.zeros_like(ex)
    te = np.zeros_like(tex)
    measured = np.zeros(len(tex), dtype=bool)
    key = ch.c_rank * (int(sig.max(initial=0)) + 1) + sig
    corder = stable_argsort(key)
    for lo, hi in equal_runs(key[corder], min_len=2):
        cs = corder[lo:hi]
        measured[cs] = True
        te[cs] = int(np.rint(_above_noise(tex[cs][:, None])[0]))
        k = int(rec.c_len[cs[0]])
        if k:
            idx = rec.c_first[cs][:, None] + np.arange(k)[None, :]
            e[idx] = np.rint(_above_noise(ex[idx])).astype(np.int64)[None, :]
    return e, te, measured


def _above_noise(x: np.ndarray) -> np.ndarray:
    """Per column of ``x`` [step, position]: the median over steps where it exceeds
    :data:`Z` standard errors of the median, else 0."""
    med = np.median(x, axis=0)
    se = 1.2533 * np.std(x, axis=0, ddof=1) / np.sqrt(x.shape[0])
    return np.where(med > Z * se, med, 0.0)

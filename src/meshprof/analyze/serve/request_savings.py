"""What a slow rank costs the requests: the what-if for serving.

For a rank *x*, each serving step is replayed with x computing like its peers: the step's
collectives (and send/recv pairs) are taken in the order of their recorded last arrival; each
member arrives its *gap* after its previous collective ended (the first after its step span
began), and every member of a collective ends when the last has arrived plus its own recorded
time after that last arrival (the transfer). With the recorded gaps this gives back every
recorded end exactly. In x's scenario its gap before each collective is lowered by its
*systematic excess* at that position of the step's chain, and so is the compute after its last
collective (its *tail*; the time the next step's first collective would wait for it: that step
starts earlier by it, as in :mod:`meshprof.analyze.run.what_if`).

x's excess at a position is its gap minus the median of its peers' gaps before the same
collective (the other members of its pipeline stage); its systematic excess there is the median
of that over the steps of the same kind from the onset on, kept where it is positive and above
:data:`Z` standard errors (the step-to-step noise, which no fix removes, stays). The *onset* is
where x's per-step excess (:mod:`meshprof.analyze.serve.rank_breakdown`) steps up and stays: the
split of the serving steps that maximises the mean shift, kept when the steps after it have an
excess above the noise; when none is found and the excess is above the noise throughout, the
first step analysed.

A step's *saving* is the serving rank's recorded step end minus its replayed end. A request's
TTFT saving is the sum of the savings of the steps that ended after its arrival and at or
before its first token; its E2E − TTFT saving the sum over the steps that ended after its first
token and at or before its finish; its TPOT saving that over its output tokens − 1. The
predictions are over the requests whose steps were all analysed (arrival at or after the first
analysed step began, finish at or before the last ended). At most :data:`MAX_REPLAY_STEPS`
steps are replayed per rank (evenly spaced); the others take the median saving of the replayed
steps of their kind from the onset on.
"""

from __future__ import annotations

import math

import numpy as np

from meshprof.analyze.serve.rank_breakdown import StepMatrix
from meshprof.analyze.serve.request_table import RequestTable
from meshprof.analyze.serve.step_kinds import ServingSteps
from meshprof.analyze.serve.step_members import StepMembers
from meshprof.analyze.serve.types import RankCostToRequests
from meshprof.events import STEP_KINDS

Z = 3.0
"""Standard errors a systematic excess (and an onset's step) must exceed."""
MAX_RANKS = 8
"""Ranks replayed: those with the largest excess in decode (every rank with peers up to it)."""
MAX_REPLAY_STEPS = 4096
"""Serving steps replayed per rank at most."""
MIN_STEPS = 6
"""Steps an onset search needs."""


def _se_median(x: np.ndarray) -> float:
    """Standard error of the median of ``x`` (from the MAD: robust to a few outliers)."""
    if len(x) < 2:
        return math.inf
    mad = float(np.median(np.abs(x - np.median(x)))) * 1.4826
    sd = mad if mad > 0 else float(np.std(x))
    return 1.2533 * sd / math.sqrt(len(x))


def onset(excess: np.ndarray) -> int:
    """The index in ``excess`` (a rank's per-step excess, in step order) where it steps up and
    stays, -1 when it has no excess above the noise (see the module docstring)."""
    e = np.asarray(excess, dtype=np.float64)
    idx = np.flatnonzero(np.isfinite(e))
    if not len(idx):
        return -1
    v = e[idx]
    n = len(v)
    whole = float(np.median(v))
    whole_ok = whole > 0 and whole > Z * _se_median(v)
    if n >= MIN_STEPS:
        c = np.cumsum(v)
        k = np.arange(2, n - 1)
        pre = c[k - 1] / k
        post = (c[-1] - c[k - 1]) / (n - k)
        score = (post - pre) * np.sqrt(k * (n - k) / n)
        best = int(k[int(np.argmax(score))])
        a, b = v[:best], v[best:]
        shift = float(np.median(b) - np.median(a))
        noise = Z * math.hypot(_se_median(a), _se_median(b))
        if (
            shift > noise
            and float(np.median(b)) > Z * _se_median(b)
            and shift > 0.5 * abs(float(np.median(b)))
        ):
            return int(idx[best])
    return int(idx[0]) if whole_ok else -1


class _Chains:
    """The members of the serving steps in replay order, with their recorded gaps."""

    def __init__(self, sm: StepMembers, mat: StepMatrix) -> None:
        ri = {r: i for i, r in enumerate(mat.ranks)}
        ns = len(sm.numbers)
        self.nr, self.ns = len(mat.ranks), ns
        start = np.full((self.nr, ns), np.nan)
        end = np.full((self.nr, ns), np.nan)
        if len(sm.span_rank):
            rix = np.asarray([ri[r] for r in sm.span_rank.tolist()], dtype=np.int64)
            start[rix, sm.span_step] = sm.span_start
            end[rix, sm.span_step] = sm.span_end
        self.start, self.end = start, end
        known = np.asarray([r in ri for r in sm.m_rank.tolist()], dtype=bool)
        rank = np.asarray([ri.get(r, 0) for r in sm.m_rank.tolist()], dtype=np.int64)[known]
        step, item = sm.m_step[known], sm.m_item[known]
        arr, mend = sm.m_arrival[known], sm.m_end[known]
        have_span = np.isfinite(start[rank, step])
        rank, step, item, arr, mend = (a[have_span] for a in (rank, step, item, arr, mend))
        last = np.full(int(item.max(initial=-1)) + 1, np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(last, item, arr)
        # chain order within (step, rank): by arrival; the gap from the previous end
        o = np.lexsort((arr, rank, step))
        rank, step, item, arr, mend = (a[o] for a in (rank, step, item, arr, mend))
        first = np.ones(len(o), dtype=bool)
        first[1:] = (rank[1:] != rank[:-1]) | (step[1:] != step[:-1])
        prev_end = np.empty(len(o), dtype=np.float64)
        prev_end[first] = start[rank[first], step[first]]
        prev_end[~first] = mend[np.flatnonzero(~first) - 1]
        gap = arr - prev_end
        grp = np.cumsum(first) - 1
        pos = np.arange(len(o)) - np.flatnonzero(first)[grp]
        # the tail: from the rank's last member end to its span end
        last_m = np.ones(len(o), dtype=bool)
        last_m[:-1] = first[1:]
        tail = end - start
        tail[rank[last_m], step[last_m]] = end[rank[last_m], step[last_m]] - mend[last_m]
        # replay order: by step, then the item's last arrival
        o2 = np.lexsort((rank, item, last[item], step))
        self.rank, self.step, self.item = rank[o2], step[o2], item[o2]
        self.gap, self.pos = gap[o2], pos[o2]
        self.post = np.maximum(mend[o2] - last[item[o2]], 0).astype(np.float64)
        self.tail = tail
        self.stage = np.asarray([sm.stage.get(r, 0) for r in mat.ranks], dtype=np.int64)
        bounds = np.searchsorted(self.step, np.arange(ns + 1))
        self.bounds = bounds
        self.ref = self._peer_refs()
        self.tail_ref = self._tail_refs()

    def _peer_refs(self) -> np.ndarray:
        """Per member: the median gap of the item's other members of its stage (NaN: none)."""
        ref = np.full(len(self.gap), np.nan)
        o = np.lexsort((self.rank, self.item))
        _, starts = np.unique(self.item[o], return_index=True)
        ends = np.r_[starts[1:], len(o)]
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
            if b - a < 2:
                continue
            m = o[a:b]
            st = self.stage[self.rank[m]]
            g = self.gap[m]
            for k in range(b - a):
                peers = (st == st[k]) & (np.arange(b - a) != k)
                if peers.any():
                    ref[m[k]] = float(np.median(g[peers]))
        return ref

    def _tail_refs(self) -> np.ndarray:
        """Per (rank, step): the median tail of its stage's other ranks (NaN: none)."""
        ref = np.full_like(self.tail, np.nan)
        for r in range(self.nr):
            peers = (self.stage == self.stage[r]) & (np.arange(self.nr) != r)
            if peers.any():
                with np.errstate(all="ignore"):
                    t = self.tail[peers]
                    ok = np.isfinite(t)
                    cnt = ok.sum(axis=0)
                    srt = np.sort(np.where(ok, t, np.inf), axis=0)
                    lo = np.take_along_axis(srt, np.maximum((cnt - 1) // 2, 0)[None], 0)[0]
                    hi = np.take_along_axis(srt, np.maximum(cnt // 2, 0)[None], 0)[0]
                    ref[r] = np.where(cnt > 0, (lo + hi) / 2, np.nan)
        return ref


def _systematic(values: np.ndarray) -> float:
    """The median of ``values`` when positive and above :data:`Z` standard errors, else 0."""
    v = values[np.isfinite(values)]
    if len(v) < 2:
        return 0.0
    med = float(np.median(v))
    return med if med > 0 and med > Z * _se_median(v) else 0.0


def rank_savings(
    ch: _Chains, sm: StepMembers, x: int, serving: int, from_step: int, max_steps: int
) -> np.ndarray:
    """Per serving step, the serving rank's end recorded minus replayed with rank row ``x``
    computing like its peers from step index ``from_step`` on (0 before; NaN: not replayed)."""
    ns = ch.ns
    out = np.zeros(ns)
    mine = ch.rank == x
    # systematic excess per (kind, position) and of the tail per kind, from the onset on
    sys_gap: dict[tuple[int, int], float] = {}
    sys_tail: dict[int, float] = {}
    kinds = sm.kind
    after = ch.step >= from_step
    for code in range(len(STEP_KINDS)):
        sel = mine & after & (kinds[ch.step] == code)
        ex = ch.gap[sel] - ch.ref[sel]
        for p in np.unique(ch.pos[sel]).tolist():
            sys_gap[(code, p)] = _systematic(ex[ch.pos[sel] == p])
        cols = np.flatnonzero((kinds == code) & (np.arange(ns) >= from_step))
        sys_tail[code] = _systematic(ch.tail[x, cols] - ch.tail_ref[x, cols])
    cand = np.arange(from_step, ns)
    if len(cand) > max_steps:
        cand = np.unique(np.linspace(from_step, ns - 1, max_steps).round().astype(np.int64))
    replayed = np.zeros(ns, dtype=bool)
    for s in cand.tolist():
        a, b = int(ch.bounds[s]), int(ch.bounds[s + 1])
        if not np.isfinite(ch.start[serving, s]):
            out[s] = np.nan
            continue
        replayed[s] = True
        code = int(kinds[s])
        prev = ch.start[:, s].copy()
        if s > from_step:
            lead = sys_tail.get(int(kinds[s - 1]), 0.0)
            if np.isfinite(prev[x]):
                prev[x] -= lead
        new_end: dict[int, float] = {}
        k = a
        while k < b:
            it = ch.item[k]
            j = k
            last = -math.inf
            while j < b and ch.item[j] == it:
                r = ch.rank[j]
                g = ch.gap[j]
                if r == x:
                    g = max(g - sys_gap.get((code, int(ch.pos[j])), 0.0), 0.0) if g > 0 else g
                arr = prev[r] + g
                last = max(last, arr)
                j += 1
            for m in range(k, j):
                prev[ch.rank[m]] = last + ch.post[m]
                new_end[int(ch.rank[m])] = prev[ch.rank[m]]
            k = j
        tail = ch.tail[serving, s]
        if serving == x:
            tail = max(tail - sys_tail.get(code, 0.0), 0.0)
        replay_end = prev[serving] + tail
        out[s] = ch.end[serving, s] - replay_end
    # the steps not replayed: the median saving of the replayed steps of their kind
    for code in range(len(STEP_KINDS)):
        kind_cols = (kinds == code) & (np.arange(ns) >= from_step)
        done = kind_cols & replayed
        fill = kind_cols & ~replayed & np.isfinite(ch.start[serving])
        if fill.any():
            out[fill] = float(np.median(out[done])) if done.any() else 0.0
    return out


def request_costs(
    sm: StepMembers,
    mat: StepMatrix,
    steps: ServingSteps,
    table: RequestTable,
    *,
    max_ranks: int = MAX_RANKS,
    max_steps: int = MAX_REPLAY_STEPS,
) -> tuple[RankCostToRequests, ...]:
    """What each of the ranks with the largest excess costs the requests (module docstring),
    largest TPOT saving first."""
    if table.rank not in mat.ranks or not len(sm.numbers):
        return ()
    serving = mat.ranks.index(table.rank)
    decode = np.flatnonzero(sm.kind == STEP_KINDS.index("decode"))
    cols = decode if len(decode) else np.arange(len(sm.numbers))
    med = {}
    for i in range(len(mat.ranks)):
        e = mat.excess[i, cols]
        e = e[np.isfinite(e)]
        if len(e):
            med[i] = float(np.median(e))
    chosen = sorted(med, key=lambda i: -med[i])[:max_ranks]
    if not chosen:
        return ()
    ch = _Chains(sm, mat)
    # the serving steps' ends on the serving rank (its own clock) by step index
    end_own = np.full(len(sm.numbers), np.nan)
    idx = np.searchsorted(sm.numbers, steps.step)
    idx = np.minimum(idx, max(len(sm.numbers) - 1, 0))
    ok = sm.numbers[idx] == steps.step
    end_own[idx[ok]] = steps.end_ns[ok]
    start_own = np.full(len(sm.numbers), np.nan)
    start_own[idx[ok]] = steps.start_ns[ok]
    rows = table.rows
    finite = np.isfinite(end_own)
    lo = float(np.nanmin(start_own)) if finite.any() else math.inf
    hi = float(np.nanmax(end_own)) if finite.any() else -math.inf
    inside = (
        table.ok
        & (rows["arrival_ns"] >= lo)
        & (rows["finished_ns"] <= hi + 1)
        & (rows["first_token_ns"] >= 0)
    )
    out = []
    for i in chosen:
        ex_all = mat.excess[i]
        o = onset(ex_all)
        if o < 0:
            continue
        saving = rank_savings(ch, sm, i, serving, o, max_steps)
        out.append(_predict(mat.ranks[i], saving, o, sm, mat, i, end_own, table, inside, cols))
    return tuple(sorted(out, key=lambda c: (-_finite(c.tpot_saving_ns), c.rank)))


def _finite(x: float) -> float:
    return x if math.isfinite(x) else -math.inf


def _predict(
    rank: int,
    saving: np.ndarray,
    first: int,
    sm: StepMembers,
    mat: StepMatrix,
    row: int,
    end_own: np.ndarray,
    table: RequestTable,
    inside: np.ndarray,
    decode_cols: np.ndarray,
) -> RankCostToRequests:
    rows = table.rows
    have = np.isfinite(end_own) & np.isfinite(saving)
    order = np.argsort(end_own[have], kind="stable")
    ends = end_own[have][order]
    cum = np.r_[0.0, np.cumsum(saving[have][order])]

    def saved(t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
        a = np.searchsorted(ends, t0, side="right")
        b = np.searchsorted(ends, t1, side="right")
        return cum[b] - cum[a]

    r = rows[inside]
    ttft = table.ttft_ns[inside]
    tpot = table.tpot_ns[inside]
    ttft_after = ttft - saved(r["arrival_ns"], r["first_token_ns"])
    n = r["output_tokens"].astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot_after = tpot - saved(r["first_token_ns"], r["finished_ns"]) / (n - 1)

    def pct(x: np.ndarray, q: float) -> float:
        x = x[np.isfinite(x)]
        return float(np.percentile(x, q)) if len(x) else math.nan

    kind_of = sm.kind
    dec = saving[decode_cols]
    dec = dec[np.isfinite(dec) & (decode_cols >= first)]
    pre_cols = np.flatnonzero(kind_of == STEP_KINDS.index("prefill"))
    pre = saving[pre_cols]
    pre = pre[np.isfinite(pre) & (pre_cols >= first)]
    ex = mat.excess[row, decode_cols]
    ex = ex[np.isfinite(ex) & (decode_cols >= first)]
    since = int(sm.numbers[first])
    span = np.flatnonzero(sm.span_step == first)
    since_ns = 0
    if len(span):
        since_ns = int(sm.span_start[span].min())
    return RankCostToRequests(
        rank=rank,
        decode_step_saving_ns=float(np.median(dec)) if len(dec) else math.nan,
        prefill_step_saving_ns=float(np.median(pre)) if len(pre) else math.nan,
        excess_ns=float(np.median(ex)) if len(ex) else math.nan,
        since_step=since,
        since_ns=since_ns,
        requests=int(inside.sum()),
        ttft_p50_ns=pct(ttft, 50),
        ttft_p50_after_ns=pct(ttft_after, 50),
        ttft_p99_ns=pct(ttft, 99),
        ttft_p99_after_ns=pct(ttft_after, 99),
        tpot_p50_ns=pct(tpot, 50),
        tpot_p50_after_ns=pct(tpot_after, 50),
        tpot_p99_ns=pct(tpot, 99),
        tpot_p99_after_ns=pct(tpot_after, 99),
    )


__all__ = ["MAX_RANKS", "MAX_REPLAY_STEPS", "Z", "onset", "rank_savings", "request_costs"]

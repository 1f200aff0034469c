"""What a slow rank costs the requests: the what-if for serving.

For a rank *x*, each serving step is replayed with x computing like its peers: the step's
collectives (and send/recv pairs) are taken in the order of their recorded last arrival; each
member arrives its *gap* after its previous collective ended (the first after its step span
began), and every member of a collective ends when the last has arrived plus its own recorded
time after that last arrival (the transfer). With the recorded gaps this gives back every
recorded end exactly. In x's scenario its gap before each collective is lowered by its
*systematic excess* at that position of the step's chain, and so is the compute after its last
collective (its *tail*; the time the next step's first collective would wait for it: that step
starts earlier by it, as in :mod:`meshprof.analyze.run.what_if.what_if`).

x's excess at a position is its gap minus the median of its peers' gaps before the same
collective (the other members of its pipeline stage); its systematic excess there is the median
of that over the steps of the same kind from the onset on, kept where it is positive and above
:data:`Z` standard errors (the step-to-step noise, which no fix removes, stays). The *onset* is
where x's excess steps up and stays, at the position of its decode steps' chain where that step
is clearest, among the positions where it is at least half the largest (:func:`rank_onset`;
one position is far less noisy than the whole step on a busy machine): the split that
maximises the mean shift, kept when the steps after it have an excess above the noise; when
none is found and a position's excess is above the noise throughout, the first step analysed.

A step's *saving* is the serving rank's recorded step end minus its replayed end. A request's
TTFT saving is the sum of the savings of the steps that ended after its arrival and at or
before its first token. Its E2E − TTFT in the counterfactual is its recorded E2E − TTFT with the
savings of the steps that ended after its first token taken off, and with the prefill steps
that interleave with its decoding re-placed: under a prefill-first schedule a prefill runs at
the first step boundary after the arrival of the requests it prefills (its *anchor*), so the
prefills in the request's counterfactual decode window (moved earlier by its TTFT saving and
shortened) are those anchored in it, not those recorded in its window — a faster server has
fewer arrivals during each request's decoding (:class:`_Prefills`, a fixed point of the
window's end); its TPOT saving is the difference over its output tokens − 1. The predictions
are over the requests whose steps were all analysed (arrival at or after the first analysed
step began, finish at or before the last ended). At most :data:`MAX_REPLAY_STEPS` steps are
replayed per rank (evenly spaced); the others take the median saving of the replayed steps of
their kind from the onset on. A schedule other than prefill-first (chunked prefill mixed into
decode steps) keeps its recorded mix: its mixed steps carry their own savings.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from meshprof.analyze.compute.despike import despike
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
ONSET_SHARE = 0.5
"""Share of the excess after a step-up that the step itself must be: an excess that was already
there and grew a little (a rank slow throughout, 150 → 151 ms for the last two steps) began
where it began, not at the growth. Also the share of the largest position's excess that a
position's must reach to place the onset (:func:`rank_onset`)."""


def _se_median(x: np.ndarray) -> float:
    """Standard error of the median of ``x`` (from the MAD: robust to a few outliers)."""
    if len(x) < 2:
        return math.inf
    mad = float(np.median(np.abs(x - np.median(x)))) * 1.4826
    sd = mad if mad > 0 else float(np.std(x))
    return 1.2533 * sd / math.sqrt(len(x))


def _split(excess: np.ndarray) -> tuple[int, float]:
    """(index, score) of the step-up of ``excess`` (finite values, in order): the split that
    maximises the shift of the mean (values despiked at 5 noise deviations of their moving
    median, :func:`~meshprof.analyze.compute.despike.despike`, so that a few steps of a starved
    machine do not place it while the step itself stays whole), kept when the medians after and
    before differ by more than :data:`Z` standard errors and by at least :data:`ONSET_SHARE` of
    the one after, and the one after is above the noise;
    (-1, 0) when there is none. The score is the shift in standard errors."""
    v = np.asarray(excess, dtype=np.float64)
    n = len(v)
    if n < MIN_STEPS:
        return -1, 0.0
    w = despike(v, 5.0)
    c = np.cumsum(w)
    k = np.arange(2, n - 1)
    pre = c[k - 1] / k
    post = (c[-1] - c[k - 1]) / (n - k)
    best = int(k[int(np.argmax((post - pre) * np.sqrt(k * (n - k) / n)))])
    a, b = v[:best], v[best:]
    shift = float(np.median(b) - np.median(a))
    noise = math.hypot(_se_median(a), _se_median(b))
    after = float(np.median(b))
    if shift > Z * noise and after > Z * _se_median(b) and shift >= ONSET_SHARE * after:
        return best, shift / noise if noise > 0 else math.inf
    return -1, 0.0


def onset(excess: np.ndarray) -> int:
    """The index in ``excess`` (a rank's excess per step, in step order; NaN: no value) where
    it steps up and stays (:func:`_split`); the first index when it is above the noise
    throughout; -1 when it has no excess above the noise."""
    e = np.asarray(excess, dtype=np.float64)
    idx = np.flatnonzero(np.isfinite(e))
    if not len(idx):
        return -1
    at, _ = _split(e[idx])
    if at >= 0:
        return int(idx[at])
    return int(idx[0]) if _systematic(e[idx]) > 0 else -1


def rank_onset(ch: _Chains, sm: StepMembers, x: int) -> int:
    """The step index rank row ``x``'s excess began at (-1: it has none), from its excess at
    each position of the chain of its decode steps (its prefill steps when it has no decode
    step), the compute after the last collective counted as one more position. Only the
    positions whose excess from their onset on is at least :data:`ONSET_SHARE` of the largest
    count (a 1 ms step-up at one position does not place the onset of a 150 ms excess at
    another): the first step when one of them is above the noise throughout, else the most
    significant step-up (:func:`_split`) among them."""
    decode = STEP_KINDS.index("decode")
    code = decode if (sm.kind == decode).any() else int(np.bincount(sm.kind).argmax())
    cols = np.flatnonzero(sm.kind == code)
    series: list[tuple[np.ndarray, np.ndarray]] = []
    sel = (ch.rank == x) & (sm.kind[ch.step] == code) & np.isfinite(ch.ref)
    for p in np.unique(ch.pos[sel]).tolist():
        m = sel & (ch.pos == p)
        o = np.argsort(ch.step[m], kind="stable")
        series.append((ch.step[m][o], (ch.gap[m] - ch.ref[m])[o]))
    tail = ch.tail[x, cols] - ch.tail_ref[x, cols]
    ok = np.isfinite(tail)
    series.append((cols[ok], tail[ok]))
    # per position: (its level from its onset on, the onset's step, the step-up's score);
    # a position above the noise throughout scores inf (its onset is its first step)
    found: list[tuple[float, int, float]] = []
    for steps, e in series:
        at, sc = _split(e)
        if at >= 0:
            found.append((float(np.median(e[at:])), int(steps[at]), sc))
        elif len(e) and (level := _systematic(e)) > 0:
            found.append((level, int(steps[0]), math.inf))
    if not found:
        return -1
    top = max(f[0] for f in found)
    major = [f for f in found if f[0] >= ONSET_SHARE * top]
    steady = [f[1] for f in major if f[2] == math.inf]
    return min(steady) if steady else max(major, key=lambda f: f[2])[1]


class _Chains:
    """The members of the serving steps in replay order, with their recorded gaps."""

    def __init__(self, sm: StepMembers, mat: StepMatrix) -> None:
        ri = {r: i for i, r in enumerate(mat.ranks)}
        ns = len(sm.numbers)
        self.nr, self.ns = len(mat.ranks), ns
        # times from the first span's start: float64 holds epoch ns only to 256 ns
        t0 = int(sm.span_start.min()) if len(sm.span_start) else 0
        start = np.full((self.nr, ns), np.nan)
        end = np.full((self.nr, ns), np.nan)
        if len(sm.span_rank):
            rix = np.asarray([ri[r] for r in sm.span_rank.tolist()], dtype=np.int64)
            start[rix, sm.span_step] = sm.span_start - t0
            end[rix, sm.span_step] = sm.span_end - t0
        self.start, self.end = start, end
        known = np.asarray([r in ri for r in sm.m_rank.tolist()], dtype=bool)
        rank = np.asarray([ri.get(r, 0) for r in sm.m_rank.tolist()], dtype=np.int64)[known]
        step, item = sm.m_step[known], sm.m_item[known]
        arr, mend = sm.m_arrival[known] - t0, sm.m_end[known] - t0
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
        size = ends - starts
        # two members of one stage (a tensor-parallel pair, the usual case): each other's gap
        pair = starts[size == 2]
        a_m, b_m = o[pair], o[pair + 1]
        same = self.stage[self.rank[a_m]] == self.stage[self.rank[b_m]]
        ref[a_m[same]] = self.gap[b_m[same]]
        ref[b_m[same]] = self.gap[a_m[same]]
        for a, b in zip(starts[size > 2].tolist(), ends[size > 2].tolist(), strict=True):
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
    computing like its peers from step index ``from_step`` on (0 before; NaN: not replayed).
    ``x`` = -1 replays every step as recorded: every saving is then 0 (the model's
    self-check)."""
    ns = ch.ns
    out = np.zeros(ns)
    mine = ch.rank == x
    # systematic excess per (kind, position) and of the tail per kind, from the onset on
    sys_gap: dict[tuple[int, int], float] = {}
    sys_tail: dict[int, float] = {}
    kinds = sm.kind
    after = ch.step >= from_step
    for code in range(len(STEP_KINDS) if x >= 0 else 0):
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
    chosen = sorted((i for i in med if med[i] > 0), key=lambda i: -med[i])[:max_ranks]
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
    pf = _Prefills.of(steps, table, idx, ok, len(sm.numbers))
    out = []
    for i in chosen:
        o = rank_onset(ch, sm, i)
        if o < 0:
            continue
        saving = rank_savings(ch, sm, i, serving, o, max_steps)
        out.append(_predict(mat.ranks[i], saving, o, sm, mat, i, end_own, table, inside, cols, pf))
    return tuple(sorted(out, key=lambda c: (-_finite(c.tpot_saving_ns), c.rank)))


class _Prefills:
    """The serving rank's prefill steps as they interleave with decoding requests: each one's
    start, its cost to a request decoding meanwhile (from the previous step's end to its end)
    and its anchor (the latest arrival among the requests it prefilled: under a prefill-first
    schedule it runs at the first step boundary after it)."""

    def __init__(
        self, step: np.ndarray, start: np.ndarray, cost: np.ndarray, anchor: np.ndarray
    ) -> None:
        self.step, self.start, self.cost, self.anchor = step, start, cost, anchor

    @classmethod
    def of(
        cls, steps: ServingSteps, table: RequestTable, idx: np.ndarray, ok: np.ndarray, ns: int
    ) -> _Prefills:
        pre = np.flatnonzero((steps.kind == STEP_KINDS.index("prefill")) & ok)
        order = np.argsort(steps.start_ns, kind="stable")
        prev_end = np.empty(len(steps.step), dtype=np.float64)
        prev_end[order] = np.r_[np.nan, steps.end_ns[order][:-1]]
        cost = steps.end_ns[pre] - np.where(
            np.isfinite(prev_end[pre]), prev_end[pre], steps.start_ns[pre]
        )
        anchor = steps.end_ns[pre].astype(np.float64)
        firsts = np.ones(len(table.tok_req), dtype=bool)
        if len(firsts):
            firsts[1:] = table.tok_req[1:] != table.tok_req[:-1]
        arrival = np.full(len(steps.step), -np.inf)
        placed = firsts & (steps.tok_step >= 0)
        np.maximum.at(
            arrival,
            steps.tok_step[placed],
            table.rows["arrival_ns"][table.tok_req[placed]].astype(np.float64),
        )
        known = np.isfinite(arrival[pre])
        anchor[known] = arrival[pre][known]
        return cls(idx[pre], steps.start_ns[pre].astype(np.float64), cost.astype(np.float64),
                   anchor)  # fmt: skip

    def tpot_after(
        self,
        saving: np.ndarray,
        saved: Any,
        r: np.ndarray,
        ttft_saving: np.ndarray,
        rounds: int = 4,
    ) -> np.ndarray:
        """Each request's E2E − TTFT with the savings taken off its steps and the prefills that
        interleave re-placed: those of the requests that arrive while it decodes in the
        counterfactual (its decode window moved and shortened), instead of those that
        interleaved as recorded (fixed point of the window's end)."""
        c = self.cost - np.nan_to_num(saving[self.step], nan=0.0)
        by_start = np.argsort(self.start, kind="stable")
        st, cs = self.start[by_start], np.r_[0.0, np.cumsum(c[by_start])]
        by_anchor = np.argsort(self.anchor, kind="stable")
        an, ca = self.anchor[by_anchor], np.r_[0.0, np.cumsum(c[by_anchor])]
        first = r["first_token_ns"].astype(np.float64)
        fin = r["finished_ns"].astype(np.float64)
        arrival = r["arrival_ns"].astype(np.float64)

        def recorded(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            return cs[np.searchsorted(st, b, "left")] - cs[np.searchsorted(st, a, "right")]

        def anchored(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            return ca[np.searchsorted(an, b, "right")] - ca[np.searchsorted(an, a, "right")]

        shortened = (fin - first) - saved(r["first_token_ns"], r["finished_ns"])
        shortened -= recorded(first, fin)
        s1 = np.maximum(first - ttft_saving, arrival)
        num = shortened + recorded(first, fin)
        for _ in range(rounds):
            num = shortened + anchored(s1, s1 + num)
        return np.asarray(num, dtype=np.float64)


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
    pf: _Prefills,
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
    ttft_saving = saved(r["arrival_ns"], r["first_token_ns"])
    ttft_after = ttft - ttft_saving
    n = r["output_tokens"].astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot_after = pf.tpot_after(saving, saved, r, ttft_saving) / (n - 1)
    tpot_after[n < 2] = np.nan

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


__all__ = [
    "MAX_RANKS",
    "MAX_REPLAY_STEPS",
    "MIN_STEPS",
    "ONSET_SHARE",
    "Z",
    "onset",
    "rank_onset",
    "rank_savings",
    "request_costs",
]

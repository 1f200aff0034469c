"""What-if attribution: how much shorter every step would be if one rank (the ranks of one
process group, of one parallelism dimension) computed like its peers — a replay of the matched
collectives, not a heuristic.

The model (aligned clock, ns). The events of one rank inside one step span form a *chain*, in
issue order. Each event belongs to a *collective*: a matched (group, seq) collective, a matched
send/recv pair, or itself alone (an unmatched event).

- An event's *compute gap* is its arrival (issue) minus what it waited for on its own rank: the
  step's start for the chain's first event; the latest completion of the chain's earlier events
  when they had all completed at its issue (a synchronous program); otherwise the previous
  event's issue (it was issued while an earlier one was in flight).
- A collective is *released* when its last member arrives (it cannot complete before).
- A member that completed at or after the recorded release completes at the release + its
  recorded completion − the recorded release (the transfer after the last arrival); one that
  completed before it (a buffered send, a broadcast root) at its arrival + its own duration.
- The rank's step ends at its latest completion (its last issue, if the step ended before that
  completed) + the recorded time after it: the chain's *tail*, compute after the last collective.
- The step ends when its last rank ends.

Replaying the recorded gaps reproduces the recorded times exactly. A *scenario* replaces some
gaps by their *peer median* — the median, over the ranks that issued the same sequence of
collectives in that step (same op, same dimension, same position: the rank's peers, e.g. the
ranks of one pipeline stage), of the gap at the same position (and of the tail) — then replays
every chain through every group, so a slow TP rank delays its TP group, which delays the DP
collectives of the other TP groups and the pipeline send/recv to the next stage. The *step
saving* of a scenario is the replayed step end without the change minus with it, per step; the
figure is its median over the replayed steps (at most :data:`MAX_STEPS`, evenly spaced over the
steps every rank recorded). Scenarios:

- rank r: all of r's gaps and tails ("rank r computed like the median rank");
- group G: every gap before one of G's collectives, on all its members (the imbalance that G's
  collectives wait for);
- dimension D: every gap before a collective of a D group.

A rank's *excess* is the sum of its gaps and tail above the peer medians (median over steps); the
ranks with the largest excess are replayed (:data:`MAX_RANKS`; every rank when there are no more),
so are the groups with the largest summed excess (:data:`MAX_GROUPS`) and every dimension.
A rank's *phase* is the step-monitor phase holding most of its excess (each gap is attributed to
the phase span covering most of it).

Cost: the collectives get a *level* (1 + the largest level of their members' previous events, 0
for a step's first) from a few sweeps over chain positions; the replay then visits the levels in
order, all steps and all scenarios at once (numpy over members × scenarios), keeping per chain only
its last issue and latest completion: work linear in the events × scenarios, one Python
iteration per level.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshprof.analyze import intervals
from meshprof.analyze.clock import ClockAlignment
from meshprof.analyze.match import CollectiveMatch
from meshprof.analyze.sorting import RowsByKey, lexsort2, stable_argsort, unique_inverse
from meshprof.analyze.stragglers import StragglerReport
from meshprof.analyze.table import EventTable
from meshprof.rundir import LoadedRun

MAX_RANKS = 16
"""Ranks replayed: those with the largest excess compute."""
MAX_GROUPS = 8
"""Process groups replayed: those with the largest summed excess before their collectives."""
MAX_STEPS = 64
"""Steps replayed: evenly spaced over the steps every rank recorded."""
MIN_SHARE = 0.01
"""Savings below this share of the step are not called out in the report's text."""
_MAX_SWEEPS = 64  # level sweeps before giving up (a dependency cycle: mismatched collectives)
_I64_MIN = np.iinfo(np.int64).min


@dataclass(frozen=True, slots=True)
class RankCost:
    """What one rank's extra compute costs every step."""

    rank: int
    """Global rank."""
    step_saving_ns: float
    """How much shorter the step would be if this rank computed like its peers' median (ns,
    median over the replayed steps); negative when it computes less than them on the step's
    critical path."""
    share_of_step: float
    """step_saving_ns / the median step time (fraction)."""
    phase: str | None
    """The step phase holding most of its excess compute; None when no phase was recorded or
    it has no excess."""
    excess_ns: float
    """Its compute gaps and tail above its peers' medians, summed over a step (ns, median over
    the replayed steps): what it would save alone if nobody else gated."""


@dataclass(frozen=True, slots=True)
class GroupCost:
    """What the imbalance paid at one process group's collectives costs every step."""

    group: str
    """Group name (the matching key)."""
    desc: str
    """Group description, e.g. "mesh_tp"."""
    dim: str
    """Its parallelism dimension."""
    step_saving_ns: float
    """How much shorter the step would be if every member's compute before this group's
    collectives were its peers' median (ns, median over the replayed steps)."""
    share_of_step: float
    """step_saving_ns / the median step time (fraction)."""
    excess_ns: float
    """Compute above the peer medians before this group's collectives, all members, per step
    (ns, mean over the replayed steps)."""


@dataclass(frozen=True, slots=True)
class DimCost:
    """What the imbalance paid at one parallelism dimension's collectives costs every step."""

    dim: str
    """"dp", "tp", "pp", "world", ... (see :func:`meshprof.layout.dimension_of`)."""
    step_saving_ns: float
    """How much shorter the step would be if every rank's compute before this dimension's
    collectives were its peers' median (ns, median over the replayed steps)."""
    share_of_step: float
    """step_saving_ns / the median step time (fraction)."""
    excess_ns: float
    """Compute above the peer medians before this dimension's collectives, all ranks, per step
    (ns, mean over the replayed steps)."""


@dataclass(frozen=True, slots=True)
class WhatIf:
    """The what-if attribution of a run (see the module docstring)."""

    ranks: tuple[RankCost, ...]
    """The replayed ranks, largest saving first."""
    groups: tuple[GroupCost, ...]
    """The replayed groups, largest saving first."""
    dims: tuple[DimCost, ...]
    """Every dimension, largest saving first."""
    steps: tuple[int, ...]
    """The step numbers replayed."""
    step_ns: float
    """Median step time over the replayed steps (the median over ranks of each step; ns): the
    denominator of the shares."""
    ranks_total: int
    """Ranks with events in the replayed steps (``len(ranks)`` of them were replayed)."""
    levels: int
    """Dependency levels of the replay (its Python iterations)."""
    min_share: float = MIN_SHARE
    """Savings below this share are not called out in the report's text."""
    note: str = ""
    """Why nothing was replayed, if so."""

    @property
    def notable(self) -> tuple[RankCost, ...]:
        """The ranks whose saving is at least :attr:`min_share` of the step, largest first."""
        return tuple(r for r in self.ranks if r.share_of_step >= self.min_share)


def _empty(note: str, steps: tuple[int, ...] = ()) -> WhatIf:
    return WhatIf((), (), (), steps, float("nan"), 0, 0, note=note)


def chosen_steps(common: tuple[int, ...], max_steps: int = MAX_STEPS) -> tuple[int, ...]:
    """At most ``max_steps`` of the common steps, evenly spaced (first and last included)."""
    if len(common) <= max_steps:
        return tuple(common)
    idx = np.unique(np.linspace(0, len(common) - 1, max_steps).round().astype(np.int64))
    return tuple(common[i] for i in idx.tolist())


@dataclass(slots=True)
class _Chains:
    """The members (events inside the replayed steps, sorted by chain then issue) and chains."""

    row: np.ndarray  # int64 [member]: EventTable row
    chain: np.ndarray  # int64 [member]
    c_rank: np.ndarray  # int64 [chain]
    c_step: np.ndarray  # int64 [chain]: index into the replayed steps
    c_start: np.ndarray  # int64 [chain]: aligned step start
    c_end: np.ndarray  # int64 [chain]: aligned step end


def _chains(run: LoadedRun, table: EventTable, off: np.ndarray, steps: tuple[int, ...]) -> _Chains:
    """Every (rank, replayed step) chain and the events inside its step span."""
    step_set = np.asarray(steps, dtype=np.int64)
    by_rank = RowsByKey(table.rank)
    rows_l, chain_l, rank_l, step_l, start_l, end_l = [], [], [], [], [], []
    n_chains = 0
    for r in sorted(run.ranks):
        sp = run.ranks[r].spans
        st = sp[sp["kind"] == 0]
        st = st[np.isin(st["step"].astype(np.int64), step_set)]
        if not len(st):
            continue
        _, first = np.unique(st["step"], return_index=True)  # one span per step number
        st = st[first]
        st = st[np.argsort(st["start_ns"], kind="stable")]
        a = st["start_ns"].astype(np.int64)
        b = a + st["duration_ns"].astype(np.int64)
        rows = by_rank.rows(r) if r < len(off) else np.zeros(0, dtype=np.int64)
        s = table.start_ns[rows]
        o = stable_argsort(s)
        rows, s = rows[o], s[o]
        i = np.searchsorted(a, s, side="right") - 1
        ok = (i >= 0) & (s < b[np.maximum(i, 0)])
        rows_l.append(rows[ok].astype(np.int64))
        chain_l.append(n_chains + i[ok])
        rank_l.append(np.full(len(st), r, dtype=np.int64))
        step_l.append(np.searchsorted(step_set, st["step"].astype(np.int64)))
        o_r = int(off[r]) if r < len(off) else 0
        start_l.append(a + o_r)
        end_l.append(b + o_r)
        n_chains += len(st)
    cat = (
        (lambda xs: np.concatenate(xs).astype(np.int64))
        if n_chains
        else (lambda xs: np.zeros(0, dtype=np.int64))
    )
    return _Chains(cat(rows_l), cat(chain_l), cat(rank_l), cat(step_l), cat(start_l), cat(end_l))


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 of each value (uint64; wraps)."""
    z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _segmented_cummax(v: np.ndarray, seg: np.ndarray) -> np.ndarray:
    """Running maximum of ``v`` (≥ 0) restarting at each new value of ``seg`` (nondecreasing)."""
    if not len(v):
        return v.copy()
    m = int(v.max()) + 1
    if (int(seg.max()) + 1) * m < 1 << 62:
        key = seg * m + v
        return np.maximum.accumulate(key) - seg * m
    out = v.copy()
    starts = np.flatnonzero(np.r_[True, seg[1:] != seg[:-1]])
    for lo, hi in zip(starts.tolist(), [*starts[1:].tolist(), len(v)], strict=True):
        out[lo:hi] = np.maximum.accumulate(v[lo:hi])
    return out


def what_if(
    run: LoadedRun,
    table: EventTable,
    clock: ClockAlignment,
    match: CollectiveMatch,
    stragglers: StragglerReport,
    *,
    max_ranks: int = MAX_RANKS,
    max_groups: int = MAX_GROUPS,
    max_steps: int = MAX_STEPS,
) -> WhatIf:
    """The what-if attribution of a loaded run (see the module docstring)."""
    steps = chosen_steps(stragglers.common_steps, max_steps)
    if not steps:
        return _empty(stragglers.note or "no step recorded by every rank")
    offsets = clock.offsets()
    n_ranks = int(table.rank.max()) + 1 if len(table) else 0
    off = np.asarray([offsets.get(r, 0) for r in range(max(n_ranks, max(run.ranks) + 1))])
    off = off.astype(np.int64)
    ch = _chains(run, table, off, steps)
    if not len(ch.row):
        return _empty("no collective inside the steps every rank recorded", steps)
    n, nch = len(ch.row), len(ch.c_rank)
    rows = ch.row
    rank = table.rank[rows].astype(np.int64)
    a0 = table.start_ns[rows] + off[rank]
    dur = table.duration_ns[rows].astype(np.int64)
    e0 = a0 + dur
    gid = table.gid[rows].astype(np.int64)

    # collectives: matched (group, seq), matched send/recv pairs, else the event alone
    nc, npairs = len(match), len(match.p2p_send_row)
    coll_of_row = np.full(len(table), -1, dtype=np.int64)
    coll_of_row[match.member_row] = match.member_coll
    coll_of_row[match.p2p_send_row] = nc + np.arange(npairs)
    coll_of_row[match.p2p_recv_row] = nc + np.arange(npairs)
    coll = coll_of_row[rows]
    alone = np.flatnonzero(coll < 0)
    coll[alone] = nc + npairs + np.arange(len(alone))
    ucoll, cm = unique_inverse(coll)
    ncm = len(ucoll)
    # arrivals of members outside the replayed steps stay as recorded
    const = np.full(ncm, _I64_MIN, dtype=np.int64)
    compact = np.full(nc + npairs + len(alone), -1, dtype=np.int64)
    compact[ucoll] = np.arange(ncm)
    kept = np.zeros(len(table), dtype=bool)
    kept[rows] = True
    other = np.flatnonzero(~kept & (coll_of_row >= 0))
    other = other[compact[coll_of_row[other]] >= 0]
    if len(other):
        a_other = table.start_ns[other] + off[table.rank[other]]
        np.maximum.at(const, compact[coll_of_row[other]], a_other)
    release0 = const.copy()
    np.maximum.at(release0, cm, a0)
    waits = e0 >= release0[cm]
    d = np.where(waits, e0 - release0[cm], dur)

    # chains: positions, what each event waited for on its own rank, gaps, tails
    new = np.r_[True, ch.chain[1:] != ch.chain[:-1]]
    first_idx = np.flatnonzero(new)
    c_first = np.full(nch, -1, dtype=np.int64)
    c_len = np.zeros(nch, dtype=np.int64)
    c_first[ch.chain[first_idx]] = first_idx
    c_len[ch.chain[first_idx]] = np.diff(np.r_[first_idx, n])
    pos = np.arange(n) - c_first[ch.chain]
    start_m = ch.c_start[ch.chain]
    emax_rel = _segmented_cummax(e0 - start_m, ch.chain)
    emax_before = np.where(pos > 0, np.r_[0, emax_rel[:-1]], 0) + start_m
    a_prev = np.r_[0, a0[:-1]]
    overlapped = (pos > 0) & (emax_before > a0)
    g = a0 - np.where(overlapped, a_prev, emax_before)
    has = c_len > 0
    last = c_first + c_len - 1
    c_emax = np.where(has, emax_rel[np.maximum(last, 0)] + ch.c_start, ch.c_start)
    c_alast = np.where(has, a0[np.maximum(last, 0)], ch.c_start)
    after_all = ch.c_end >= c_emax
    tail = ch.c_end - np.where(after_all, c_emax, c_alast)

    # peers: chains of one step with the same sequence of (op, dimension) → median gaps
    dims = sorted({gr.dimension for gr in table.groups})
    dim_of_gid = np.asarray(
        [dims.index(gr.dimension) for gr in table.groups] or [0], dtype=np.int64
    )
    dimc = dim_of_gid[gid]
    h = _mix((table.op[rows].astype(np.int64) << 40) ^ (dimc << 32) ^ pos)
    sig = np.zeros(nch, dtype=np.uint64)
    sig[ch.chain[first_idx]] = np.add.reduceat(h, first_idx)
    sig = _mix(sig ^ c_len.astype(np.uint64))
    gmed, tmed = g.copy(), tail.copy()
    _, sig_id = unique_inverse(sig.view(np.int64))
    corder = lexsort2(ch.c_step, sig_id)
    key = sig_id[corder] * (len(steps) + 1) + ch.c_step[corder]
    bounds = np.flatnonzero(np.r_[True, key[1:] != key[:-1], True])
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        if hi - lo < 2:
            continue
        cs = corder[lo:hi]
        tmed[cs] = int(np.rint(np.median(tail[cs])))
        k = int(c_len[cs[0]])
        if k:
            idx = c_first[cs][:, None] + np.arange(k)[None, :]
            gmed[idx] = np.rint(np.median(g[idx], axis=0)).astype(np.int64)[None, :]
    ex = g - gmed
    tex = tail - tmed

    # candidates by excess
    c_ex = tex.astype(np.float64)
    np.add.at(c_ex, ch.chain, ex)
    rank_ids = np.unique(ch.c_rank)
    rank_ex = {}
    by_chain_rank = RowsByKey(ch.c_rank)
    for r in rank_ids.tolist():
        rank_ex[r] = float(np.median(c_ex[by_chain_rank.rows(r)]))
    rank_c = sorted(rank_ids.tolist(), key=lambda r: (-rank_ex[r], r))[: max(max_ranks, 0)]
    g_ex = np.bincount(gid, weights=ex, minlength=len(table.groups)) / len(steps)
    present = np.unique(gid)
    multi = [x for x in present.tolist() if len(table.groups[x].ranks) >= 2]
    group_c = sorted(multi, key=lambda x: (-g_ex[x], x))[: max(max_groups, 0)]
    d_ex = np.bincount(dimc, weights=ex, minlength=len(dims)) / len(steps)
    dim_c = sorted(np.unique(dimc).tolist())

    levels = _levels(cm, pos, ncm)
    if levels is None:
        return _empty("the collectives' order is inconsistent across ranks (a cycle)", steps)
    ends = _replay(
        levels,
        cm,
        ch,
        np.asarray(rank_c, dtype=np.int64),
        np.asarray(group_c, dtype=np.int64),
        np.asarray(dim_c, dtype=np.int64),
        _Members(rank, gid, dimc, g, gmed, overlapped, waits, d, dur, const),
        after_all,
        tail,
        tmed,
    )
    job = np.full((len(steps), ends.shape[1]), _I64_MIN, dtype=np.int64)
    np.maximum.at(job, ch.c_step, ends)
    saving = np.median((job[:, :1] - job).astype(np.float64), axis=0)
    step_ns = _median_step(stragglers, steps)
    share = (lambda v: v / step_ns) if step_ns > 0 else (lambda v: float("nan"))
    col = 1
    ranks_out = []
    for r in rank_c:
        ranks_out.append(
            RankCost(
                r,
                float(saving[col]),
                share(float(saving[col])),
                _phase(run, r, ch, rank, a0, g, ex, tail, tex, off),
                rank_ex[r],
            )
        )
        col += 1
    groups_out = []
    for x in group_c:
        gr = table.groups[x]
        v = float(saving[col])
        groups_out.append(GroupCost(gr.name, gr.desc, gr.dimension, v, share(v), float(g_ex[x])))
        col += 1
    dims_out = []
    for x in dim_c:
        v = float(saving[col])
        dims_out.append(DimCost(dims[x], v, share(v), float(d_ex[x])))
        col += 1
    return WhatIf(
        ranks=tuple(sorted(ranks_out, key=lambda c: (-c.step_saving_ns, c.rank))),
        groups=tuple(sorted(groups_out, key=lambda c: (-c.step_saving_ns, c.group))),
        dims=tuple(sorted(dims_out, key=lambda c: (-c.step_saving_ns, c.dim))),
        steps=steps,
        step_ns=step_ns,
        ranks_total=len(rank_ids),
        levels=int(levels[1].size - 1),
    )


def _levels(cm: np.ndarray, pos: np.ndarray, ncm: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The members in replay order (by level, then collective) and the level boundaries in it;
    None on a dependency cycle.

    level(c) = 1 + the largest level of its members' previous events' collectives (0 for a
    chain's first): Gauss–Seidel sweeps over chain positions until nothing changes (two sweeps
    when every collective's members sit at the same position of their chains)."""
    lvl = np.zeros(ncm, dtype=np.int64)
    porder = stable_argsort(pos)
    pb = np.searchsorted(pos[porder], np.arange(int(pos.max()) + 2))
    for _ in range(_MAX_SWEEPS):
        changed = False
        for p in range(1, len(pb) - 1):
            idx = porder[pb[p] : pb[p + 1]]
            want = lvl[cm[idx - 1]] + 1
            up = want > lvl[cm[idx]]
            if up.any():
                np.maximum.at(lvl, cm[idx[up]], want[up])
                changed = True
        if not changed:
            break
    else:
        return None
    ml = lvl[cm]
    order = lexsort2(cm, ml)
    bounds = np.searchsorted(ml[order], np.arange(int(ml.max()) + 2))
    return order, bounds


@dataclass(frozen=True, slots=True)
class _Members:
    """Per-member inputs of the replay."""

    rank: np.ndarray
    gid: np.ndarray
    dimc: np.ndarray
    g: np.ndarray
    gmed: np.ndarray
    overlapped: np.ndarray
    waits: np.ndarray
    d: np.ndarray
    dur: np.ndarray
    const: np.ndarray  # [collective]: latest arrival of members not replayed


def _replay(
    levels: tuple[np.ndarray, np.ndarray],
    cm: np.ndarray,
    ch: _Chains,
    rank_c: np.ndarray,
    group_c: np.ndarray,
    dim_c: np.ndarray,
    m: _Members,
    after_all: np.ndarray,
    tail: np.ndarray,
    tmed: np.ndarray,
) -> np.ndarray:
    """Each chain's end (int64 [chain, scenario]); scenario 0 is the recorded gaps, then one per
    rank of ``rank_c``, group of ``group_c`` and dimension of ``dim_c``."""
    order, bounds = levels
    k = 1 + len(rank_c) + len(group_c) + len(dim_c)
    a_last = np.repeat(ch.c_start[:, None], k, axis=1)
    e_max = a_last.copy()
    for lvl in range(len(bounds) - 1):
        idx = order[bounds[lvl] : bounds[lvl + 1]]
        if not len(idx):
            continue
        chn = ch.chain[idx]
        swap = np.concatenate(
            [
                np.zeros((len(idx), 1), dtype=bool),
                m.rank[idx][:, None] == rank_c[None, :],
                m.gid[idx][:, None] == group_c[None, :],
                m.dimc[idx][:, None] == dim_c[None, :],
            ],
            axis=1,
        )
        gap = np.where(swap, m.gmed[idx][:, None], m.g[idx][:, None])
        arr = np.where(m.overlapped[idx][:, None], a_last[chn], e_max[chn]) + gap
        c = cm[idx]
        seg = np.r_[True, c[1:] != c[:-1]]
        starts = np.flatnonzero(seg)
        rel = np.maximum(np.maximum.reduceat(arr, starts, axis=0), m.const[c[starts]][:, None])
        rel = rel[np.cumsum(seg) - 1]
        done = np.where(m.waits[idx][:, None], rel + m.d[idx][:, None], arr + m.dur[idx][:, None])
        a_last[chn] = arr
        e_max[chn] = np.maximum(e_max[chn], done)
    tails = np.repeat(tail[:, None], k, axis=1)
    mine = ch.c_rank[:, None] == rank_c[None, :]
    tails[:, 1 : 1 + len(rank_c)] = np.where(mine, tmed[:, None], tail[:, None])
    return np.where(after_all[:, None], e_max, a_last) + tails


def _median_step(s: StragglerReport, steps: tuple[int, ...]) -> float:
    """Median over the replayed steps of the median step time across ranks (ns)."""
    col = {x: i for i, x in enumerate(s.steps)}
    cols = [col[x] for x in steps if x in col]
    if not cols or not len(s.ranks):
        return float("nan")
    per_step = np.nanmedian(s.step_ns[:, cols], axis=0)
    return float(np.nanmedian(per_step)) if np.isfinite(per_step).any() else float("nan")


def _phase(
    run: LoadedRun,
    r: int,
    ch: _Chains,
    rank: np.ndarray,
    a0: np.ndarray,
    g: np.ndarray,
    ex: np.ndarray,
    tail: np.ndarray,
    tex: np.ndarray,
    off: np.ndarray,
) -> str | None:
    """The phase holding most of rank r's excess (gaps and tails), on its own clock."""
    rd = run.ranks[r]
    sp = rd.spans
    ph = sp[sp["kind"] == 1]
    if not len(ph):
        return None
    names = rd.span_names
    mine = np.flatnonzero(rank == r)
    cm_ = np.flatnonzero(ch.c_rank == r)
    lo = np.r_[a0[mine] - g[mine], ch.c_end[cm_] - tail[cm_]] - off[r]
    hi = np.r_[a0[mine], ch.c_end[cm_]] - off[r]
    weight = np.r_[ex[mine], tex[cm_]].astype(np.float64)
    labels = [names[x] if x < len(names) else f"#{x}" for x in ph["name"].tolist()]
    uniq = sorted(set(labels))
    lab = np.asarray([uniq.index(x) for x in labels])
    ps = ph["start_ns"].astype(np.int64)
    pe = ps + ph["duration_ns"].astype(np.int64)
    cover = np.zeros((len(uniq), len(lo)), dtype=np.int64)
    for j in range(len(uniq)):
        us, ue = intervals.union(ps[lab == j], pe[lab == j])
        cover[j] = intervals.covered(us, ue, lo, hi)
    best = cover.argmax(axis=0)
    where = cover.max(axis=0) > 0
    per = np.bincount(best[where], weights=weight[where], minlength=len(uniq))
    if not len(per) or per.max() <= 0:
        return None
    return uniq[int(per.argmax())]

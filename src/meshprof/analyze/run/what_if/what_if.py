"""What-if attribution: how much shorter every step would be if one rank (the ranks of one
process group, of one parallelism dimension) computed like its peers — a replay of the matched
collectives (:mod:`meshprof.analyze.run.replay.replay`: chains of events per rank and step, compute gaps,
collectives released by their last arrival), not a heuristic.

*Peers*: the ranks of the same pipeline stage (position in their pipeline-parallel group) that
issued the same sequence of collectives (same op, same dimension, same position) in the step;
ranks of different stages are never peers (at one position one may be in a forward, the other
in a backward). A member's *excess* is its compute gap minus the median of its peers' gaps at
its position (itself left out: with one peer, a slow rank is compared with a normal one); a
chain's tail (compute after its last collective) likewise. Its *systematic excess* is the
median of its excess over the replayed steps (the same rank, signature and position), kept
where it exceeds :data:`~meshprof.analyze.run.what_if.what_if_peers.Z` standard errors of that median and is positive, else 0: what the
rank does more than its peers every step, without the step-to-step noise that no fix removes.

A *scenario* takes the systematic excess off some gaps (in a rank's scenario, its tail's
excess is taken off its step's start instead: the compute after the last collective delays the
rank's next step, where it costs nothing if the rank then waits anyway), then replays every chain
through every group, so a slow TP rank delays its TP group, which delays the DP collectives of
the other TP groups and the pipeline send/recv to the next stage. The step ends when its last
rank ends. The *step saving* of a scenario is the replayed step end with the recorded gaps
minus with the scenario's, per step (never negative: a scenario only takes compute off); the
figure is its median over the replayed steps (for a rank, those where its chain was measured:
its signature repeated), with a 95 % distribution-free interval (:func:`median_interval`).
Scenarios:

- rank r: all of r's gaps and tails ("rank r computed like its peers");
- group G: every gap before one of G's collectives, on all its members (the imbalance that G's
  collectives wait for);
- dimension D: every gap before a collective of a D group.

A cost is *notable* (named in the report's text) when its interval lies above zero and it is at
least :data:`MIN_SHARE` of the step; a rank without peers is not measured (listed in
:attr:`WhatIf.unmeasured`; when no rank has one, the note says so and nothing is replayed).

A rank's *excess* is the sum of its gaps' and tail's excess (median over steps); the
ranks with the largest excess are replayed (:data:`MAX_RANKS`; every rank in runs of up to
:data:`ALL_RANKS_UP_TO` ranks), so are the groups with the largest summed excess
(:data:`MAX_GROUPS`) and every dimension. The steps replayed are evenly spaced over the steps
every rank recorded but the first (it starts from the ranks' launch, not from a step's end;
kept when fewer than 3): at most :data:`MAX_STEPS`, and fewer (not under :data:`MIN_STEPS`)
when events × scenarios would exceed :data:`CELL_BUDGET`.
A rank's *phase* is the step-monitor phase holding most of its excess (each gap is attributed to
the phase span covering most of it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from meshprof.analyze.compute import intervals
from meshprof.analyze.compute.heap import release_free_memory
from meshprof.analyze.compute.sorting import RowsByKey
from meshprof.analyze.run.events.clock import ClockAlignment
from meshprof.analyze.run.events.match import CollectiveMatch
from meshprof.analyze.run.events.table import EventTable
from meshprof.analyze.run.replay.replay import in_order, join_plan, levels, replay
from meshprof.analyze.run.replay.replay_chains import (
    build_chains,
    chain_signatures,
    pipeline_stages,
)
from meshprof.analyze.run.replay.replay_overlap import overlap_levels
from meshprof.analyze.run.replay.replay_record import I64_MIN, record
from meshprof.analyze.run.replay.replay_repair import RecordCheck
from meshprof.analyze.run.stragglers.stragglers import StragglerReport
from meshprof.analyze.run.what_if.what_if_checks import contradicted_ns, reading_doubt
from meshprof.analyze.run.what_if.what_if_peers import median_interval, peer_references, systematic
from meshprof.rundir import LoadedRun

MAX_RANKS = 8
"""Ranks replayed beyond :data:`ALL_RANKS_UP_TO` ranks: those with the largest excess compute."""
ALL_RANKS_UP_TO = 32
"""Every rank is replayed in runs of at most this many ranks."""
MAX_GROUPS = 4
"""Process groups replayed: those with the largest summed excess before their collectives."""
MAX_STEPS = 64
"""Steps replayed at most: evenly spaced over the steps every rank recorded."""
MIN_STEPS = 5
"""Steps replayed at least (when recorded), whatever :data:`CELL_BUDGET` says."""
CELL_BUDGET = 16_000_000
"""Events × scenarios replayed at most (beyond :data:`MIN_STEPS`): fewer steps in runs with
many events per step, so the replay stays a small part of the report."""
MIN_SHARE = 0.01
"""Savings below this share of the step are not called out in the report's text."""


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
    ci_low_ns: float = float("nan")
    """Lower end of the 95 % interval of the step saving (ns): an order statistic of the
    per-step savings (see :func:`median_interval`)."""
    ci_high_ns: float = float("nan")
    """Upper end of that interval (ns)."""
    peers: int = 0
    """Ranks it was compared with (the most over the replayed steps): the other ranks of its
    pipeline stage that issued the same collectives; 0: none, its cost is not measured."""

    @property
    def measurable(self) -> bool:
        """Compared with peers, and the interval of its saving lies above zero."""
        return self.peers > 0 and self.ci_low_ns > 0


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
    """Systematic excess compute (see the module docstring) before this group's collectives,
    all members, per step (ns, mean over the replayed steps)."""
    ci_low_ns: float = float("nan")
    """Lower end of the 95 % interval of the step saving (ns; see :attr:`RankCost.ci_low_ns`)."""
    ci_high_ns: float = float("nan")
    """Upper end of that interval (ns)."""


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
    """Systematic excess compute (see the module docstring) before this dimension's
    collectives, all ranks, per step (ns, mean over the replayed steps)."""
    ci_low_ns: float = float("nan")
    """Lower end of the 95 % interval of the step saving (ns; see :attr:`RankCost.ci_low_ns`)."""
    ci_high_ns: float = float("nan")
    """Upper end of that interval (ns)."""


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
    replay_error_ns: int = 0
    """Largest |replayed − recorded| step end of a rank with the recorded gaps (ns): the
    engine's self-check (0 unless the replay is wrong; the record's own are below)."""
    min_share: float = MIN_SHARE
    """Savings below this share are not called out in the report's text."""
    note: str = ""
    """Why nothing was replayed, if so."""
    unmeasured: tuple[int, ...] = ()
    """Replayed ranks without peers (no other rank of their pipeline stage issued the same
    collectives): their compute is compared with nobody's, their cost is not measured."""
    record: RecordCheck = field(default_factory=RecordCheck)
    """What the record contradicted and how it was repaired before the replay
    (:mod:`~meshprof.analyze.run.replay.replay_repair`)."""
    doubt: str = ""
    """Why no saving is measured though the run was replayed ("" when they are: see
    :func:`~meshprof.analyze.run.what_if.what_if_checks.reading_doubt`): the savings are then given
    but never called out."""
    contradicted_ns: float = 0.0
    """Issues recorded before completions the model says they waited for, summed per chain
    (median over chains, ns per step; :func:`~meshprof.analyze.run.what_if.what_if_checks.
    contradicted_ns`): 0 on a record the model fits."""

    @property
    def notable(self) -> tuple[RankCost, ...]:
        """The ranks whose cost stands above the run's noise: measurable (compared with peers,
        the 95 % interval of its saving above zero) and at least :attr:`min_share` of the
        step; largest first. None when the savings are in :attr:`doubt`."""
        if self.doubt:
            return ()
        return tuple(r for r in self.ranks if r.measurable and r.share_of_step >= self.min_share)

    def notable_cost(self, c: GroupCost | DimCost) -> bool:
        """A group's or dimension's saving stands above the noise (interval above zero) and is
        at least :attr:`min_share` of the step (never when the savings are in doubt)."""
        return not self.doubt and c.ci_low_ns > 0 and c.share_of_step >= self.min_share


def _empty(note: str, steps: tuple[int, ...] = ()) -> WhatIf:
    return WhatIf((), (), (), steps, float("nan"), 0, 0, note=note)


def chosen_steps(common: tuple[int, ...], max_steps: int = MAX_STEPS) -> tuple[int, ...]:
    """At most ``max_steps`` of the common steps, evenly spaced (first and last included)."""
    if len(common) <= max_steps:
        return tuple(common)
    idx = np.unique(np.linspace(0, len(common) - 1, max_steps).round().astype(np.int64))
    return tuple(common[i] for i in idx.tolist())


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
    n_loaded = len(run.ranks)
    if n_loaded <= ALL_RANKS_UP_TO:
        max_ranks = max(max_ranks, n_loaded)
    dims = sorted({gr.dimension for gr in table.groups})
    per_step = len(table) / max(len(stragglers.steps), 1)
    scenarios = 1 + min(max_ranks, n_loaded) + min(max_groups, len(table.groups)) + len(dims)
    fit = int(CELL_BUDGET // max(per_step * scenarios, 1))
    common = stragglers.common_steps
    if len(common) >= 3:  # the first step starts from the ranks' launch, not a step's end
        common = common[1:]
    steps = chosen_steps(common, min(max_steps, max(fit, MIN_STEPS)))
    if not steps:
        return _empty(stragglers.note or "no step recorded by every rank")
    offsets = clock.offsets()
    n_off = max(int(table.rank.max(initial=0)), max(run.ranks)) + 1
    off = np.asarray([offsets.get(r, 0) for r in range(n_off)], dtype=np.int64)
    ch = build_chains(run, table, off, steps)
    if not len(ch.row):
        return _empty("no collective inside the steps every rank recorded", steps)
    gid = table.gid[ch.row]
    dim_of_gid = np.asarray([dims.index(gr.dimension) for gr in table.groups] or [0])
    dimc = dim_of_gid.astype(np.int16 if len(dims) < 1 << 15 else np.int64)[gid]
    sig = chain_signatures(ch, table.op[ch.row], dimc, pipeline_stages(table, n_off))
    rec = record(table, match, off, ch, sig)
    step_ns = _median_step(stragglers, steps)
    doubt = reading_doubt(table, match, off, ch, sig, rec, len(steps), step_ns)
    check, contradicted = rec.check, contradicted_ns(rec, ch)
    release_free_memory()  # (the temporaries of each stage back to the OS: a lower peak)
    lv = levels(rec)
    arrival: np.ndarray | None = None
    if lv is None:
        # ops issued in crossed order (1F1B stage pairs): levels by issue, not collective
        two_phase = overlap_levels(rec)
        if two_phase is None:
            return _empty("the collectives' order is inconsistent across ranks (a cycle)", steps)
        lv, arrival = two_phase[:2], two_phase[2]
    rank = table.rank[ch.row]
    pr = peer_references(rec, ch, sig, len(steps))
    ex, tex = rec.gap - pr.ref, rec.tail - pr.tref
    sys_ex, sys_tex, measured = systematic(ex, tex, rec, ch, sig)
    # a scenario takes the rank's systematic excess off its gaps (its step-to-step noise,
    # which no fix removes, stays)
    # (a negative gap, a completion the recorder saw after the next issue, is kept as it is)
    gmed = np.where(rec.gap > 0, np.maximum(rec.gap - sys_ex, 0), rec.gap)
    # the compute after the step's last collective delays the rank's next step: in a rank's
    # scenario its step starts that much earlier (so that it saves what it would in the next
    # step: nothing where the rank then waits anyway), rather than ending earlier
    has = rec.c_len > 0
    lead = np.where(has, sys_tex, 0)
    tmed = np.where(has, rec.tail, np.maximum(rec.tail - sys_tex, 0))

    # candidates: the largest systematic excess
    c_ex = tex + np.bincount(ch.chain, weights=ex, minlength=len(ch.c_rank))
    c_sys = sys_tex + np.bincount(ch.chain, weights=sys_ex, minlength=len(ch.c_rank))
    rank_ids = np.unique(ch.c_rank)
    by_chain_rank = RowsByKey(ch.c_rank)
    rank_ex = {r: float(np.median(c_ex[by_chain_rank.rows(r)])) for r in rank_ids.tolist()}
    rank_sys = {r: float(np.median(c_sys[by_chain_rank.rows(r)])) for r in rank_ids.tolist()}
    rank_peers = {r: int(pr.peers[by_chain_rank.rows(r)].max()) for r in rank_ids.tolist()}
    del pr, c_sys
    rank_c = sorted(rank_ex, key=lambda r: (-rank_sys[r], -rank_ex[r], r))[: max(max_ranks, 0)]
    g_ex = np.bincount(gid, weights=sys_ex, minlength=len(table.groups)) / len(steps)
    multi = [x for x in np.unique(gid).tolist() if len(table.groups[x].ranks) >= 2]
    group_c = sorted(multi, key=lambda x: (-g_ex[x], x))[: max(max_groups, 0)]
    d_ex = np.bincount(dimc, weights=sys_ex, minlength=len(dims)) / len(steps)
    del sys_ex
    dim_c = sorted(np.unique(dimc).tolist())

    # scenario rows: 0 recorded, then the ranks, the groups, the dimensions
    nr, ng = len(rank_c), len(group_c)
    k = 1 + nr + ng + len(dim_c)
    rows = [
        _lookup(rank, rank_c, 1),
        _lookup(gid, group_c, 1 + nr),
        _lookup(dimc, dim_c, 1 + nr + ng),
    ]
    # every member array in replay order, each original let go as its copy is made (the
    # aggregates above do not depend on the members' order; _phase's sums are of integers)
    order, bounds = lv
    del lv, gid, dimc
    join_kind, j_pos, j_slot = join_plan(rec.join, order)
    members: dict[str, np.ndarray] = {
        "a0": rec.a0,
        "gap": rec.gap,
        "coll": rec.coll,
        "waits": rec.waits,
        "after_ns": rec.after_ns,
        "chain": ch.chain,
        "rank": rank,
        "ex": ex,
        "new_gap": gmed,
        **{f"row{i}": r for i, r in enumerate(rows)},
    }
    if arrival is not None:
        members["orig"] = np.arange(len(rec.coll), dtype=np.int64)
    tail, const, after_all = rec.tail, rec.const, rec.after_all
    c_rank, c_step, c_start, c_end = ch.c_rank, ch.c_step, ch.c_start, ch.c_end
    del rec, ch, rank, ex, gmed, rows
    m = in_order(members, order)
    m["join"] = join_kind
    del order, join_kind
    release_free_memory()
    ends = replay(
        m,
        bounds,
        k,
        [m.pop(f"row{i}") for i in range(3)],
        _starts(c_start, c_rank, rank_c, lead),
        const,
        tail,
        after_all,
        _lookup(c_rank, rank_c, 1),
        tmed,
        (j_pos, j_slot),
        arrival=arrival,
    )
    job = np.full((len(steps), k), I64_MIN, dtype=np.int64)
    np.maximum.at(job, c_step, ends.T)
    by_step = (job[:, :1] - job).astype(np.float64)
    # a rank's saving over the steps where its chain was measured (its signature repeated:
    # a first step unlike the others is not one of them), when there are any
    use = np.ones((len(steps), k), dtype=bool)
    for i, r in enumerate(rank_c):
        mine = by_chain_rank.rows(r)
        got = np.zeros(len(steps), dtype=bool)
        got[c_step[mine[measured[mine]]]] = True
        if got.any():
            use[:, 1 + i] = got
    saving = [float(np.median(by_step[use[:, j], j])) for j in range(k)]
    lo_hi = [median_interval(by_step[use[:, j], j]) for j in range(k)]

    def share(v: float) -> float:
        return v / step_ns if step_ns > 0 else float("nan")

    ranks_out = [
        RankCost(
            r,
            saving[1 + i],
            share(saving[1 + i]),
            _phase(run, r, m, c_rank, c_end, tail, tex, off),
            rank_ex[r],
            *lo_hi[1 + i],
            rank_peers[r],
        )
        for i, r in enumerate(rank_c)
    ]
    groups_out = []
    for i, x in enumerate(group_c):
        gr, j = table.groups[x], 1 + nr + i
        groups_out.append(
            GroupCost(gr.name, gr.desc, gr.dimension, saving[j], share(saving[j]),
                      float(g_ex[x]), *lo_hi[j])
        )  # fmt: skip
    dims_out = []
    for i, x in enumerate(dim_c):
        j = 1 + nr + ng + i
        dims_out.append(DimCost(dims[x], saving[j], share(saving[j]), float(d_ex[x]), *lo_hi[j]))
    unmeasured = tuple(sorted(r for r in rank_c if not rank_peers[r]))
    return WhatIf(
        ranks=tuple(sorted(ranks_out, key=lambda c: (-c.step_saving_ns, c.rank))),
        groups=tuple(sorted(groups_out, key=lambda c: (-c.step_saving_ns, c.group))),
        dims=tuple(sorted(dims_out, key=lambda c: (-c.step_saving_ns, c.dim))),
        steps=steps,
        step_ns=step_ns,
        ranks_total=len(rank_ids),
        levels=len(bounds) - 1,
        replay_error_ns=int(np.abs(ends[0] - c_end).max()),
        unmeasured=unmeasured,
        note=NO_PEERS if len(unmeasured) == len(rank_ids) else "",
        record=check,
        doubt=doubt,
        contradicted_ns=contradicted,
    )


NO_PEERS = (
    "no rank has a peer (another rank of its pipeline stage that issued the same collectives): "
    "compute is compared between peers, so no rank's cost can be measured"
)


def _starts(
    c_start: np.ndarray, c_rank: np.ndarray, rank_c: list[int], lead: np.ndarray
) -> np.ndarray:
    """The chains' starts per scenario (int64 [scenario, chain]): recorded, but ``lead``
    earlier for the chains of the rank of a rank scenario (scenario 1 + i: ``rank_c[i]``)."""
    out = np.repeat(c_start[None, :], 1 + len(rank_c), axis=0)
    for i, r in enumerate(rank_c):
        mine = c_rank == r
        out[1 + i, mine] -= lead[mine]
    return out


def _lookup(values: np.ndarray, chosen: list[int], first: int) -> np.ndarray:
    """Per value: ``first + i`` when it is ``chosen[i]``, else 0 (values are ≥ 0)."""
    last = first + len(chosen)
    lut = np.zeros(
        max(int(values.max(initial=0)), max(chosen, default=0)) + 1,
        dtype=np.int16 if last < 1 << 15 else np.int64,
    )
    lut[np.asarray(chosen, dtype=np.int64)] = first + np.arange(len(chosen))
    return lut[values]


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
    m: dict[str, np.ndarray],
    c_rank: np.ndarray,
    c_end: np.ndarray,
    tail: np.ndarray,
    tex: np.ndarray,
    off: np.ndarray,
) -> str | None:
    """The phase holding most of rank r's excess (gaps and tails), on its own clock (``m``:
    the members' ``rank``, ``a0``, ``gap`` and ``ex``, in any order)."""
    rd = run.ranks[r]
    sp = rd.spans
    ph = sp[sp["kind"] == 1]
    if not len(ph):
        return None
    names = rd.span_names
    mine = np.flatnonzero(m["rank"] == r)
    cm_ = np.flatnonzero(c_rank == r)
    a0, g = m["a0"][mine], m["gap"][mine]
    lo = np.r_[a0 - g, c_end[cm_] - tail[cm_]] - off[r]
    hi = np.r_[a0, c_end[cm_]] - off[r]
    weight = np.r_[m["ex"][mine], tex[cm_]].astype(np.float64)
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

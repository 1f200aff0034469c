"""Completions the record contradicts, found and repaired before the what-if replays them
(:mod:`meshprof.analyze.run.replay.replay_record`).

A recorder notices a completion when something looks: the caller's wait (exact), a poller (late
by its period, and by milliseconds on a loaded machine), or the rank's next call (a completion
seen only when the rank's next blocking op, or its next pipeline exchange, ends). The job's
timing is the same; the record is not, and the replay takes a recorded completion as the time
the op's members could go on: a late one pins every later event of the rank — and of every rank
that waits for it — to the recorded time, and hides the compute of whoever the op waited for.
What the record itself says against such a completion (aligned clock, ns):

- **seen after the next issue** — a collective issued blocking (its flags say so: not
  ``async_op``, not timed on the device) was waited for before its caller's next call, so it
  completed no later than the rank's next issue (the step's end after its last): a completion
  recorded later is *capped* there;
- **transfer far above its group's usual one** — a collective's *transfer* is its members'
  earliest completion (after the caps) minus its release (its last arrival, see
  :mod:`.replay`); its group's *usual* transfer is the median over the replayed collectives of
  the same group, op and size, and a transfer more than :data:`FAR_SPREADS` robust standard
  deviations of them and :data:`FAR_MIN_NS` above it is *far* above. A member completing
  after its collective's transfer by more than :data:`FAR_SPREADS` times its group's usual such
  lag (the first quartile over its members, the earliest left out) and :data:`FAR_MIN_NS`, and
  after its rank's next issue (or capped), was seen late: it is
  *retimed* to the release + the collective's transfer (its usual one when that too is far
  above), and no later than its next issue where it was waited for there — a blocking op; with
  no flags, an op whose next issue came after the release + the fastest usual transfer (the
  5th percentile), so that it could have completed by then;
- **a join the op's own flags deny** — a blocking collective is joined (waited for) at its
  chain's next event, whatever its completion says (see ``replay_record._joins``);
- **waited for, seen late** — where an issue follows an op's expected completion (release +
  usual transfer) far more closely than the issue before it, the rank waited for the op there,
  whatever the recorded completion says (:func:`waited_seen_late`, for the program positions
  of ``replay_record._harmonized``);
- **without flags** — a completion that tracks the next op's release (:func:`tied_to_next`) is
  a blocking op's seen late; one often after the next issue (:func:`often_after_next`) is
  undecided: read both ways by :mod:`.what_if_checks`.

Members of matched collectives only (a send/recv pair counts as a collective of two); an
unmatched op keeps its record. What was repaired is counted in :class:`RecordCheck`; the
members of a collective whose transfer is far above its usual one and whose group has fewer
than :data:`MIN_USUAL` usual transfers cannot be repaired (``unrepaired``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshprof.analyze.compute.grouped import group_spread, grouped_median, robust_group_spread
from meshprof.analyze.compute.sorting import unique_inverse

FAR_SPREADS = 8.0
"""A collective's transfer is far above its group's usual one when it exceeds it by this many
robust standard deviations of the group's transfers (and by :data:`FAR_MIN_NS`); a member is
seen late when it completed after its collective's transfer by this many times its group's
usual such lag (and by :data:`FAR_MIN_NS`)."""
FAR_MIN_NS = 50_000
"""... and by at least this much (ns): a few tens of µs is the noise of a transfer."""
SEEN_LATE_NS = 50_000
"""An issue within this of an op's expected completion (median over the chains) came right
after the rank waited for it (the recorder's lag aside)."""
OFTEN_AFTER = 0.25
"""Without flags, a collective's program position is undecided when its completion was recorded
after the rank's next issue on this share of its chains or more (:func:`often_after_next`)."""
MIN_USUAL = 3
"""Collectives of a (group, op, size) needed to say what its usual transfer is."""
_I64_MAX = int(np.iinfo(np.int64).max)


@dataclass(frozen=True, slots=True)
class RecordCheck:
    """What the what-if found wrong in the record and what it did (counts of replayed
    members: one rank's event in a replayed step)."""

    members: int = 0
    """Members replayed."""
    capped: int = 0
    """Blocking collectives seen to complete after the rank's next issue: capped there."""
    retimed: int = 0
    """Members seen to complete far after their collective's transfer (or capped), set to its
    release + that transfer (its group's usual one when that too was far above)."""
    far_collectives: int = 0
    """Collectives whose transfer was far above their group's usual one."""
    unrepaired: int = 0
    """Members seen late that no usual transfer could repair (their group has too few
    collectives to say what is usual): kept as recorded."""
    undecided: int = 0
    """Without flags: collectives at program positions often seen to complete after their
    rank's next issue (:func:`often_after_next`): async ops in flight across it, or blocking
    ones the recorder saw late — the record cannot tell."""
    reading: str = "waited"
    """How the undecided ones were read: "waited" (as blocking ops seen late: waited for at
    the next issue, their completion capped there) or "recorded" (as in flight across it,
    their completion as recorded)."""

    @property
    def contradicted(self) -> int:
        """Members whose recorded completion the record contradicts."""
        return self.retimed + self.unrepaired

    def __add__(self, o: RecordCheck) -> RecordCheck:
        return RecordCheck(
            self.members + o.members,
            self.capped + o.capped,
            self.retimed + o.retimed,
            self.far_collectives + o.far_collectives,
            self.unrepaired + o.unrepaired,
            self.undecided + o.undecided,
            self.reading,
        )


def next_issue(a0: np.ndarray, chain: np.ndarray, c_end: np.ndarray) -> np.ndarray:
    """Per member (sorted by chain, then issue): its chain's next issue, or the chain's end for
    the last member (int64 ns)."""
    n = len(a0)
    out = c_end[chain].astype(np.int64)
    if n > 1:
        same = chain[1:] == chain[:-1]
        out[:-1] = np.where(same, a0[1:], out[:-1])
    return out


def cap_blocking(e0: np.ndarray, nxt: np.ndarray, blocking: np.ndarray | None) -> np.ndarray:
    """``e0`` capped in place at ``nxt`` where ``blocking`` (a collective its caller waited
    for); returns the capped members (bool)."""
    if blocking is None:
        return np.zeros(len(e0), dtype=bool)
    capped = blocking & (e0 > nxt)
    np.copyto(e0, nxt, where=capped)
    return capped


def blocking_members(
    is_async: np.ndarray | None, peer: np.ndarray, rows: np.ndarray
) -> np.ndarray | None:
    """bool [member]: a collective its caller waited for before its next call (flags known,
    neither async nor device-timed; not a send/recv: an ``isend``/``irecv`` is recorded
    without the async flag); None when the flags are unknown."""
    if is_async is None:
        return None
    return ~is_async[rows] & (peer[rows] < 0)


def retime(
    e0: np.ndarray,
    rel: np.ndarray,
    coll: np.ndarray,
    waiting: np.ndarray,
    key: np.ndarray,
    nxt: np.ndarray,
    capped: np.ndarray,
    blocking: np.ndarray | None,
    known: bool = True,
    undecided: int = 0,
    reading: str = "waited",
    expected: np.ndarray | None = None,
    lead_late: int = 0,
) -> RecordCheck:
    """Members seen late retimed in place (``e0``, see the module docstring). ``rel``: each
    member's collective's release; ``coll``: its collective's code (matched ones only, others
    -1); ``waiting``: it completes after the release (not an eager send, not alone); ``key``:
    its (group, op, size) code; ``nxt``: :func:`next_issue`; ``capped``: :func:`cap_blocking`'s
    result; ``blocking``: :func:`blocking_members` (``known``), or the ops found waited for
    without flags (:func:`tied_to_next`). ``expected`` (filled when given): each member's
    completion as the model expects it, its release + its group's usual transfer (its
    repaired completion where it has none): what a recorder's lag does not move."""
    n = len(e0)
    use = np.flatnonzero(waiting & (coll >= 0))
    if not len(use):
        if expected is not None:
            np.copyto(expected, e0)
        return RecordCheck(
            members=n, capped=int(capped.sum()), retimed=lead_late, undecided=undecided,
            reading=reading,
        )  # fmt: skip
    cu, c_of = unique_inverse(coll[use].astype(np.int64))
    nc = len(cu)
    t = e0[use] - rel[use]
    tc = np.full(nc, _I64_MAX, dtype=np.int64)
    np.minimum.at(tc, c_of, t)
    k_c = np.zeros(nc, dtype=np.int64)
    k_c[c_of] = key[use]
    ku, k_of = unique_inverse(k_c)
    usual, spread, fast, enough = _usual(tc, k_of, len(ku))
    margin = np.maximum(FAR_SPREADS * spread, FAR_MIN_NS)
    far_c = enough[k_of] & (tc > usual[k_of] + margin[k_of])
    ref = np.where(far_c, np.rint(usual[k_of]).astype(np.int64), tc)
    m_ref = ref[c_of]
    # a member's lag behind its collective's earliest member, against the usual such lag
    lag = (t - tc[c_of]).astype(np.float64)
    m_key = k_of[c_of]
    m_margin = np.maximum(FAR_SPREADS * _usual_lag(lag, m_key, len(ku)), FAR_MIN_NS)
    # (only where the record contradicts itself: a completion after the rank's next issue —
    # one before it is what it says, a member that really completed late, as gloo's do)
    late = capped[use] | ((t > m_ref + m_margin[m_key]) & (e0[use] > nxt[use]))
    fixable = late & (~far_c[c_of] | enough[k_of][c_of])
    unrepaired = int((late & ~fixable).sum())
    at = use[fixable]
    new = rel[at] + m_ref[fixable]
    nx = nxt[at]
    cap = np.zeros(len(at), dtype=bool) if blocking is None else blocking[at]
    if not known:  # no flags: waited for at the next issue if it could have completed by then
        cap |= nx >= rel[at] + np.rint(fast[k_of][c_of][fixable]).astype(np.int64)
    new = np.where(cap & (new > nx), nx, new)
    changed = new != e0[at]
    e0[at] = new
    if expected is not None:
        np.copyto(expected, e0)
        expected[use] = rel[use] + np.rint(usual[k_of][c_of]).astype(np.int64)
    return RecordCheck(
        members=n,
        capped=int(capped.sum()),
        retimed=int(changed.sum()) + lead_late,
        far_collectives=int(far_c.sum()),
        unrepaired=unrepaired,
        undecided=undecided,
        reading=reading,
    )


def retime_leads(
    e0: np.ndarray, a0: np.ndarray, lead: np.ndarray, key: np.ndarray, nxt: np.ndarray
) -> int:
    """The sends of eager directions (``lead``: they never wait, and their completion is when
    the receiver can have the data) seen to complete far after their usual duration (the
    median over their direction's sends, ``key``; far: :data:`FAR_SPREADS` robust standard
    deviations and :data:`FAR_MIN_NS`) and after their rank's next issue (``nxt``) retimed in
    place to their issue + that duration: a send seen late would hold its receive back in
    every scenario. Returns how many."""
    at = np.flatnonzero(lead)
    if not len(at):
        return 0
    k_u, k = unique_inverse(key[at].astype(np.int64))
    dur = (e0[at] - a0[at]).astype(np.float64)
    usual = np.nan_to_num(grouped_median(dur, k, len(k_u)))
    margin = np.maximum(FAR_SPREADS * robust_group_spread(dur, k, len(k_u)), FAR_MIN_NS)
    enough = np.bincount(k, minlength=len(k_u)) >= MIN_USUAL
    late = enough[k] & (dur > usual[k] + margin[k]) & (e0[at] > nxt[at])
    e0[at[late]] = a0[at[late]] + np.rint(usual[k[late]]).astype(np.int64)
    return int(late.sum())


@dataclass(frozen=True, slots=True)
class ChainMembers:
    """The members' columns that :func:`tied_to_next` and :func:`often_after_next` read, each
    [member] in chain order."""

    waiting: np.ndarray
    """bool: the member waits for its matched collective's release."""
    collective: np.ndarray
    """bool: a collective (not a point-to-point op)."""
    chain: np.ndarray
    """Its chain (a rank's step)."""
    pos: np.ndarray
    """Its position in its chain."""
    sig: np.ndarray
    """[chain]: each chain's signature
    (:func:`~meshprof.analyze.run.replay.replay_chains.chain_signatures`)."""

    def positions(self, m: np.ndarray) -> tuple[np.ndarray, int, np.ndarray]:
        """The members ``m`` grouped by program position (their chain's signature and their
        position in it): each one's group, the number of groups, and the members in each."""
        width = int(self.pos.max(initial=0)) + 1
        key = self.sig[self.chain[m]].astype(np.int64) * width + self.pos[m].astype(np.int64)
        _, g = unique_inverse(key)
        ng = int(g.max(initial=-1)) + 1
        return g, ng, np.bincount(g, minlength=ng)


def tied_to_next(e0: np.ndarray, rel: np.ndarray, at: ChainMembers) -> np.ndarray:
    """bool [member]: without flags, the collectives whose recorded completion follows the
    *next* op's release rather than their own: at their program position (the chains of one
    signature, :func:`~meshprof.analyze.run.replay.replay_chains.chain_signatures`), the completion
    came after the next member's release on 9 chains in 10 or more, and its time after that
    release varies (over the chains) less than half as much as its time after its own release,
    by the standard deviations and the robust spreads, and by more than 1 µs. A completion
    cannot be caused by a later issue: the recorder saw it when the rank's next op completed
    (a completion noticed at the rank's next call). Such an op is taken as waited for at its
    next issue (blocking), like one whose flags say so. ``rel``: each member's release."""
    n = len(e0)
    out = np.zeros(n, dtype=bool)
    if n < 2:
        return out
    chain, waiting = at.chain, at.waiting
    m = np.flatnonzero((chain[:-1] == chain[1:]) & waiting[:-1] & waiting[1:] & at.collective[:-1])
    if not len(m):
        return out
    g, ng, cnt = at.positions(m)
    own = (e0[m] - rel[m]).astype(np.float64)
    after_next = (e0[m] - rel[m + 1]).astype(np.float64)
    later = np.bincount(g, weights=(after_next > 0).astype(np.float64), minlength=ng)
    ok = (cnt >= 2) & (later >= 0.9 * cnt)
    ok &= 2 * group_spread(after_next, g, ng) + 1_000 < group_spread(own, g, ng)
    if ok.any():
        ok &= 2 * robust_group_spread(after_next, g, ng) + 1_000 < robust_group_spread(own, g, ng)
    out[m[ok[g]]] = True
    return out


def often_after_next(e0: np.ndarray, nxt: np.ndarray, at: ChainMembers) -> np.ndarray:
    """bool [member]: the collectives (waiting for their matched release) at program positions
    where the completion was recorded after the rank's next issue on :data:`OFTEN_AFTER` of the
    chains or more (``nxt``: :func:`next_issue`; the last member of a chain, whose next is the
    step's end, left out)."""
    n = len(e0)
    out = np.zeros(n, dtype=bool)
    m = np.flatnonzero(at.waiting & at.collective & np.r_[at.chain[:-1] == at.chain[1:], False])
    if not len(m):
        return out
    g, ng, cnt = at.positions(m)
    late = np.bincount(g, weights=(e0[m] > nxt[m]).astype(np.float64), minlength=ng)
    out[m[(late >= OFTEN_AFTER * cnt)[g]]] = True
    return out


def _usual(
    tc: np.ndarray, k_of: np.ndarray, nk: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per key: the median transfer of its collectives, their robust standard deviation
    (1.4826 × MAD), their 5th percentile (the fastest usual one), and whether it has
    :data:`MIN_USUAL` of them (one sort for every key)."""
    x = tc.astype(np.float64)
    usual = np.nan_to_num(grouped_median(x, k_of, nk))
    spread = robust_group_spread(x, k_of, nk)
    order = np.lexsort((x, k_of))
    cnt = np.bincount(k_of, minlength=nk)
    start = np.cumsum(cnt) - cnt
    fast = np.zeros(nk)
    has = cnt > 0
    fast[has] = x[order][start[has] + (cnt[has] - 1) // 20]
    return usual, spread, fast, cnt >= MIN_USUAL


def _usual_lag(lag: np.ndarray, key: np.ndarray, nk: int) -> np.ndarray:
    """Per key: the first quartile of its members' lags behind their collective's earliest
    member, that member left out (its lag is 0 by definition): how far apart the members of a
    collective complete when none was seen late — a quartile, so that a recorder seeing half
    the chains late leaves it alone."""
    keep = lag > 0
    v, k = lag[keep], key[keep]
    out = np.zeros(nk)
    if not len(v):
        return out
    order = np.lexsort((v, k))
    cnt = np.bincount(k, minlength=nk)
    start = np.cumsum(cnt) - cnt
    has = cnt > 0
    out[has] = v[order][start[has] + (cnt[has] - 1) // 4]
    return out


def transfer_key(table_gid: np.ndarray, op: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Per member: a code equal for members of the same (group, op, size) (``op``: any code
    that tells the ops apart that should not share a usual transfer)."""
    gid = table_gid.astype(np.int64)
    o = op.astype(np.int64)
    s = size.astype(np.int64)
    # (the three combined by splitmix-style mixing: collisions merge keys, never split them)
    h = gid * np.int64(0x9E3779B1) + o
    h = h * np.int64(0x85EBCA77) + s
    _, inv = unique_inverse(h)
    return inv


def waited_seen_late(
    open_: np.ndarray,
    key: np.ndarray,
    ng: int,
    size: np.ndarray,
    idx: np.ndarray,
    end: np.ndarray,
    a0: np.ndarray,
    e0: np.ndarray,
    o: int,
    strict: bool = False,
) -> np.ndarray:
    """bool [position group]: of the ``open_`` positions, those whose op the rank waited for
    at the issue ``o`` members later though its completion was recorded after that issue (on
    every chain, or some): measured from the op's completion (``e0``: as the model expects it,
    its release + its group's usual transfer, where known), the time to that issue varies
    (over the chains) less than half as much as measured from the issue before it, by the
    standard deviations, by more than 100 ns, and no more by the robust spreads (or the issue
    came within :data:`SEEN_LATE_NS` of it on most chains, long after the one before; only
    that with ``strict``, for completions as recorded) — the op's completion,
    not the previous issue, sets that issue; the recorder saw it late (a receive or an async
    op polled a few µs after its wait returned; taken as in flight, its whole wait would count
    as the next compute)."""
    out = np.zeros(ng, dtype=bool)
    m = np.flatnonzero(open_[key] & (size[key] >= 2) & (idx + o < end))
    if not len(m):
        return out
    g = key[m]
    at = m + o
    with_it = (a0[at] - e0[m]).astype(np.float64)
    without = (a0[at] - a0[at - 1]).astype(np.float64)
    w_sp, wo_sp = group_spread(with_it, g, ng), group_spread(without, g, ng)
    cand = 2 * w_sp + 100 < wo_sp
    if cand.any():
        # and no wider by the robust spreads (a few long waits are not the rule), unless the
        # issue came right at the expected completion (within the recorder's lag, 50 µs) on
        # most chains, long after the issue before it: a rank that waited, then issued
        t = cand[g]
        w_rs = robust_group_spread(with_it[t], g[t], ng)
        wo_rs = robust_group_spread(without[t], g[t], ng)
        w_med = np.abs(np.nan_to_num(grouped_median(with_it[t], g[t], ng)))
        wo_med = np.nan_to_num(grouped_median(without[t], g[t], ng))
        close = (w_med <= SEEN_LATE_NS) & (wo_med > 4 * SEEN_LATE_NS)
        cand &= close if strict else (2 * w_rs + 100 < wo_rs) | close
    seen = np.unique(g)
    out[seen] = cand[seen]
    return out

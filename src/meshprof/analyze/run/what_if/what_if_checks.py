"""The what-if's self-checks (:mod:`meshprof.analyze.run.what_if.what_if`): figures computed from the
record that the replay did not take as given, so that they can fail.

- **Readings** of a record without async flags: a collective never seen to complete before its
  rank's next issue (:attr:`~meshprof.analyze.run.replay.replay_repair.RecordCheck.undecided`) is an
  async op in flight across that issue, or a blocking one whose completion the recorder saw
  late; the record cannot tell. The replay takes the second (``replay_record.record``'s
  ``reading="waited"``: such an op's next issue came after it could complete), this check the
  first as well; when some rank's systematic excess compute (what every scenario takes off)
  differs between them by :data:`DOUBT_SHARE` of the step or more, the savings depend on what
  the record cannot say, and the what-if says so (:attr:`~.what_if.WhatIf.doubt`) instead of a
  number.
- **Contradicted waits**: an event's compute gap is its issue minus what the model says it
  waited for; a negative gap is an issue recorded before a completion the model says it
  waited for (a completion the recorder saw late, by that much). Their sum per chain (median
  over chains, ns per step) is :attr:`~.what_if.WhatIf.contradicted_ns`: 0 on a record the
  model fits; the figures are uncertain by about that much.
"""

from __future__ import annotations

import numpy as np

from meshprof.analyze.compute.sorting import RowsByKey
from meshprof.analyze.run.events.match import CollectiveMatch
from meshprof.analyze.run.events.table import EventTable
from meshprof.analyze.run.replay.replay_chains import Chains
from meshprof.analyze.run.replay.replay_record import Recorded, record
from meshprof.analyze.run.what_if.what_if_peers import peer_references, systematic

DOUBT_SHARE = 0.01
"""A rank's systematic excess differing by this share of the step between the readings of a
record without flags makes every saving "not measured"."""


def rank_systematic(rec: Recorded, ch: Chains, sig: np.ndarray, n_steps: int) -> np.ndarray:
    """Per rank of ``ch`` (``np.unique(ch.c_rank)`` order): its systematic excess compute per
    step (gaps and tail; median over its chains, ns)."""
    pr = peer_references(rec, ch, sig, n_steps)
    sys_ex, sys_tex, _ = systematic(rec.gap - pr.ref, rec.tail - pr.tref, rec, ch, sig)
    c_sys = sys_tex + np.bincount(ch.chain, weights=sys_ex, minlength=len(ch.c_rank))
    by = RowsByKey(ch.c_rank)
    return np.asarray([float(np.median(c_sys[by.rows(r)])) for r in np.unique(ch.c_rank)])


def reading_doubt(
    table: EventTable,
    match: CollectiveMatch,
    off: np.ndarray,
    ch: Chains,
    sig: np.ndarray,
    rec: Recorded,
    n_steps: int,
    step_ns: float,
) -> str:
    """Why no saving can be measured (see the module docstring), or ""."""
    undecided = rec.check.undecided
    if not undecided or not step_ns > 0:
        return ""
    other = record(table, match, off, ch, sig, reading="recorded")
    a = rank_systematic(rec, ch, sig, n_steps)
    b = rank_systematic(other, ch, sig, n_steps)
    del other
    diff = np.abs(a - b)
    if not len(diff) or diff.max() < DOUBT_SHARE * step_ns:
        return ""
    ranks = np.unique(ch.c_rank)
    i = int(diff.argmax())
    return (
        f"not measured: {undecided} collectives were often seen to complete after their "
        "rank's next issue and the record has no async flags, so whether the ranks waited for "
        f"them cannot be told (read as in flight, rank {int(ranks[i])}'s excess compute is "
        f"{b[i] / 1e6:.3g} ms a step instead of {a[i] / 1e6:.3g} ms)"
    )


def contradicted_ns(rec: Recorded, ch: Chains) -> float:
    """The median over chains of the negative compute gaps summed (ns per step, ≥ 0)."""
    if not len(rec.gap):
        return 0.0
    neg = np.minimum(rec.gap, 0).astype(np.float64)
    per_chain = -np.bincount(ch.chain, weights=neg, minlength=len(ch.c_rank))
    has = rec.c_len > 0
    return float(np.median(per_chain[has])) if has.any() else 0.0

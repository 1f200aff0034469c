"""Hang and desync diagnosis from the ranks' dumps (loaded by :mod:`meshprof.rundir.hang_dumps`).

``diagnose_hang(dir)`` lines the collectives of every rank up by (group, seq) and returns what
went wrong as findings:

* ``missing``: ranks that never entered collective seq k of group g while others are waiting in it,
  and where those ranks are (file:line);
* ``op_mismatch`` / ``dtype_mismatch`` / ``size_mismatch``: the ranks called different things at
  the same (group, seq);
* ``order``: the ranks called the same collectives in a different order;
* ``stuck``: every member entered the collective, with matching arguments, and it did not finish;
* ``no_dump``: ranks that left no dump (dead, exited, or stuck without Python running).

Findings are ordered by causality (:func:`~meshprof.analyze.hang.causality.order_by_cause`): a rank that another finding's
collective is waiting for but that is itself waiting in a collective explains nothing; the ranks at
fault outside any collective (or that called something else, or have no dump) do. The root cause
comes first (:attr:`HangDiagnosis.root_cause`), and every finding it explains is marked
``consequence_of`` the finding it follows from.

Pure over the loaded states: returns frozen dataclasses; :mod:`meshprof.render.hang` turns them
into words.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import replace
from typing import Any

from meshprof.analyze.hang.causality import order_by_cause
from meshprof.analyze.hang.stacks import cluster_stacks
from meshprof.analyze.hang.types import HangDiagnosis, HangFinding, RootCause, fmt_ranks, where_of
from meshprof.errors import MeshprofError
from meshprof.records.finding import FindingKind
from meshprof.records.members import named_world
from meshprof.rundir.hang_dumps import Collective, RankState, load_dumps

# Ops whose per-rank input size must agree across the group (others may differ legitimately).
_SAME_INPUT = frozenset(
    {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "gather"}
)


def _mismatch(
    group: str, seq: int, by_rank: dict[int, Collective], states: dict[int, RankState]
) -> HangFinding | None:
    """Compare what each rank issued at (group, seq); the minority is named at fault."""
    for kind, key in (
        ("op_mismatch", lambda c: c.op),
        ("dtype_mismatch", lambda c: c.dtype),
        ("size_mismatch", lambda c: c.out_bytes if c.op == "scatter" else c.in_bytes),
    ):
        if kind == "size_mismatch" and not all(
            c.op in _SAME_INPUT or c.op == "scatter" for c in by_rank.values()
        ):
            continue
        if kind == "dtype_mismatch" and any(
            not c.dtype or c.dtype in ("none", "object") for c in by_rank.values()
        ):
            continue
        values: dict[Any, list[int]] = defaultdict(list)
        for r, c in sorted(by_rank.items()):
            values[key(c)].append(r)
        if len(values) < 2:
            continue
        majority = max(values.values(), key=lambda rs: (len(rs), -rs[0]))
        odd = sorted(r for rs in values.values() if rs is not majority for r in rs)
        what = {
            "op_mismatch": "called different collectives",
            "dtype_mismatch": "passed different dtypes",
            "size_mismatch": "passed different sizes",
        }[kind]
        parts = "; ".join(
            f"{fmt_ranks(rs)}: {by_rank[rs[0]].signature()}" for rs in values.values()
        )
        locs = "; ".join(
            f"rank {r} {where_of(states.get(r))}" for r in odd if states.get(r) and states[r].where
        )
        msg = f"ranks {what} at collective seq {seq} of group {group}: {parts}."
        if locs:
            msg += f" {locs}."
        return HangFinding(
            kind=FindingKind(kind),
            group=group,
            seq=seq,
            ranks=tuple(odd),
            title=msg,
            values=tuple((r, c.signature()) for r, c in sorted(by_rank.items())),
        )
    return None


def _order_finding(
    group: str, seq: int, states: dict[int, RankState], members: list[int]
) -> HangFinding | None:
    """Different order: each rank's ops from ``seq`` on are the same multiset in another order."""
    seqs: dict[int, list[str]] = {}
    for r in members:
        st = states.get(r)
        if st is None:
            continue
        seqs[r] = [
            c.op
            for c in sorted(st.collectives, key=lambda c: c.seq)
            if c.group == group and c.peer < 0 and c.seq >= seq
        ]
    if len(seqs) < 2:
        return None
    n = min(len(v) for v in seqs.values())
    if n < 2:
        return None
    windows = {r: v[:n] for r, v in seqs.items()}
    ref = next(iter(windows.values()))
    if all(sorted(w) == sorted(ref) for w in windows.values()) and any(
        w != ref for w in windows.values()
    ):
        parts = "; ".join(f"rank {r}: {' → '.join(w)}" for r, w in windows.items())
        return HangFinding(
            kind=FindingKind.ORDER,
            group=group,
            seq=seq,
            ranks=tuple(windows),
            title=f"ranks called the collectives of group {group} in a different order from seq {seq} on: {parts}.",
            values=tuple((r, " → ".join(w)) for r, w in windows.items()),
        )
    return None


def diagnose_hang(directory: str | os.PathLike[str]) -> HangDiagnosis:
    """Read the dumps in ``directory`` and say what went wrong (see the module docstring)."""
    d, states, problems = load_dumps(directory)
    if not states and problems:
        more = f"; and {len(problems) - 1} more" if len(problems) > 1 else ""
        raise MeshprofError(f"{d}: no usable hang dump ({problems[0]}{more})")
    if not states:
        raise MeshprofError(f"{d}: no hang dumps (rank*.json or fr_rank*.json) found")
    return diagnose_states(states, str(d), tuple(problems))


def _waiting_in(
    c: Collective,
    inside: list[int],
    kind: FindingKind,
    ranks: list[int],
    title: str,
    values: tuple[tuple[int, str], ...] = (),
) -> HangFinding:
    """A finding about the collective ``c`` that the ranks ``inside`` wait in."""
    return HangFinding(
        kind=kind,
        group=c.group,
        seq=c.seq,
        ranks=tuple(ranks),
        title=title,
        values=values,
        op=c.op,
        waiting=tuple(inside),
    )


def diagnose_states(
    states: dict[int, RankState], directory: str = "", problems: tuple[str, ...] = ()
) -> HangDiagnosis:
    """:func:`diagnose_hang` over per-rank states already loaded (or built): rank -> state."""
    world = max((s.world_size for s in states.values()), default=0)
    groups: dict[str, tuple[int, ...]] = {}
    for st in states.values():
        for g, ranks in st.groups.items():
            if ranks and len(ranks) > len(groups.get(g, ())):
                groups[g] = ranks
    world = max(world, max(states) + 1, *(max(r) + 1 for r in groups.values() if r))
    findings: list[HangFinding] = []
    seen: set[tuple[str, int]] = set()
    # 1. every collective someone is waiting in, oldest first
    waiting = sorted(
        ((c, st.rank) for st in states.values() for c in st.inflight if c.peer < 0),
        key=lambda x: (x[0].group, x[0].seq),
    )
    for c, _ in waiting:
        key = (c.group, c.seq)
        if key in seen:
            continue
        seen.add(key)
        members = list(groups.get(c.group) or named_world(world))
        entered = {
            r: x
            for r in members
            if r in states
            for x in states[r].collectives
            if x.group == c.group and x.seq == c.seq and x.peer < 0
        }
        inside = sorted(r for r, x in entered.items() if x.state == "inflight")
        no_dump = [r for r in members if r not in states]
        absent = [
            r
            for r in members
            if r in states and r not in entered and states[r].last_seq(c.group) < c.seq
        ]
        mm = _mismatch(c.group, c.seq, entered, states) if len(entered) > 1 else None
        order = (
            _order_finding(c.group, c.seq, states, members)
            if mm is not None and mm.kind == "op_mismatch"
            else None
        )
        if order is not None:
            findings.append(replace(order, op=c.op, waiting=tuple(inside)))
        elif mm is not None:
            findings.append(replace(mm, op=c.op, waiting=tuple(inside)))
        if absent:
            parts = "; ".join(
                f"rank {r} {where_of(states[r])} (its last collective in the group was seq {states[r].last_seq(c.group)})"
                for r in absent
            )
            findings.append(
                _waiting_in(
                    c,
                    inside,
                    FindingKind.MISSING,
                    absent,
                    f"{fmt_ranks(absent)} never entered {c.op} seq {c.seq} of group {c.group}, "
                    f"which {fmt_ranks(inside)} {'is' if len(inside) == 1 else 'are'} waiting in: {parts}.",
                    values=tuple((r, str(states[r].location or "")) for r in absent),
                )
            )
        if no_dump:
            findings.append(
                _waiting_in(
                    c,
                    inside,
                    FindingKind.NO_DUMP,
                    no_dump,
                    f"{fmt_ranks(no_dump)} of group {c.group} left no dump while {fmt_ranks(inside)} "
                    f"waited in {c.op} seq {c.seq}: dead, exited, or stuck outside Python.",
                )
            )
        if not absent and not no_dump and mm is None and order is None:
            age = max((x.age_ns for x in entered.values() if x.state == "inflight"), default=0)
            findings.append(
                _waiting_in(
                    c,
                    inside,
                    FindingKind.STUCK,
                    inside,
                    f"all members of group {c.group} entered {c.signature()} seq {c.seq} with matching "
                    f"arguments and it has not finished after {age / 1e9:.1f} s "
                    f"(a slow or dead link, or a peer stuck inside the backend).",
                )
            )
    # 2. mismatches among completed collectives (a desync that has not hung yet)
    by_key: dict[tuple[str, int], dict[int, Collective]] = defaultdict(dict)
    for st in states.values():
        for c in st.collectives:
            if c.peer < 0:
                by_key[(c.group, c.seq)][st.rank] = c
    for (g, seq), by_rank in sorted(by_key.items()):
        if (g, seq) in seen or len(by_rank) < 2:
            continue
        mm = _mismatch(g, seq, by_rank, states)
        if mm is not None:
            seen.add((g, seq))
            order = (
                _order_finding(g, seq, states, list(groups.get(g) or named_world(world)))
                if mm.kind == "op_mismatch"
                else None
            )
            ops = sorted({x.op for x in by_rank.values()})
            findings.append(replace(order or mm, op=" / ".join(ops)))
            break  # later seqs of a desynced group only repeat it
    ordered, root = order_by_cause(findings, states)
    stacks = cluster_stacks(
        {r: st.where for r, st in states.items()},
        [r for r in named_world(world) if r not in states],
    )
    return HangDiagnosis(
        directory,
        tuple(states[r] for r in sorted(states)),
        ordered,
        world,
        tuple(problems),
        root,
        stacks,
    )


__all__ = [
    "HangDiagnosis",
    "HangFinding",
    "RootCause",
    "diagnose_hang",
    "diagnose_states",
    "order_by_cause",
]

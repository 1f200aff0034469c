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

Pure over the loaded states: returns frozen dataclasses; :mod:`meshprof.render.hang` turns them
into words.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from meshprof.errors import MeshprofError
from meshprof.rundir.hang_dumps import Collective, RankState, load_dumps

# Ops whose per-rank input size must agree across the group (others may differ legitimately).
_SAME_INPUT = frozenset(
    {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "gather"}
)


@dataclass(frozen=True, slots=True)
class HangFinding:
    """One thing that went wrong (a hang or desync; not the run report's ``Finding``)."""

    kind: str
    """"missing", "op_mismatch", "dtype_mismatch", "size_mismatch", "order", "stuck", "no_dump"."""
    group: str
    """Process group name ("" when not about one group)."""
    seq: int
    """Sequence number in the group (-1 when not about one collective)."""
    ranks: tuple[int, ...]
    """The ranks at fault (missing ranks, the minority of a mismatch, ranks without a dump)."""
    message: str
    """The finding in plain words."""
    values: tuple[tuple[int, str], ...] = ()
    """(rank, what that rank did) for the ranks compared."""


@dataclass(frozen=True, slots=True)
class HangDiagnosis:
    """Everything :func:`diagnose_hang` found."""

    directory: str
    """The folder the dumps were read from."""
    ranks: tuple[RankState, ...]
    """One state per rank that left a dump, by rank (meshprof dumps win over Flight Recorder)."""
    findings: tuple[HangFinding, ...]
    """What went wrong, most important first."""
    world_size: int
    """World size (from the dumps; 0 when unknown)."""
    problems: tuple[str, ...] = ()
    """Files that could not be read, and why."""

    @property
    def ok(self) -> bool:
        return not self.findings

    def to_dict(self) -> dict[str, Any]:
        return {
            "directory": self.directory,
            "world_size": self.world_size,
            "findings": [
                {
                    "kind": f.kind,
                    "group": f.group,
                    "seq": f.seq,
                    "ranks": list(f.ranks),
                    "message": f.message,
                    "values": [[r, v] for r, v in f.values],
                }
                for f in self.findings
            ],
            "ranks": [
                {
                    "rank": s.rank,
                    "source": s.source,
                    "reason": s.reason,
                    "location": str(s.location) if s.location else None,
                    "inflight": [c.describe() for c in s.inflight],
                    "last": [c.describe() for c in s.collectives[-5:]],
                }
                for s in self.ranks
            ],
            "problems": list(self.problems),
        }


def _where(st: RankState | None) -> str:
    if st is None:
        return "left no dump"
    loc = st.location
    return f"is at {loc}" if loc is not None else "has no stack in its dump"


def _fmt_ranks(ranks: list[int] | tuple[int, ...]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


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
            f"{_fmt_ranks(rs)}: {by_rank[rs[0]].signature()}" for rs in values.values()
        )
        locs = "; ".join(
            f"rank {r} {_where(states.get(r))}" for r in odd if states.get(r) and states[r].where
        )
        msg = f"ranks {what} at collective seq {seq} of group {group}: {parts}."
        if locs:
            msg += f" {locs}."
        return HangFinding(
            kind,
            group,
            seq,
            tuple(odd),
            msg,
            tuple((r, c.signature()) for r, c in sorted(by_rank.items())),
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
            "order",
            group,
            seq,
            tuple(windows),
            f"ranks called the collectives of group {group} in a different order from seq {seq} on: {parts}.",
            tuple((r, " → ".join(w)) for r, w in windows.items()),
        )
    return None


def diagnose_hang(directory: str | os.PathLike[str]) -> HangDiagnosis:
    """Read the dumps in ``directory`` and say what went wrong (see the module docstring)."""
    d, states, problems = load_dumps(directory)
    if not states:
        raise MeshprofError(f"{d}: no hang dumps (rank*.json or fr_rank*.json) found")
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
        members = list(groups.get(c.group) or range(world))
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
            findings.append(order)
        elif mm is not None:
            findings.append(mm)
        if absent:
            parts = "; ".join(
                f"rank {r} {_where(states[r])} (its last collective in the group was seq {states[r].last_seq(c.group)})"
                for r in absent
            )
            findings.append(
                HangFinding(
                    "missing",
                    c.group,
                    c.seq,
                    tuple(absent),
                    f"{_fmt_ranks(absent)} never entered {c.op} seq {c.seq} of group {c.group}, "
                    f"which {_fmt_ranks(inside)} {'is' if len(inside) == 1 else 'are'} waiting in: {parts}.",
                    tuple((r, str(states[r].location or "")) for r in absent),
                )
            )
        if no_dump:
            findings.append(
                HangFinding(
                    "no_dump",
                    c.group,
                    c.seq,
                    tuple(no_dump),
                    f"{_fmt_ranks(no_dump)} of group {c.group} left no dump while {_fmt_ranks(inside)} "
                    f"waited in {c.op} seq {c.seq}: dead, exited, or stuck outside Python.",
                )
            )
        if not absent and not no_dump and mm is None and order is None:
            age = max((x.age_ns for x in entered.values() if x.state == "inflight"), default=0)
            findings.append(
                HangFinding(
                    "stuck",
                    c.group,
                    c.seq,
                    tuple(inside),
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
                _order_finding(g, seq, states, list(groups.get(g) or range(world)))
                if mm.kind == "op_mismatch"
                else None
            )
            findings.append(order or mm)
            break  # later seqs of a desynced group only repeat it
    order_rank = {
        "missing": 0,
        "order": 1,
        "op_mismatch": 1,
        "dtype_mismatch": 1,
        "size_mismatch": 1,
        "stuck": 2,
        "no_dump": 3,
    }
    findings.sort(key=lambda f: order_rank.get(f.kind, 9))
    return HangDiagnosis(
        str(d), tuple(states[r] for r in sorted(states)), tuple(findings), world, tuple(problems)
    )


__all__ = ["HangDiagnosis", "HangFinding", "diagnose_hang"]

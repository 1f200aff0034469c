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

Findings are ordered by causality (:func:`_order_by_cause`): a rank that another finding's
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
from dataclasses import dataclass, replace
from typing import Any

from meshprof.analyze.hang.stacks import StackClusters, cluster_stacks
from meshprof.errors import MeshprofError
from meshprof.records.finding import Finding, FindingKind, Severity
from meshprof.records.members import named_world
from meshprof.rundir.hang_dumps import Collective, RankState, load_dumps

# Ops whose per-rank input size must agree across the group (others may differ legitimately).
_SAME_INPUT = frozenset(
    {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "gather"}
)


@dataclass(frozen=True, slots=True, kw_only=True)
class HangFinding(Finding):
    """One thing that went wrong in a hang or desync (kind: missing, op_mismatch,
    dtype_mismatch, size_mismatch, order, stuck, no_dump); ``ranks`` are the ranks at fault
    (missing ranks, the minority of a mismatch, ranks without a dump), ``title`` the finding in
    plain words."""

    severity: Severity = Severity.CRITICAL
    group: str
    """Process group name ("" when not about one group)."""
    seq: int
    """Sequence number in the group (-1 when not about one collective)."""
    values: tuple[tuple[int, str], ...] = ()
    """(rank, what that rank did) for the ranks compared."""
    op: str = ""
    """The collective's op at (group, seq) ("" when not about one collective)."""
    waiting: tuple[int, ...] = ()
    """The ranks waiting in that collective when they dumped."""
    consequence_of: int | None = None
    """Index in :attr:`HangDiagnosis.findings` of the finding this one follows from (None for a
    root cause or an independent finding)."""

    @property
    def message(self) -> str:
        """The finding in plain words (its title)."""
        return self.title


@dataclass(frozen=True, slots=True)
class RootCause:
    """The finding that explains the others: the ranks whose absence or mismatch blocks the rest."""

    kind: str
    """The root finding's kind ("missing", "op_mismatch", "stuck", "no_dump", ...)."""
    ranks: tuple[int, ...]
    """The ranks at fault."""
    group: str
    """Process group of the collective they block."""
    seq: int
    """Its sequence number in the group."""
    op: str
    """Its op."""
    where: str
    """Where the ranks at fault are ("rank 1: file:line in function; ..."; "" when unknown)."""
    message: str
    """The root cause and the chain of waits it explains, in plain words."""
    finding: int = 0
    """Index of the root finding in :attr:`HangDiagnosis.findings` (always 0)."""


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
    root_cause: RootCause | None = None
    """The first finding as a root cause (None when nothing is wrong)."""
    stacks: StackClusters | None = None
    """The ranks grouped by identical stacks (:mod:`meshprof.analyze.hang.stacks`): where
    each group is, and the outliers."""

    @property
    def ok(self) -> bool:
        return not self.findings

    def to_dict(self) -> dict[str, Any]:
        rc = self.root_cause
        return {
            "directory": self.directory,
            "world_size": self.world_size,
            "root_cause": None
            if rc is None
            else {
                "kind": rc.kind,
                "ranks": list(rc.ranks),
                "group": rc.group,
                "seq": rc.seq,
                "op": rc.op,
                "where": rc.where,
                "message": rc.message,
                "finding": rc.finding,
            },
            "findings": [
                {
                    "index": i,
                    "kind": f.kind,
                    "group": f.group,
                    "seq": f.seq,
                    "op": f.op,
                    "ranks": list(f.ranks),
                    "waiting": list(f.waiting),
                    "message": f.message,
                    "values": [[r, v] for r, v in f.values],
                    "consequence_of": f.consequence_of,
                }
                for i, f in enumerate(self.findings)
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
            "stacks": None
            if self.stacks is None
            else {
                "lines": list(self.stacks.lines),
                "outliers": list(self.stacks.outliers),
                "clusters": [
                    {"ranks": list(c.ranks), "where": c.where, "outlier": c.outlier}
                    for c in self.stacks.clusters
                ],
                "missing": list(self.stacks.missing),
            },
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


_KIND_ORDER = {
    "missing": 0,
    "order": 1,
    "op_mismatch": 1,
    "dtype_mismatch": 1,
    "size_mismatch": 1,
    "stuck": 2,
    "no_dump": 3,
}


def _verb(ranks: tuple[int, ...] | list[int], one: str, many: str) -> str:
    return one if len(ranks) == 1 else many


def _wait_phrase(f: HangFinding, parent: HangFinding | None, states: dict[int, RankState]) -> str:
    """``ranks 0, 3 wait in broadcast seq 7 of group 0 for rank 1`` (and who finished the
    collective ``parent`` is about before waiting here)."""
    if not f.waiting or f.seq < 0:
        return f.message.rstrip(".")
    if f.kind == "missing" or f.kind == "no_dump":
        tail = f" for {_fmt_ranks(f.ranks)}"
    elif f.kind == "stuck":
        tail = ", every member inside"
    else:
        tail = f", {_fmt_ranks(f.ranks)} having called something else"
    head = _fmt_ranks(f.waiting)
    if parent is not None and parent.waiting and parent.seq >= 0:
        finished = [
            r
            for r in f.waiting
            if r in states
            and any(
                c.group == parent.group and c.seq == parent.seq and c.state == "completed"
                for c in states[r].collectives
            )
        ]
        if finished and len(finished) == len(f.waiting):
            head += f" finished {parent.op} seq {parent.seq} and"
    verb = _verb(f.waiting, "waits", "wait")
    return f"{head} {verb} in {f.op} seq {f.seq} of group {f.group}{tail}"


def _where_ranks(ranks: tuple[int, ...], states: dict[int, RankState]) -> str:
    parts = []
    for r in ranks:
        st = states.get(r)
        if st is None:
            parts.append(f"rank {r}: left no dump")
        elif st.location is not None:
            parts.append(f"rank {r}: {st.location}")
    return "; ".join(parts)


def order_by_cause(
    findings: list[HangFinding] | tuple[HangFinding, ...], states: dict[int, RankState]
) -> tuple[tuple[HangFinding, ...], RootCause | None]:
    """Order ``findings`` by causality and mark each one that follows from another.

    A finding's culprits (the ranks it names at fault) are *explained* when they wait in the
    collective of another finding: ranks blocked elsewhere are victims, not causes. The other
    culprits are *free*: outside any collective, without a dump, or the odd ones of a mismatch.
    A finding is a consequence of the finding its blocked culprits wait in when its free culprits
    (if any) are among the free culprits at the end of that chain. Of two findings that only blame
    the same free ranks (rank 1 stuck outside, missed by two groups), the one explaining more is
    the root, the other its consequence. The root cause explains the most findings; each root is
    followed by its consequences (depth first), then come the independent findings.
    """
    if not findings:
        return (), None
    base = sorted(findings, key=lambda f: _KIND_ORDER.get(f.kind, 9))
    n = len(base)
    at_key: dict[tuple[str, int], int] = {}
    for i, f in enumerate(base):
        if f.seq >= 0 and f.waiting:
            at_key.setdefault((f.group, f.seq), i)
    waits_in: dict[int, int] = {}
    for r, st in sorted(states.items()):
        for c in st.inflight:
            j = at_key.get((c.group, c.seq))
            if j is not None and c.peer < 0 and r in base[j].waiting:
                waits_in.setdefault(r, j)
    free: list[frozenset[int]] = []
    edges: list[tuple[int, ...]] = []
    for i, f in enumerate(base):
        if f.kind == "missing":
            free.append(frozenset(r for r in f.ranks if waits_in.get(r, i) == i))
            edges.append(tuple(sorted({waits_in[r] for r in f.ranks if waits_in.get(r, i) != i})))
        else:
            free.append(frozenset(f.ranks))
            edges.append(())

    def blamed(i: int, seen: frozenset[int] = frozenset()) -> frozenset[int]:
        """The free culprits at the end of every chain from finding ``i``."""
        out = set(free[i])
        for j in edges[i]:
            if j not in seen:
                out |= blamed(j, seen | {i})
        return frozenset(out)

    parent: list[int | None] = [None] * n
    for i in range(n):
        if not edges[i]:
            continue
        upstream = frozenset().union(*(blamed(j, frozenset({i})) for j in edges[i]))
        if upstream and free[i] <= upstream:
            parent[i] = edges[i][0]

    def descendants(i: int) -> int:
        kids = [k for k in range(n) if parent[k] == i and k != i]
        return len(kids) + sum(descendants(k) for k in kids if not _cycles(k))

    def _cycles(i: int) -> bool:
        seen = {i}
        p = parent[i]
        while p is not None:
            if p in seen:
                return True
            seen.add(p)
            p = parent[p]
        return False

    for i in range(n):  # a cycle of consequences (blocked ranks waiting on one another): cut it
        if parent[i] is not None and _cycles(i):
            parent[i] = None
    roots = sorted((i for i in range(n) if parent[i] is None), key=lambda i: (-descendants(i), i))
    for k, i in enumerate(roots):  # absences that only blame a root's free ranks follow from it
        if base[i].kind not in ("missing", "no_dump") or not free[i]:
            continue
        for p in roots[:k]:
            if parent[p] is None and free[i] <= blamed(p):
                parent[i] = p
                break
    roots = [i for i in roots if parent[i] is None]
    order: list[int] = []

    def visit(i: int) -> None:
        order.append(i)
        for k in range(n):
            if parent[k] == i and k not in order:
                visit(k)

    for i in roots:
        visit(i)
    new_index = {old: new for new, old in enumerate(order)}
    out: list[HangFinding] = []
    for i in order:
        f = base[i]
        up = parent[i]
        if up is None:
            out.append(f)
            continue
        pf = base[up]
        why = []
        by_finding: dict[int, list[int]] = defaultdict(list)
        for r in f.ranks:
            j = waits_in.get(r, i)
            if j != i:
                by_finding[j].append(r)
        for j, rs in sorted(by_finding.items(), key=lambda kv: new_index[kv[0]]):
            g = base[j]
            why.append(
                f"{_fmt_ranks(rs)} {_verb(rs, 'waits', 'wait')} in {g.op} seq {g.seq} of group "
                f"{g.group} (finding {new_index[j] + 1})"
            )
        why += [f"rank {r} {_where(states.get(r))}" for r in sorted(free[i])]
        msg = f"{_wait_phrase(f, pf, states)}" + (
            f", because {'; '.join(why)}." if why else f" (after finding {new_index[up] + 1})."
        )
        out.append(replace(f, title=msg, consequence_of=new_index[up]))
    top = base[order[0]]
    chain = [
        _wait_phrase(base[i], _parent_finding(base, parent, i), states)
        for i in order
        if i == order[0] or _descends(i, order[0], parent)
    ]
    rc_ranks = tuple(sorted(free[order[0]])) or top.ranks
    rc_msg = top.message
    if len(chain) > 1:
        rc_msg += " It explains the rest: " + "; ".join(chain) + "."
    root = RootCause(
        top.kind, rc_ranks, top.group, top.seq, top.op, _where_ranks(rc_ranks, states), rc_msg
    )
    return tuple(out), root


def _parent_finding(
    base: list[HangFinding], parent: list[int | None], i: int
) -> HangFinding | None:
    up = parent[i]
    return None if up is None else base[up]


def _descends(i: int, root: int, parent: list[int | None]) -> bool:
    p = parent[i]
    while p is not None:
        if p == root:
            return True
        p = parent[p]
    return False


def diagnose_hang(directory: str | os.PathLike[str]) -> HangDiagnosis:
    """Read the dumps in ``directory`` and say what went wrong (see the module docstring)."""
    d, states, problems = load_dumps(directory)
    if not states and problems:
        more = f"; and {len(problems) - 1} more" if len(problems) > 1 else ""
        raise MeshprofError(f"{d}: no usable hang dump ({problems[0]}{more})")
    if not states:
        raise MeshprofError(f"{d}: no hang dumps (rank*.json or fr_rank*.json) found")
    return diagnose_states(states, str(d), tuple(problems))


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
                f"rank {r} {_where(states[r])} (its last collective in the group was seq {states[r].last_seq(c.group)})"
                for r in absent
            )
            findings.append(
                HangFinding(
                    kind=FindingKind.MISSING,
                    group=c.group,
                    seq=c.seq,
                    ranks=tuple(absent),
                    title=f"{_fmt_ranks(absent)} never entered {c.op} seq {c.seq} of group {c.group}, "
                    f"which {_fmt_ranks(inside)} {'is' if len(inside) == 1 else 'are'} waiting in: {parts}.",
                    values=tuple((r, str(states[r].location or "")) for r in absent),
                    op=c.op,
                    waiting=tuple(inside),
                )
            )
        if no_dump:
            findings.append(
                HangFinding(
                    kind=FindingKind.NO_DUMP,
                    group=c.group,
                    seq=c.seq,
                    ranks=tuple(no_dump),
                    title=f"{_fmt_ranks(no_dump)} of group {c.group} left no dump while {_fmt_ranks(inside)} "
                    f"waited in {c.op} seq {c.seq}: dead, exited, or stuck outside Python.",
                    op=c.op,
                    waiting=tuple(inside),
                )
            )
        if not absent and not no_dump and mm is None and order is None:
            age = max((x.age_ns for x in entered.values() if x.state == "inflight"), default=0)
            findings.append(
                HangFinding(
                    kind=FindingKind.STUCK,
                    group=c.group,
                    seq=c.seq,
                    ranks=tuple(inside),
                    title=f"all members of group {c.group} entered {c.signature()} seq {c.seq} with matching "
                    f"arguments and it has not finished after {age / 1e9:.1f} s "
                    f"(a slow or dead link, or a peer stuck inside the backend).",
                    op=c.op,
                    waiting=tuple(inside),
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

"""Hang findings ordered by causality (:func:`order_by_cause`): a rank that another finding's
collective waits for but that itself waits in a collective explains nothing; the ranks at fault
outside any collective (or that called something else, or left no dump) do. The root cause comes
first, and every finding it explains is marked ``consequence_of`` the one it follows from."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from meshprof.analyze.hang.types import HangFinding, RootCause, fmt_ranks, where_of
from meshprof.rundir.hang_dumps import RankState

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
        tail = f" for {fmt_ranks(f.ranks)}"
    elif f.kind == "stuck":
        tail = ", every member inside"
    else:
        tail = f", {fmt_ranks(f.ranks)} having called something else"
    head = fmt_ranks(f.waiting)
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
                f"{fmt_ranks(rs)} {_verb(rs, 'waits', 'wait')} in {g.op} seq {g.seq} of group "
                f"{g.group} (finding {new_index[j] + 1})"
            )
        why += [f"rank {r} {where_of(states.get(r))}" for r in sorted(free[i])]
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

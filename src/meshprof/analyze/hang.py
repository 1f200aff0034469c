"""Hang and desync diagnosis from the ranks' watchdog dumps and Flight Recorder dumps.

``diagnose_hang(dir)`` reads ``dir/rank{r}.json`` (meshprof watchdog dumps; ``dir/hang/`` when
``dir`` is a run directory) and ``fr_rank{r}.json`` (PyTorch Flight Recorder JSON dumps, read as
JSON only, never unpickled), lines the collectives of every rank up by (group, seq), and returns
what went wrong as findings:

* ``missing``: ranks that never entered collective seq k of group g while others are waiting in it,
  and where those ranks are (file:line);
* ``op_mismatch`` / ``dtype_mismatch`` / ``size_mismatch``: the ranks called different things at
  the same (group, seq);
* ``order``: the ranks called the same collectives in a different order;
* ``stuck``: every member entered the collective, with matching arguments, and it did not finish;
* ``no_dump``: ranks that left no dump (dead, exited, or stuck without Python running).

Pure: reads files, returns frozen dataclasses; :func:`render_hang_text` turns them into words.
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshprof.errors import MeshprofError

_DUMP_RE = re.compile(r"^rank(\d+)\.json$")
_FR_RE = re.compile(r"^(?:fr_rank|nccl_trace_rank_|fr_trace_rank_?)(\d+)(?:\.json)?$")
_FR_DTYPES = {
    "Float": "float32",
    "Double": "float64",
    "Half": "float16",
    "BFloat16": "bfloat16",
    "Int": "int32",
    "Long": "int64",
    "Byte": "uint8",
    "Char": "int8",
    "Bool": "bool",
}
_FR_ELEM = {
    "float32": 4,
    "float64": 8,
    "float16": 2,
    "bfloat16": 2,
    "int32": 4,
    "int64": 8,
    "uint8": 1,
    "int8": 1,
    "bool": 1,
}
# Frames of these packages are the machinery, not where the user's code is.
_INTERNAL = (
    f"{os.sep}torch{os.sep}",
    f"{os.sep}meshprof{os.sep}",
    f"{os.sep}threading.py",
    f"{os.sep}multiprocessing{os.sep}",
    f"{os.sep}runpy.py",
    f"{os.sep}contextlib.py",
)
# Ops whose per-rank input size must agree across the group (others may differ legitimately).
_SAME_INPUT = frozenset(
    {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "gather"}
)


@dataclass(frozen=True, slots=True)
class Frame:
    """One Python stack frame."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


@dataclass(frozen=True, slots=True)
class Collective:
    """A collective one rank issued, as its dump saw it."""

    op: str
    """Op name, e.g. "all_reduce"."""
    group: str
    """Process group name."""
    seq: int
    """Sequence number within the group (meshprof numbering: the group's first collective is 0)."""
    dtype: str
    """Element type of the first tensor."""
    in_bytes: int
    """This rank's input bytes."""
    out_bytes: int
    """This rank's output bytes."""
    state: str
    """"completed", "error" or "inflight"."""
    peer: int = -1
    """Global rank of the peer for send/recv, -1 otherwise."""
    age_ns: int = 0
    """For an in-flight op: how long it had been in flight when the dump was written (ns)."""


@dataclass(frozen=True, slots=True)
class RankState:
    """What one rank's dump says."""

    rank: int
    """Global rank."""
    source: str
    """"meshprof" (a watchdog dump) or "flight_recorder"."""
    reason: str
    """Why the dump was written: "hang", "peer", "signal" (meshprof) or "flight_recorder"."""
    collectives: tuple[Collective, ...]
    """The last collectives of the rank, oldest first, the in-flight ones included."""
    groups: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Group name -> global ranks of its members."""
    where: tuple[Frame, ...] = ()
    """Stack of the thread that matters (the one waiting in the in-flight op, else the main
    thread), outermost first; empty for Flight Recorder dumps."""
    world_size: int = 0
    """World size recorded in the dump (0 when unknown)."""

    @property
    def inflight(self) -> tuple[Collective, ...]:
        return tuple(c for c in self.collectives if c.state == "inflight")

    @property
    def location(self) -> Frame | None:
        """The innermost frame of user code (outside torch and meshprof) of :attr:`where`."""
        for f in reversed(self.where):
            if not any(p in f.file for p in _INTERNAL):
                return f
        return self.where[-1] if self.where else None

    def last_seq(self, group: str) -> int:
        """The highest seq this rank issued in ``group`` (-1 if none seen)."""
        seqs = [c.seq for c in self.collectives if c.group == group and c.peer < 0]
        return max(seqs) if seqs else -1


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing that went wrong."""

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
    findings: tuple[Finding, ...]
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
                    "inflight": [_describe(c) for c in s.inflight],
                    "last": [_describe(c) for c in s.collectives[-5:]],
                }
                for s in self.ranks
            ],
            "problems": list(self.problems),
        }


def _describe(c: Collective) -> str:
    peer = f" peer {c.peer}" if c.peer >= 0 else ""
    return (
        f"{c.op}(seq {c.seq}, {c.dtype}, {c.in_bytes} B in, {c.out_bytes} B out{peer}, {c.state})"
    )


def _signature(c: Collective) -> str:
    return f"{c.op} {c.dtype} {c.in_bytes}B->{c.out_bytes}B"


# -- reading ------------------------------------------------------------------------------------
def _read_meshprof(data: dict[str, Any]) -> RankState:
    cols = []
    for e in data.get("events", []):
        cols.append(
            Collective(
                str(e["op"]),
                str(e["group_name"]),
                int(e["seq"]),
                str(e.get("dtype", "")),
                int(e.get("in_bytes", 0)),
                int(e.get("out_bytes", 0)),
                str(e.get("state", "completed")),
                int(e.get("peer", -1)),
            )
        )
    inflight_threads = set()
    for e in data.get("inflight", []):
        cols.append(
            Collective(
                str(e["op"]),
                str(e["group_name"]),
                int(e["seq"]),
                str(e.get("dtype", "")),
                int(e.get("in_bytes", 0)),
                int(e.get("out_bytes", 0)),
                "inflight",
                int(e.get("peer", -1)),
                int(e.get("age_ns", 0)),
            )
        )
        inflight_threads.add(e.get("thread_id"))
    groups = {
        str(g["name"]): tuple(int(r) for r in g.get("ranks", [])) for g in data.get("groups", [])
    }
    for e in [*data.get("events", []), *data.get("inflight", [])]:
        groups.setdefault(str(e["group_name"]), tuple(int(r) for r in e.get("group_ranks", [])))
    threads = data.get("threads", [])
    chosen = next((t for t in threads if t.get("thread_id") in inflight_threads), None)
    if chosen is None:
        chosen = next((t for t in threads if t.get("main")), None)
    where = tuple(
        Frame(str(f["file"]), int(f["line"]), str(f["function"]))
        for f in (chosen or {}).get("frames", [])
    )
    return RankState(
        int(data["rank"]),
        "meshprof",
        str(data.get("reason", "")),
        tuple(cols),
        groups,
        where,
        int(data.get("world_size", 0) or 0),
    )


def _fr_bytes(sizes: list[Any], dtypes: list[str]) -> int:
    total = 0
    for shape, dt in zip(sizes, dtypes, strict=False):
        n = 1
        for d in shape:
            n *= int(d)
        total += n * _FR_ELEM.get(_FR_DTYPES.get(dt, dt), 1)
    return total


def _read_flight_recorder(rank: int, data: dict[str, Any]) -> RankState:
    """Flight Recorder entries -> collectives. FR numbers a group's collectives from 1; meshprof
    from 0, so seq = collective_seq_id - 1."""
    cols = []
    groups: dict[str, tuple[int, ...]] = {}
    for name, cfg in (data.get("pg_config") or {}).items():
        try:
            ranks = tuple(int(r) for r in json.loads(cfg.get("ranks", "[]")))
        except Exception:
            ranks = ()
        groups[str(cfg.get("name") or name)] = ranks
    for e in data.get("entries", []):
        pg = e.get("process_group") or ["", ""]
        group = str(pg[0])
        op = str(e.get("profiling_name", "")).split(":", 1)[-1]
        in_dt = e.get("input_dtypes") or []
        dtype = _FR_DTYPES.get(in_dt[0], in_dt[0]).lower() if in_dt else ""
        state = str(e.get("state", ""))
        done = e.get("time_discovered_completed_ns") or state == "completed"
        if e.get("is_p2p"):
            continue
        cols.append(
            Collective(
                op,
                group,
                int(e.get("collective_seq_id", 0)) - 1,
                dtype,
                _fr_bytes(e.get("input_sizes") or [], in_dt),
                _fr_bytes(e.get("output_sizes") or [], e.get("output_dtypes") or []),
                "completed" if done or (e.get("retired") and state == "completed") else "scheduled",
            )
        )
    # FR on gloo never marks completion: the last collective of each group per pg_status
    # (last_enqueued > last_completed) is the in-flight one.
    status = data.get("pg_status") or {}
    out = []
    for c in cols:
        st = status.get(c.group) or {}
        try:
            last_done = int(st.get("last_completed_collective", -1)) - 1
        except (TypeError, ValueError):
            last_done = -1
        state = "completed" if c.seq <= last_done else "inflight"
        out.append(Collective(c.op, c.group, c.seq, c.dtype, c.in_bytes, c.out_bytes, state))
    return RankState(rank, "flight_recorder", "flight_recorder", tuple(out), groups)


def load_dumps(directory: str | os.PathLike[str]) -> tuple[Path, dict[int, RankState], list[str]]:
    """Read every dump in ``directory`` (or ``directory/hang``). Returns (folder, states, problems)."""
    d = Path(directory)
    if not d.is_dir():
        raise MeshprofError(f"{d}: no such directory (give the run directory or its hang/ folder)")
    if (d / "hang").is_dir():
        d = d / "hang"
    states: dict[int, RankState] = {}
    fr_states: dict[int, RankState] = {}
    problems: list[str] = []
    for p in sorted(d.iterdir()):
        m, fm = _DUMP_RE.match(p.name), _FR_RE.match(p.name)
        if not (m or fm) or not p.is_file():
            continue
        try:
            raw = p.read_bytes()
            if raw[:1] not in (b"{", b"[", b" ", b"\n"):
                problems.append(
                    f"{p.name}: not JSON (a pickled Flight Recorder dump? set TORCH_FR_DUMP_TEMP_FILE and dump as JSON); skipped"
                )
                continue
            data = json.loads(raw.decode("utf-8"))
            if m and isinstance(data, dict) and "events" in data and "rank" in data:
                st = _read_meshprof(data)
                states[st.rank] = st
            elif isinstance(data, dict) and "entries" in data:
                rank = int((fm or m).group(1))  # type: ignore[union-attr]
                fr_states[rank] = _read_flight_recorder(rank, data)
            else:
                problems.append(f"{p.name}: not a meshprof or Flight Recorder dump; skipped")
        except (OSError, ValueError, KeyError, TypeError) as e:
            problems.append(f"{p.name}: unreadable ({type(e).__name__}: {e}); skipped")
    for r, st in fr_states.items():
        states.setdefault(r, st)
    return d, states, problems


# -- analysis -----------------------------------------------------------------------------------
def _where(st: RankState | None) -> str:
    if st is None:
        return "left no dump"
    loc = st.location
    return f"is at {loc}" if loc is not None else "has no stack in its dump"


def _fmt_ranks(ranks: list[int] | tuple[int, ...]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def _mismatch(
    group: str, seq: int, by_rank: dict[int, Collective], states: dict[int, RankState]
) -> Finding | None:
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
            f"{_fmt_ranks(rs)}: {_signature(by_rank[rs[0]])}" for rs in values.values()
        )
        locs = "; ".join(
            f"rank {r} {_where(states.get(r))}" for r in odd if states.get(r) and states[r].where
        )
        msg = f"ranks {what} at collective seq {seq} of group {group}: {parts}."
        if locs:
            msg += f" {locs}."
        return Finding(
            kind,
            group,
            seq,
            tuple(odd),
            msg,
            tuple((r, _signature(c)) for r, c in sorted(by_rank.items())),
        )
    return None


def _order_finding(
    group: str, seq: int, states: dict[int, RankState], members: list[int]
) -> Finding | None:
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
        return Finding(
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
    findings: list[Finding] = []
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
                Finding(
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
                Finding(
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
                Finding(
                    "stuck",
                    c.group,
                    c.seq,
                    tuple(inside),
                    f"all members of group {c.group} entered {_signature(c)} seq {c.seq} with matching "
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


def render_hang_text(diag: HangDiagnosis) -> str:
    """The diagnosis in plain words, for the terminal."""
    lines = [
        f"meshprof hang: {len(diag.ranks)} rank dump(s) in {diag.directory} (world size {diag.world_size or '?'})"
    ]
    if not diag.findings:
        lines.append(
            "No hang or desync found: every collective in flight had all members, with matching arguments."
        )
    for i, f in enumerate(diag.findings, 1):
        lines.append(f"{i}. [{f.kind}] {f.message}")
    lines.append("")
    lines.append("Where each rank is:")
    for st in diag.ranks:
        fl = st.inflight
        doing = (
            ", ".join(f"{c.op} seq {c.seq} of group {c.group} ({c.age_ns / 1e9:.1f} s)" for c in fl)
            or "no collective in flight"
        )
        loc = st.location
        lines.append(
            f"  rank {st.rank}: {doing}; {('at ' + str(loc)) if loc else 'no Python stack'} [{st.source}: {st.reason}]"
        )
    for p in diag.problems:
        lines.append(f"  note: {p}")
    return "\n".join(lines)


__all__ = [
    "Collective",
    "Finding",
    "Frame",
    "HangDiagnosis",
    "RankState",
    "diagnose_hang",
    "load_dumps",
    "render_hang_text",
]

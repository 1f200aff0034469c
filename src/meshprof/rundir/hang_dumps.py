"""Loading hang dumps: meshprof watchdog dumps and PyTorch Flight Recorder dumps → per-rank states.

``load_dumps(dir)`` reads ``dir/rank{r}.json`` (meshprof watchdog dumps; ``dir/hang/`` when
``dir`` is a run directory) and ``fr_rank{r}.json`` (Flight Recorder JSON dumps, read as JSON
only, never unpickled) into one :class:`RankState` per rank. Sizes are bytes, ages nanoseconds,
sequence numbers meshprof's (a group's first collective is 0). :mod:`meshprof.analyze.hang.diagnose`
diagnoses what the states show.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshprof.errors import MeshprofError
from meshprof.records.codec import RecordError
from meshprof.records.members import check_ranks, check_world
from meshprof.records.stacks import StackFrame
from meshprof.rundir.json_file import read_bytes
from meshprof.rundir.schema import HANG_DIR

_DUMP_RE = re.compile(r"^rank(\d+)\.json$")
"""Name of a meshprof watchdog dump (:func:`dump_path`)."""
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
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_OWN = f"{os.sep}meshprof{os.sep}"


def _is_meshprof(path: str) -> bool:
    """A frame of meshprof's own code: the part after the last ``/meshprof/`` is a file of this
    package (a user's checkout or project folder named "meshprof" is user code)."""
    i = path.rfind(_OWN)
    if i < 0:
        return False
    return os.path.isfile(os.path.join(_PACKAGE_DIR, path[i + len(_OWN) :]))


_INTERNAL = (
    f"{os.sep}torch{os.sep}",
    f"{os.sep}threading.py",
    f"{os.sep}multiprocessing{os.sep}",
    f"{os.sep}runpy.py",
    f"{os.sep}contextlib.py",
)


Frame = StackFrame
"""One Python stack frame of a dump: the frame ``meshprof stacks`` records too."""


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

    def describe(self) -> str:
        """The collective in one line, every field named (as ``meshprof hang --json`` shows it)."""
        peer = f" peer {self.peer}" if self.peer >= 0 else ""
        return (
            f"{self.op}(seq {self.seq}, {self.dtype}, {self.in_bytes} B in, "
            f"{self.out_bytes} B out{peer}, {self.state})"
        )

    def signature(self) -> str:
        """What must agree across ranks: op, dtype and sizes, e.g. ``all_reduce float32 4B->4B``."""
        return f"{self.op} {self.dtype} {self.in_bytes}B->{self.out_bytes}B"


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
            if not any(p in f.file for p in _INTERNAL) and not _is_meshprof(f.file):
                return f
        return self.where[-1] if self.where else None

    def last_seq(self, group: str) -> int:
        """The highest seq this rank issued in ``group`` (-1 if none seen)."""
        seqs = [c.seq for c in self.collectives if c.group == group and c.peer < 0]
        return max(seqs) if seqs else -1


def dump_path(dump_dir: str | os.PathLike[str], rank: int) -> Path:
    """Where the watchdog of rank ``rank`` writes its dump: ``DUMP_DIR/rank{r}.json``."""
    return Path(dump_dir) / f"rank{int(rank)}.json"


def fr_dump_path(dump_dir: str | os.PathLike[str], rank: int) -> Path:
    """Where it writes the Flight Recorder's JSON dump next to it: ``DUMP_DIR/fr_rank{r}.json``."""
    return Path(dump_dir) / f"fr_rank{int(rank)}.json"


def dump_files(dump_dir: str | os.PathLike[str]) -> list[Path]:
    """The meshprof watchdog dumps in ``dump_dir`` (the names :func:`dump_path` gives), sorted
    by name; [] when the folder does not exist (yet) or cannot be read."""
    try:
        return sorted(p for p in Path(dump_dir).iterdir() if _DUMP_RE.match(p.name))
    except OSError:
        return []


def _collective(e: dict[str, Any], state: str, age_ns: int) -> Collective:
    """One event of a meshprof watchdog dump (finished or in flight)."""
    return Collective(
        str(e["op"]),
        str(e["group_name"]),
        int(e["seq"]),
        str(e.get("dtype", "")),
        int(e.get("in_bytes", 0)),
        int(e.get("out_bytes", 0)),
        state,
        int(e.get("peer", -1)),
        age_ns,
    )


def _read_meshprof(data: dict[str, Any]) -> RankState:
    cols = [_collective(e, str(e.get("state", "completed")), 0) for e in data.get("events", [])]
    inflight_threads = set()
    for e in data.get("inflight", []):
        cols.append(_collective(e, "inflight", int(e.get("age_ns", 0))))
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
    rank, world = int(data["rank"]), int(data.get("world_size", 0) or 0)
    check_world(rank, "rank", low=0)
    check_world(world, "world_size")
    for g, members in groups.items():
        check_ranks(members, f"group {g}")
    return RankState(
        rank, "meshprof", str(data.get("reason", "")), tuple(cols), groups, where, world
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
            check_ranks(ranks, "ranks")
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


MAX_DUMP_BYTES = 512 << 20
"""A dump larger than this (bytes) is not read (a Flight Recorder dump of 20,000 entries is a
few MB)."""


def _short(e: BaseException) -> str:
    text = str(e)
    return text if len(text) <= 200 else text[:197] + "..."


def load_dumps(directory: str | os.PathLike[str]) -> tuple[Path, dict[int, RankState], list[str]]:
    """Read every dump in ``directory`` (or ``directory/hang``). Returns (folder, states, problems)."""
    d = Path(directory)
    if not d.is_dir():
        raise MeshprofError(f"{d}: no such directory (give the run directory or its hang/ folder)")
    if (d / HANG_DIR).is_dir():
        d = d / HANG_DIR
    states: dict[int, RankState] = {}
    fr_states: dict[int, RankState] = {}
    problems: list[str] = []
    for p in sorted(d.iterdir()):
        m, fm = _DUMP_RE.match(p.name), _FR_RE.match(p.name)
        if not (m or fm) or not p.is_file():
            continue
        try:
            raw = read_bytes(p, MAX_DUMP_BYTES)
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
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecordError) as e:
            problems.append(f"{p.name}: unreadable ({type(e).__name__}: {_short(e)}); skipped")
        except RecursionError:
            problems.append(f"{p.name}: unreadable (JSON nested too deep); skipped")
    for r, st in fr_states.items():
        states.setdefault(r, st)
    return d, states, problems


__all__ = [
    "Collective",
    "Frame",
    "RankState",
    "dump_files",
    "dump_path",
    "fr_dump_path",
    "load_dumps",
]

"""The merged timeline as a Chrome JSON trace (loads in ui.perfetto.dev and chrome://tracing).

One process per rank (``pid`` = rank), one thread track per kind of bar: steps, phases by nesting
depth, and one track per process group's collectives. Every matched collective gets flow arrows
("s" → "f", bound to the enclosing slices) from each member that arrived early to the member that
arrived last, so the arrows point at the rank everybody waited for. Send/recv pairs get an arrow
from the send to the recv. All times are on the aligned clock, in µs from the run's first event.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from meshprof.analyze.clock import ClockAlignment
from meshprof.analyze.match import CollectiveMatch
from meshprof.analyze.table import EventTable
from meshprof.rundir import LoadedRun, atomic_write_text

_STEP_TID = 1
_PHASE_TID = 10  # + depth
_GROUP_TID = 100  # + run-wide group code


def build_trace(
    run: LoadedRun, table: EventTable, clock: ClockAlignment, match: CollectiveMatch
) -> dict[str, Any]:
    """The trace as a dict: ``{"traceEvents": [...], "displayTimeUnit": "ms", "metadata": {...}}``."""
    starts = [int((table.start_ns + _offsets(table, clock)).min())] if len(table) else []
    for r, rd in run.ranks.items():
        if len(rd.spans):
            starts.append(int(rd.spans["start_ns"].min()) + clock.offset(r))
    t0 = min(starts) if starts else 0

    def us(ns: int) -> float:
        return round((ns - t0) / 1000.0, 3)

    ev: list[dict[str, Any]] = []
    for r in sorted(run.ranks):
        rd = run.ranks[r]
        host = str(rd.meta.get("hostname", ""))
        ev.append(
            {
                "ph": "M",
                "name": "process_name",
                "pid": r,
                "tid": 0,
                "args": {"name": f"rank {r}" + (f" ({host})" if host else "")},
            }
        )
        ev.append(
            {"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0, "args": {"sort_index": r}}
        )
        off = clock.offset(r)
        names = rd.span_names
        tids: set[int] = set()
        for row in rd.spans:
            kind = int(row["kind"])
            tid = _STEP_TID if kind == 0 else _PHASE_TID + int(row["depth"])
            tids.add(tid)
            name = (
                f"step {int(row['step'])}"
                if kind == 0
                else (names[row["name"]] if row["name"] < len(names) else f"#{int(row['name'])}")
            )
            ev.append(
                {
                    "ph": "X",
                    "name": name,
                    "cat": "step" if kind == 0 else "phase",
                    "pid": r,
                    "tid": tid,
                    "ts": us(int(row["start_ns"]) + off),
                    "dur": round(int(row["duration_ns"]) / 1000.0, 3),
                    "args": {"step": int(row["step"])},
                }
            )
        mine = np.nonzero(table.rank == r)[0]
        for k in mine:
            g = int(table.gid[k])
            tid = _GROUP_TID + g
            tids.add(tid)
            ev.append(
                {
                    "ph": "X",
                    "name": table.ops[table.op[k]],
                    "cat": "comm",
                    "pid": r,
                    "tid": tid,
                    "ts": us(int(table.start_ns[k]) + off),
                    "dur": round(int(table.duration_ns[k]) / 1000.0, 3),
                    "args": {
                        "group": table.groups[g].name,
                        "seq": int(table.seq[k]),
                        "bytes": int(table.size_bytes[k]),
                        "peer": int(table.peer[k]),
                    },
                }
            )
        for tid in sorted(tids):
            if tid == _STEP_TID:
                label = "steps"
            elif tid < _GROUP_TID:
                label = f"phases (depth {tid - _PHASE_TID})"
            else:
                gr = table.groups[tid - _GROUP_TID]
                label = f"{gr.desc or 'group'} [{gr.dimension}] {gr.name}"
            ev.append(
                {"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": label}}
            )
            ev.append(
                {
                    "ph": "M",
                    "name": "thread_sort_index",
                    "pid": r,
                    "tid": tid,
                    "args": {"sort_index": tid},
                }
            )
    ev.extend(_flows(table, match, us, clock))
    return {
        "traceEvents": ev,
        "displayTimeUnit": "ms",
        "metadata": {
            "meshprof": "merged timeline",
            "t0_ns": t0,
            "clock_max_uncertainty_ns": clock.max_uncertainty_ns,
        },
    }


def _offsets(table: EventTable, clock: ClockAlignment) -> np.ndarray:
    offs = clock.offsets()
    return np.asarray([offs.get(int(r), 0) for r in table.rank], dtype=np.int64)


def _flows(
    table: EventTable, m: CollectiveMatch, us: Any, clock: ClockAlignment
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    fid = 0
    last_member = {}
    for i in range(len(m.member_coll)):
        c = int(m.member_coll[i])
        if m.present[c] >= 2 and int(m.member_rank[i]) == int(m.last_rank[c]):
            last_member[c] = i
    for i in range(len(m.member_coll)):
        c = int(m.member_coll[i])
        j = last_member.get(c)
        if j is None or j == i:
            continue
        fid += 1
        name = f"{table.ops[m.op[c]]} {table.groups[m.gid[c]].name}#{int(m.seq[c])}"
        for ph, idx in (("s", i), ("f", j)):
            row = int(m.member_row[idx])
            e = {
                "ph": ph,
                "id": fid,
                "name": name,
                "cat": "match",
                "pid": int(table.rank[row]),
                "tid": _GROUP_TID + int(table.gid[row]),
                "ts": us(int(m.member_arrival_ns[idx])),
            }
            if ph == "f":
                e["bp"] = "e"
            out.append(e)
    for s_row, r_row in zip(m.p2p_send_row.tolist(), m.p2p_recv_row.tolist(), strict=True):
        fid += 1
        for ph, row in (("s", s_row), ("f", r_row)):
            rk = int(table.rank[row])
            e = {
                "ph": ph,
                "id": fid,
                "name": f"p2p {int(table.seq[row])}",
                "cat": "match",
                "pid": rk,
                "tid": _GROUP_TID + int(table.gid[row]),
                "ts": us(int(table.start_ns[row]) + clock.offset(rk)),
            }
            if ph == "f":
                e["bp"] = "e"
            out.append(e)
    return out


def write_trace(path: Path, trace: dict[str, Any]) -> Path:
    """Write the trace atomically as compact JSON."""
    return atomic_write_text(Path(path), json.dumps(trace, separators=(",", ":")))

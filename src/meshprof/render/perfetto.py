"""The merged timeline as a Chrome JSON trace (loads in ui.perfetto.dev and chrome://tracing).

One process per rank (``pid`` = rank), one thread track per kind of bar: steps, phases by nesting
depth, and one track per process group's collectives. Every matched collective gets flow arrows
("s" → "f", bound to the enclosing slices) from each member that arrived early to the member that
arrived last, so the arrows point at the rank everybody waited for. Send/recv pairs get an arrow
from the send to the recv. All times are on the aligned clock, in µs from the run's first event.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from meshprof.analyze.clock import ClockAlignment
from meshprof.analyze.match import CollectiveMatch
from meshprof.analyze.table import EventTable
from meshprof.rundir import LoadedRun

_STEP_TID = 1
_PHASE_TID = 10  # + depth
_GROUP_TID = 100  # + run-wide group code

DEFAULT_MAX_EVENTS = 250_000
"""Collective slices a trace keeps by default (about 2 × as many JSON events with the flow arrows,
~80 MB of JSON: what ui.perfetto.dev and chrome://tracing open in seconds; a trace of every event
of 8 ranks × 1M collectives would be ~3 GB). A longer run keeps its last whole steps that fit;
``None`` or 0 keeps everything."""


def _cutoff(
    run: LoadedRun, table: EventTable, aligned: np.ndarray, clock: ClockAlignment, cap: int
) -> int | None:
    """Aligned time from which the trace keeps events (None: keep all): the start of the first
    step (earliest over ranks) at or after the start of the ``cap``-th last collective; when no
    step starts there, that collective's start itself."""
    if not cap or len(table) <= cap:
        return None
    t = int(np.partition(aligned, len(aligned) - cap)[len(aligned) - cap])
    # earliest aligned start of each step over ranks, in one pass over all ranks' step spans
    steps, starts = [], []
    for r, rd in run.ranks.items():
        st = rd.spans[rd.spans["kind"] == 0]
        steps.append(st["step"].astype(np.int64))
        starts.append(st["start_ns"].astype(np.int64) + clock.offset(r))
    if not steps:
        return t
    step, a = np.concatenate(steps), np.concatenate(starts)
    if not len(step):
        return t
    u, inv = np.unique(step, return_inverse=True)
    firsts = np.full(len(u), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(firsts, inv.reshape(-1), a)
    later = firsts[firsts >= t]
    return int(later.min()) if len(later) else t


def build_trace(
    run: LoadedRun,
    table: EventTable,
    clock: ClockAlignment,
    match: CollectiveMatch,
    *,
    max_events: int | None = DEFAULT_MAX_EVENTS,
) -> dict[str, Any]:
    """The trace as a dict: ``{"traceEvents": [...], "displayTimeUnit": "ms", "metadata": {...}}``.

    With more than ``max_events`` collectives (all ranks) only the last whole steps are kept:
    every slice and arrow from the first kept step's start on (see :data:`DEFAULT_MAX_EVENTS`);
    ``metadata["truncated"]`` then says from when and how much was left out."""
    off_all = _offsets(table, clock)
    aligned = table.start_ns + off_all
    cut = _cutoff(run, table, aligned, clock, int(max_events or 0))
    starts = [int(aligned.min())] if len(table) else []
    for r, rd in run.ranks.items():
        if len(rd.spans):
            starts.append(int(rd.spans["start_ns"].min()) + clock.offset(r))
    t0 = min(starts) if starts else 0

    def us(ns: int) -> float:
        return round((ns - t0) / 1000.0, 3)

    keep_row = aligned >= cut if cut is not None else None
    ev: list[dict[str, Any]] = []
    group_names = [g.name for g in table.groups]
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
        sp = rd.spans
        if cut is not None:
            sp = sp[sp["start_ns"].astype(np.int64) + off >= cut]
        for kind, depth, nm, step, start, dur in zip(
            sp["kind"].tolist(),
            sp["depth"].tolist(),
            sp["name"].tolist(),
            sp["step"].tolist(),
            sp["start_ns"].tolist(),
            sp["duration_ns"].tolist(),
            strict=True,
        ):
            tid = _STEP_TID if kind == 0 else _PHASE_TID + depth
            tids.add(tid)
            name = f"step {step}" if kind == 0 else (names[nm] if nm < len(names) else f"#{nm}")
            ev.append(
                {
                    "ph": "X",
                    "name": name,
                    "cat": "step" if kind == 0 else "phase",
                    "pid": r,
                    "tid": tid,
                    "ts": us(start + off),
                    "dur": round(dur / 1000.0, 3),
                    "args": {"step": step},
                }
            )
        mine = np.flatnonzero(table.rank == r)
        if keep_row is not None:
            mine = mine[keep_row[mine]]
        for g, op, start, dur, seq, size, peer in zip(
            table.gid[mine].tolist(),
            table.op[mine].tolist(),
            table.start_ns[mine].tolist(),
            table.duration_ns[mine].tolist(),
            table.seq[mine].tolist(),
            table.size_bytes[mine].tolist(),
            table.peer[mine].tolist(),
            strict=True,
        ):
            tid = _GROUP_TID + g
            tids.add(tid)
            ev.append(
                {
                    "ph": "X",
                    "name": table.ops[op],
                    "cat": "comm",
                    "pid": r,
                    "tid": tid,
                    "ts": us(start + off),
                    "dur": round(dur / 1000.0, 3),
                    "args": {
                        "group": group_names[g],
                        "seq": seq,
                        "bytes": size,
                        "peer": peer,
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
    ev.extend(_flows(table, match, us, clock, keep_row))
    meta: dict[str, Any] = {
        "meshprof": "merged timeline",
        "t0_ns": t0,
        "clock_max_uncertainty_ns": clock.max_uncertainty_ns,
    }
    if cut is not None and keep_row is not None:
        meta["truncated"] = {
            "kept_from_ns": cut,
            "collectives_total": len(table),
            "collectives_kept": int(keep_row.sum()),
            "max_events": int(max_events or 0),
        }
    return {"traceEvents": ev, "displayTimeUnit": "ms", "metadata": meta}


def _offsets(table: EventTable, clock: ClockAlignment) -> np.ndarray:
    offs = clock.offsets()
    if not len(table):
        return np.zeros(0, dtype=np.int64)
    by_rank = np.asarray([offs.get(r, 0) for r in range(int(table.rank.max()) + 1)], dtype=np.int64)
    return by_rank[table.rank]


def _flows(
    table: EventTable,
    m: CollectiveMatch,
    us: Any,
    clock: ClockAlignment,
    keep_row: np.ndarray | None = None,
) -> list[dict[str, Any]]:
    """Arrows from each early member of a collective to its last member (the last one in the
    collective's arrival-ordered block), then from each send to its recv."""
    out: list[dict[str, Any]] = []
    fid = 0
    n = len(m.member_coll)
    if n:
        # members of a collective are contiguous, in arrival order: its last member ends the block
        block_end = np.r_[np.flatnonzero(m.member_coll[1:] != m.member_coll[:-1]), n - 1]
        last_of = np.full(len(m), -1, dtype=np.int64)
        last_of[m.member_coll[block_end]] = block_end
        last_i = last_of[m.member_coll]
        early = np.flatnonzero((m.present[m.member_coll] >= 2) & (last_i != np.arange(n)))
        if keep_row is not None:
            ok = keep_row[m.member_row[early]] & keep_row[m.member_row[last_i[early]]]
            early = early[ok]
        j = last_i[early]
        c = m.member_coll[early]
        rows_i, rows_j = m.member_row[early], m.member_row[j]
        group_names = [g.name for g in table.groups]
        for ri, rj, ai, aj, op, gid, seq in zip(
            rows_i.tolist(),
            rows_j.tolist(),
            m.member_arrival_ns[early].tolist(),
            m.member_arrival_ns[j].tolist(),
            m.op[c].tolist(),
            m.gid[c].tolist(),
            m.seq[c].tolist(),
            strict=True,
        ):
            fid += 1
            name = f"{table.ops[op]} {group_names[gid]}#{seq}"
            for ph, row, arr in (("s", ri, ai), ("f", rj, aj)):
                e = {
                    "ph": ph,
                    "id": fid,
                    "name": name,
                    "cat": "match",
                    "pid": int(table.rank[row]),
                    "tid": _GROUP_TID + int(table.gid[row]),
                    "ts": us(arr),
                }
                if ph == "f":
                    e["bp"] = "e"
                out.append(e)
    for s_row, r_row in zip(m.p2p_send_row.tolist(), m.p2p_recv_row.tolist(), strict=True):
        if keep_row is not None and not (keep_row[s_row] and keep_row[r_row]):
            continue
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
    """Write the trace atomically as compact JSON (the events encoded in batches, so the whole
    document never sits in memory as one string)."""
    import os
    import tempfile

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    head = {k: v for k, v in trace.items() if k != "traceEvents"}
    events = trace.get("traceEvents", [])
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write('{"traceEvents":[')
            for i in range(0, len(events), _WRITE_BATCH):
                if i:
                    f.write(",")
                f.write(json.dumps(events[i : i + _WRITE_BATCH], separators=(",", ":"))[1:-1])
            f.write("]")
            for k, v in head.items():
                f.write("," + json.dumps(k) + ":" + json.dumps(v, separators=(",", ":")))
            f.write("}")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


_WRITE_BATCH = 20_000

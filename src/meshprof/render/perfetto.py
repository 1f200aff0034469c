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

from meshprof.analyze.run.conclusions.timeline_excerpt import (
    DEFAULT_MAX_EVENTS,
    FlowArrows,
    MergedTimeline,
    RankSlices,
    merged_timeline,
)
from meshprof.analyze.run.events.clock import ClockAlignment
from meshprof.analyze.run.events.match import CollectiveMatch
from meshprof.analyze.run.events.table import EventTable
from meshprof.rundir import LoadedRun
from meshprof.rundir.atomic import atomic_open

_STEP_TID = 1
_PHASE_TID = 10  # + depth
_GROUP_TID = 100  # + run-wide group code

__all__ = ["build_trace", "trace_document", "write_trace"]


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
    every slice and arrow from the first kept step's start on (see
    :data:`~meshprof.analyze.run.conclusions.timeline_excerpt.DEFAULT_MAX_EVENTS`); ``metadata["truncated"]`` then says
    from when and how much was left out."""
    return trace_document(merged_timeline(run, table, clock, match, max_events=max_events))


def trace_document(tl: MergedTimeline) -> dict[str, Any]:
    """The Chrome JSON trace of a merged timeline (times in µs from ``tl.t0_ns``)."""
    t0 = tl.t0_ns

    def us(ns: int) -> float:
        return round((ns - t0) / 1000.0, 3)

    ev: list[dict[str, Any]] = []
    for rs in tl.ranks:
        ev.extend(_rank_events(rs, tl, us))
    ev.extend(_flow_events(tl.flows, us))
    meta: dict[str, Any] = {
        "meshprof": "merged timeline",
        "t0_ns": t0,
        "clock_max_uncertainty_ns": tl.clock_max_uncertainty_ns,
    }
    if tl.truncation is not None:
        tr = tl.truncation
        meta["truncated"] = {
            "kept_from_ns": tr.kept_from_ns,
            "collectives_total": tr.collectives_total,
            "collectives_kept": tr.collectives_kept,
            "max_events": tr.max_events,
        }
    return {"traceEvents": ev, "displayTimeUnit": "ms", "metadata": meta}


def _meta_event(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "args": args}


def _rank_events(rs: RankSlices, tl: MergedTimeline, us: Any) -> list[dict[str, Any]]:
    """One rank's process, its step/phase/collective slices and its thread tracks."""
    r = rs.rank
    ev = [
        _meta_event(
            "process_name", r, 0, {"name": f"rank {r}" + (f" ({rs.host})" if rs.host else "")}
        ),
        _meta_event("process_sort_index", r, 0, {"sort_index": r}),
    ]
    tids: set[int] = set()
    for kind, depth, nm, step, start, dur in zip(
        rs.span_kind,
        rs.span_depth,
        rs.span_name,
        rs.span_step,
        rs.span_start_ns,
        rs.span_duration_ns,
        strict=True,
    ):
        tid = _STEP_TID if kind == 0 else _PHASE_TID + depth
        tids.add(tid)
        ev.append(
            {
                "ph": "X",
                "name": f"step {step}" if kind == 0 else nm,
                "cat": "step" if kind == 0 else "phase",
                "pid": r,
                "tid": tid,
                "ts": us(start),
                "dur": round(dur / 1000.0, 3),
                "args": {"step": step},
            }
        )
    group_names = [g.name for g in tl.groups]
    for g, op, start, dur, seq, size, peer in zip(
        rs.comm_gid,
        rs.comm_op,
        rs.comm_start_ns,
        rs.comm_duration_ns,
        rs.comm_seq,
        rs.comm_bytes,
        rs.comm_peer,
        strict=True,
    ):
        tid = _GROUP_TID + g
        tids.add(tid)
        ev.append(
            {
                "ph": "X",
                "name": op,
                "cat": "comm",
                "pid": r,
                "tid": tid,
                "ts": us(start),
                "dur": round(dur / 1000.0, 3),
                "args": {"group": group_names[g], "seq": seq, "bytes": size, "peer": peer},
            }
        )
    for tid in sorted(tids):
        if tid == _STEP_TID:
            label = "steps"
        elif tid < _GROUP_TID:
            label = f"phases (depth {tid - _PHASE_TID})"
        else:
            gr = tl.groups[tid - _GROUP_TID]
            label = f"{gr.desc or 'group'} [{gr.dimension}] {gr.name}"
        ev.append(_meta_event("thread_name", r, tid, {"name": label}))
        ev.append(_meta_event("thread_sort_index", r, tid, {"sort_index": tid}))
    return ev


def _flow_events(f: FlowArrows, us: Any) -> list[dict[str, Any]]:
    """Each arrow as an "s" event at its tail and an "f" event (bound to the enclosing slice)
    at its head; ids count from 1."""
    out: list[dict[str, Any]] = []
    for i in range(len(f.name)):
        fid = i + 1
        for ph, name, rank, gid, t in (
            ("s", f.name[i], f.src_rank[i], f.src_gid[i], f.src_ns[i]),
            ("f", f.dst_name[i], f.dst_rank[i], f.dst_gid[i], f.dst_ns[i]),
        ):
            e: dict[str, Any] = {
                "ph": ph,
                "id": fid,
                "name": name,
                "cat": "match",
                "pid": rank,
                "tid": _GROUP_TID + gid,
                "ts": us(t),
            }
            if ph == "f":
                e["bp"] = "e"
            out.append(e)
    return out


def write_trace(path: Path, trace: dict[str, Any]) -> Path:
    """Write the trace atomically as compact JSON (the events encoded in batches, so the whole
    document never sits in memory as one string)."""
    head = {k: v for k, v in trace.items() if k != "traceEvents"}
    events = trace.get("traceEvents", [])
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.write('{"traceEvents":[')
        for i in range(0, len(events), _WRITE_BATCH):
            if i:
                f.write(",")
            f.write(json.dumps(events[i : i + _WRITE_BATCH], separators=(",", ":"))[1:-1])
        f.write("]")
        for k, v in head.items():
            f.write("," + json.dumps(k) + ":" + json.dumps(v, separators=(",", ":")))
        f.write("}")
    return Path(path)


_WRITE_BATCH = 20_000

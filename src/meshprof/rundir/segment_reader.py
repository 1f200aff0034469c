"""Reading a rank folder (:mod:`meshprof.rundir.segments`) back as :class:`RankData`.

The newest generation is read (the last process of the rank, as a rank file held the last
write): its meta, every batch of its segments in order, its per-step totals. What is not on disk
is said in the meta the loader returns: ``evicted_events`` counts the events recorded but not in
the segments (rotated out by retention, dropped by the ring before a tick, or never written
after the disk filled up; ``storage`` says which); a rank whose process died without its final
write gets ``recovered`` from its last batch (the step it was in, when it was last seen).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from meshprof.errors import MeshprofError
from meshprof.events import (
    EVENT_DTYPE,
    MEMORY_DTYPE,
    REQUEST_DTYPE,
    REQUEST_TRACE_DTYPE,
    SPAN_DTYPE,
    TOKEN_DTYPE,
)
from meshprof.records.codec import RecordError
from meshprof.records.members import Members
from meshprof.records.rank_meta import Recovered
from meshprof.rundir.atomic import atomic_write_text
from meshprof.rundir.json_file import read_bytes
from meshprof.rundir.rankfile import RankData, lean_events, parse_meta
from meshprof.rundir.schema import ExitStatus, RankMeta, launcher_exit, rank_entries
from meshprof.rundir.segments import (
    RANK_DIR_RE,
    ServingChunk,
    iter_batches,
    join_rows,
    read_cursor,
    read_step_totals,
    scan_rank_dir,
)

_LEAN_HOLD = 4 << 20
"""A lean load holds a rank's rows as read while they are under this many bytes, and makes its
narrow copy from them in one pass; a larger rank is read again in chunks (never held whole)."""


def _empty(dtype: np.dtype) -> np.ndarray:
    return np.zeros(0, dtype)


def load_rank_dir(
    path: str | Path,
    *,
    lean: bool = False,
    sample_limit: int | None = None,
    shared_ranks: dict[str, Members] | None = None,
    meta_only: bool = False,
) -> RankData:
    """Load one rank folder (the arguments as for
    :func:`~meshprof.rundir.rankfile.load_rank_file`); a folder without segments or with a
    damaged meta raises :class:`MeshprofError`. ``meta_only``: no rows, only the meta and
    (from the last segment) how the rank was last seen."""
    path = Path(path)
    files = scan_rank_dir(path)
    if files is None:
        raise MeshprofError(f"{path}: no segments")
    if meta_only:
        files = dataclasses.replace(files, segments=files.segments[-1:], steps=None)
    raw: Any = {}
    if files.meta is not None:
        try:
            raw = parse_meta(read_bytes(files.meta).decode("utf-8"), shared_ranks)
        except (OSError, ValueError, RecursionError) as e:
            raise MeshprofError(f"{files.meta}: damaged rank meta ({e})") from None
    if not isinstance(raw, dict):
        raise MeshprofError(f"{files.meta}: damaged rank meta (not a JSON object)")
    raw.pop("errors", None)
    raw.pop("metadata", None)
    try:
        meta = RankMeta.from_dict(raw, "meta")
    except RecordError as e:
        raise MeshprofError(f"{files.meta}: damaged rank meta ({e})") from None
    problems: list[str] = []
    spans: list[np.ndarray] = []
    memory: list[np.ndarray] = []
    events: list[np.ndarray] = []
    errors: dict[str, str] = {}
    metadata: dict[str, Any] = {}
    rows = 0
    first_id = -1
    last: Any = None
    batches = 0
    inflight = _empty(EVENT_DTYPE)
    serving: list[ServingChunk] = []
    for b in iter_batches(files, problems, None if meta_only else serving):
        batches += 1
        last = b.info
        inflight = b.inflight  # the set at the last tick written
        n = len(b.events)
        if n:
            if first_id < 0:
                first_id = int(b.info["first_event_id"])
            if not meta_only and (not lean or rows * EVENT_DTYPE.itemsize < _LEAN_HOLD):
                events.append(b.events)  # (lean: a small rank's rows, one pass below)
            if b.side:
                _side(b.side, int(b.info["first_event_id"]), rows, errors, metadata)
            rows += n
        if len(b.spans):
            spans.append(b.spans)
        if len(b.memory):
            memory.append(b.memory)
    if meta_only:
        ev = _empty(EVENT_DTYPE)
    elif lean:
        groups = raw.get("groups") if isinstance(raw.get("groups"), list) else []

        def chunks() -> Iterator[np.ndarray]:
            if sum(map(len, events)) == rows:  # held: one chunk, the files not read again
                yield join_rows(events, EVENT_DTYPE) if len(events) != 1 else events[0]
                return
            for b in iter_batches(files):
                if len(b.events):
                    yield b.events

        ev = lean_events(chunks, groups or [], sample_limit)
    else:
        ev = join_rows(events, EVENT_DTYPE)
    total = int(meta.total_events if meta.total_events is not None else rows)
    changes: dict[str, Any] = {
        "first_event_id": max(first_id, 0),
        "retained_events": rows,
        "evicted_events": max(0, total - rows),
        "errors": errors,
        "metadata": metadata,
    }
    if meta.rank is None:
        m = RANK_DIR_RE.match(path.name)
        changes["rank"] = int(m.group(1)) if m else -1
    st = meta.storage
    if meta.exit is None and meta.recovered is None and (st is None or not st.closed_ns):
        # the process died without its final write (or is still running): its data is
        # complete up to its last batch
        tick = int(last["t_ns"]) if last is not None else int(meta.exported_ns or 0)
        step = int(last["step"]) if last is not None else meta.current_step
        step_ns = int(last["step_ns"]) if last is not None else None
        cursor = read_cursor(files)
        if cursor is not None and cursor[1] >= (step_ns or 0):
            step, step_ns = cursor  # a step begun after the last batch
        changes["recovered"] = Recovered(
            from_dir="segments",
            tick_ns=tick,
            step=step,
            step_ns=step_ns,
            pid=meta.pid,
            ticks=batches,
        )
    if problems:
        changes["segment_problems"] = problems
    meta = meta.updated(**changes)
    rank = int(meta.rank if meta.rank is not None else -1)
    return RankData(
        rank=rank,
        events=ev,
        spans=join_rows(spans, SPAN_DTYPE),
        memory=join_rows(memory, MEMORY_DTYPE),
        meta=meta,
        file_events=rows,
        steps=read_step_totals(files),
        inflight=np.array(inflight),
        requests=join_rows([c.requests for c in serving if len(c.requests)], REQUEST_DTYPE),
        tokens=join_rows([c.tokens for c in serving if len(c.tokens)], TOKEN_DTYPE),
        request_traces=join_rows([c.traces for c in serving if len(c.traces)], REQUEST_TRACE_DTYPE),
    )


def _side(
    text: bytes, first_id: int, row0: int, errors: dict[str, str], metadata: dict[str, Any]
) -> None:
    """A batch's side table, keyed by event id, re-keyed by row index (as strings)."""
    try:
        side = json.loads(text)
    except (ValueError, RecursionError):
        return
    if not isinstance(side, dict):
        return
    for key, out in (("errors", errors), ("metadata", metadata)):
        table = side.get(key)
        if isinstance(table, dict):
            for k, v in table.items():
                if str(k).lstrip("-").isdigit():
                    out[str(int(k) - first_id + row0)] = v


def finalize_rank_dirs(
    run_dir: str | Path,
    exits: dict[int, ExitStatus] | None = None,
    node_id: str | None = None,
    pids: dict[int, int] | None = None,
) -> list[int]:
    """The launcher's finish step for the ranks that died without their final write: each
    rank folder whose newest meta has no exit and was not closed gets ``recovered`` (from its
    last batch) and ``exits[rank]`` (the exit torchrun saw) written into that meta. Only ranks
    of the launcher ``node_id`` when given; with ``pids`` (rank -> the pid the exit belongs to)
    an exit is applied only to that process (a restarted worker does not get its
    predecessor's). Returns the ranks whose meta was completed."""
    done: list[int] = []
    for r, path in rank_entries(run_dir):
        files = scan_rank_dir(path) if path.is_dir() else None
        if files is None or files.meta is None:
            continue
        try:
            raw = json.loads(files.meta.read_text(encoding="utf-8"))
            closed = isinstance(raw, dict) and (raw.get("storage") or {}).get("closed_ns")
            if not isinstance(raw, dict) or raw.get("exit") is not None or closed:
                continue  # it ended by itself (no segment is read)
            rd = load_rank_dir(path)
        except (OSError, ValueError, AttributeError, MeshprofError):
            continue
        m = rd.meta
        if m.exit is not None or m.recovered is None:
            continue
        if node_id and m.node_id and m.node_id != node_id:
            continue
        ex = launcher_exit(exits, pids, r, m.pid)
        try:
            raw["recovered"] = m.recovered.to_dict()
            if ex is not None:
                raw["exit"] = ex.to_dict()
            atomic_write_text(files.meta, json.dumps(raw, default=str))
        except OSError:
            continue
        done.append(r)
    return done


__all__ = ["finalize_rank_dirs", "load_rank_dir"]

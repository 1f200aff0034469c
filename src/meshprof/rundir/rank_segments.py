"""Writing a whole rank's recording as segments at once (:func:`write_rank_segments`), the way
the rank writer (:class:`~meshprof.rundir.writer.RankWriter`) would have appended it over the
run: for tools that make or convert runs (the synthetic runs of ``benchmarks/``, tests), so
that what they write is the format a real run leaves, read by the same reader."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from meshprof.rundir.rankfile import RankData
from meshprof.rundir.schema import RANK_FORMAT, ExitStatus
from meshprof.rundir.segment_writer import SegmentWriter, StorageLimits
from meshprof.rundir.segments import BATCH_DTYPE, batch_payload
from meshprof.rundir.step_totals import StepTotals

_TOOL_LIMITS = StorageLimits(max_disk_bytes=0, segment_s=0.0, reserve_bytes=0, fsync=False)
"""No retention, no rotation by age, no reserve, no fsync: a tool writes the run whole."""


def write_rank_segments(
    run_dir: str | os.PathLike[str],
    data: RankData,
    *,
    run_id: str | None = None,
    limits: StorageLimits | None = None,
) -> Path:
    """Write ``data`` (events, spans, memory, meta) as one generation of rank ``data.rank``'s
    folder: one batch per step (its events in their order, its spans and memory samples; the
    rows of step -1 first), the per-step totals, and the final meta (``exit`` normal unless
    the meta says otherwise, the ``storage`` record). ``errors``/``metadata`` keyed by row
    index go to the batches' side tables. Returns the rank folder; an error of the file system
    raises ``OSError``."""
    store = SegmentWriter(run_dir, data.rank, limits or _TOOL_LIMITS, run_id)
    ev, sp, mem = data.events, data.spans, data.memory
    order = np.argsort(ev["step"], kind="stable")
    identity = bool((order == np.arange(len(ev))).all())
    if not identity:
        ev = ev[order]
    new_row = np.empty(len(order), np.int64)
    new_row[order] = np.arange(len(order))
    side_of: dict[int, dict[str, dict[str, object]]] = {}
    for key, table in (("errors", data.meta.errors), ("metadata", data.meta.metadata)):
        for row, value in (table or {}).items():
            i = int(new_row[int(row)])
            side_of.setdefault(i, {"errors": {}, "metadata": {}})[key][str(i)] = value
    steps = np.unique(np.concatenate([ev["step"], sp["step"], mem["step"]]).astype(np.int64))
    ev_at = np.searchsorted(ev["step"], steps, side="left")
    ev_end = np.searchsorted(ev["step"], steps, side="right")
    sp_order = np.argsort(sp["step"], kind="stable")
    sp = sp[sp_order]
    mem = mem[np.argsort(mem["step"], kind="stable")]
    sp_at, sp_end = np.searchsorted(sp["step"], steps), np.searchsorted(sp["step"], steps, "right")
    m_at, m_end = np.searchsorted(mem["step"], steps), np.searchsorted(mem["step"], steps, "right")
    totals = StepTotals()
    written = 0
    steps_written = 0
    step_ns = 0
    for i, s in enumerate(steps.tolist()):
        e = ev[ev_at[i] : ev_end[i]]
        p = sp[sp_at[i] : sp_end[i]]
        m = mem[m_at[i] : m_end[i]]
        begun = p["start_ns"][p["kind"] == 0]
        if len(begun):
            step_ns = int(begun.min())
        ends = [int((e["start_ns"] + np.maximum(e["duration_ns"], 0)).max())] if len(e) else []
        ends += [int((p["start_ns"] + p["duration_ns"]).max())] if len(p) else []
        ends += [int(m["t_ns"].max())] if len(m) else []
        t_ns = max(ends, default=step_ns)
        side = b""
        first = int(ev_at[i])
        if side_of and len(e):
            got = [side_of[j] for j in range(first, first + len(e)) if j in side_of]
            if got:
                merged: dict[str, dict[str, object]] = {"errors": {}, "metadata": {}}
                for d in got:
                    merged["errors"].update(d["errors"])
                    merged["metadata"].update(d["metadata"])
                side = json.dumps(merged, default=str).encode("utf-8")
        batch = np.zeros(1, BATCH_DTYPE)
        batch[0] = (t_ns, first, step_ns, s, len(e), len(p), len(m), len(side), 0, 0)
        payload = batch_payload(batch, e, p, m, side)
        if not store.append_batch(payload, len(e), len(p), t_ns, (s, step_ns)):
            break
        written += len(e)
    totals.add(ev[:written], sp, mem)  # (one call: the same totals as one per batch)
    rows = totals.ready(final=True)
    if len(rows) and store.append_steps(rows.tobytes()):
        steps_written = len(rows)
    store.close()
    if store.stopped:
        raise OSError(f"{store.dir}: writing stopped ({store.error or store.stopped})")
    meta = data.meta.updated(
        format=data.meta.format or RANK_FORMAT,
        rank=data.rank,
        total_events=data.meta.total_events if data.meta.total_events is not None else len(ev),
        current_step=int(steps[-1]) if len(steps) else -1,
        run_id=run_id if run_id is not None else data.meta.run_id,
        storage=store.info(written, steps_written, 0),
        exit=data.meta.exit or ExitStatus(how="normal", code=0),
        errors={},
        metadata={},
    )
    if store.write_meta(json.dumps(meta.to_dict(), default=str)) is None:
        raise OSError(f"{store.dir}: the meta could not be written ({store.error})")
    return store.dir


__all__ = ["write_rank_segments"]

"""A run as Arrow tables (and Parquet files), for engines that scale past one machine.

Six tables, one file each (``DIR/<name>.parquet``):

- ``events``: one row per recorded event of every loaded rank (all statuses): ``rank``,
  ``index`` (row in the rank file), ``op``, ``status``, ``group_name``, ``group_desc``,
  ``dimension`` ("dp", "tp", "pp", "world", ...), ``group_size``, ``seq``, ``peer`` (-1 for
  collectives), ``in_bytes``, ``out_bytes``, ``size_bytes`` (nccl-tests S), ``start_ns`` (the
  rank's clock), ``aligned_start_ns`` and ``aligned_end_ns`` (rank 0's clock, see
  :mod:`meshprof.analyze.run.events.clock`), ``duration_ns`` (null while pending), ``step``, ``flags``,
  ``wait_ns`` (time waited for the last member, null when not matched; see
  :mod:`meshprof.analyze.run.events.match`);
- ``spans``: steps and phases: ``rank``, ``kind``, ``name``, ``status``, ``depth``, ``step``,
  ``start_ns``, ``aligned_start_ns``, ``duration_ns``, ``tokens``, ``samples``, ``cpu_ns``;
- ``memory``: one sample per step: ``rank``, ``step``, ``t_ns``, ``aligned_t_ns``,
  ``allocated``, ``reserved``, ``peak``, ``rss``, ``capacity`` (bytes; -1 when not available);
- ``steps``: each rank's per-step totals, kept for the whole run even where the detailed rows
  were rotated out (segment storage; empty for rank files of older versions): ``rank``,
  ``step``, ``start_ns``, ``aligned_start_ns``, ``duration_ns``, ``collectives``, ``comm_ns``
  (the sum of the step's collectives' durations), ``comm_bytes``, ``tokens``, ``memory_peak``;
- ``groups``: ``name``, ``desc``, ``dimension``, ``size``, ``ranks`` (list of global ranks);
- ``ranks``: ``rank``, ``host``, ``loaded``, ``problem``, ``clock_offset_ns``,
  ``clock_uncertainty_ns``, ``clock_method``, ``events``, ``steps``.

Times are integers in ns. Needs the ``parquet`` extra (pyarrow). The aligned times and waits
come from the report's stages (the event table, clock alignment and match of
:mod:`meshprof.report.stages.matching`), which :func:`run_tables` takes as arguments;
:func:`export_tables` runs just those stages.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from meshprof.errors import MeshprofError
from meshprof.events import (
    OP_CODES,
    SPAN_KINDS,
    STATUS_CODES,
    nccl_tests_size_array,
)
from meshprof.layout import dimension_of
from meshprof.rundir.atomic import atomic_write_bytes
from meshprof.rundir.loader import LoadedRun

if TYPE_CHECKING:
    from meshprof.analyze.run.events.clock import ClockAlignment
    from meshprof.analyze.run.events.match import CollectiveMatch
    from meshprof.analyze.run.events.table import EventTable

TABLES = ("events", "spans", "memory", "groups", "ranks", "steps")
OPTIONAL_TABLES = frozenset({"steps"})
"""Tables an export folder of an older version does not have."""


def require_pyarrow() -> Any:
    """The pyarrow module, or a :class:`MeshprofError` naming the extra to install."""
    try:
        import pyarrow as pa  # (not pyarrow.parquet: it imports pandas, 1-2 s; only writing
        # needs it, write_parquet imports it)
    except ImportError:
        raise MeshprofError(
            "this needs pyarrow: pip install 'meshprof[parquet]' (or pip install pyarrow)"
        ) from None
    return pa


def _dict_array(pa: Any, codes: np.ndarray, names: list[str]) -> Any:
    return pa.DictionaryArray.from_arrays(
        pa.array(codes.astype(np.int32, copy=False)), pa.array(names, type=pa.string())
    )


def export_tables(run: LoadedRun) -> dict[str, Any]:
    """The tables of a loaded run, with the event table, clock alignment and match they
    need computed here (``pyarrow.Table`` each; see the module docstring)."""
    from meshprof.report.executor import run_stages
    from meshprof.report.stages import REPORT_STAGES
    from meshprof.report.stages.matching import CLOCK, MATCH, TABLE

    require_pyarrow()  # before the analysis: a missing extra fails at once
    got = run_stages(run, REPORT_STAGES, only=(TABLE.name, CLOCK.name, MATCH.name))
    return run_tables(run, got[TABLE.name], got[CLOCK.name], got[MATCH.name])


def run_tables(
    run: LoadedRun, table: EventTable, clock: ClockAlignment, m: CollectiveMatch
) -> dict[str, Any]:
    """The tables of a loaded run (``pyarrow.Table`` each; see the module docstring), its
    aligned times and waits from ``table``, ``clock`` and ``m`` (computed from ``run``)."""
    from meshprof.analyze.compute.sorting import RowsByKey

    pa = require_pyarrow()
    wait_row = np.full(len(table), -1, dtype=np.int64)
    wait_row[m.member_row] = m.member_wait_ns
    by_rank = RowsByKey(table.rank)
    offsets = clock.offsets()

    # run-wide dictionaries: group names (with desc, dimension, members), op and status names
    gnames: list[str] = []
    ginfo: dict[str, tuple[str, str, tuple[int, ...]]] = {}
    op_names: list[str] = []
    op_index: dict[str, int] = {}
    statuses = sorted(STATUS_CODES, key=lambda s: STATUS_CODES[s])
    for r in sorted(run.ranks):
        rd = run.ranks[r]
        lay = run.layout_of(r)
        for g in rd.groups:
            name = str(g.name or "")
            if name not in ginfo:
                ranks = tuple(int(x) for x in g.ranks or ())
                desc = str(g.desc or "")
                ginfo[name] = (desc, dimension_of(ranks, lay, desc, g.mesh_dims or ()), ranks)
                gnames.append(name)
        for c in np.unique(rd.events["op"]).tolist():
            name = rd.op_name(int(c))
            if name not in op_index:
                op_index[name] = len(op_names)
                op_names.append(name)
    gcode = {n: i for i, n in enumerate(gnames)}
    gdesc = [ginfo[n][0] for n in gnames]
    gdim = [ginfo[n][1] for n in gnames]
    gsize_all = np.asarray([len(ginfo[n][2]) for n in gnames] or [0], dtype=np.int32)
    # descriptions and dimensions repeat: small dictionaries of their own
    desc_names = sorted(set(gdesc))
    dim_names = sorted(set(gdim))
    g_desc_code = np.asarray([desc_names.index(d) for d in gdesc] or [0], dtype=np.int32)
    g_dim_code = np.asarray([dim_names.index(d) for d in gdim] or [0], dtype=np.int32)

    batches = []
    spans, memory, steps, rank_rows = [], [], [], []
    for r in sorted(run.ranks):
        rd = run.ranks[r]
        ev = rd.events
        n = len(ev)
        off = int(offsets.get(r, 0))
        local = np.asarray([gcode[str(g.name or "")] for g in rd.groups] or [0], dtype=np.int32)
        gl = ev["group"].astype(np.int64)
        ok_g = gl < len(rd.groups)
        gid = np.where(ok_g, local[np.minimum(gl, len(local) - 1)], -1)
        omap = np.zeros(256, dtype=np.int32)
        ocode = np.zeros(256, dtype=np.int64)
        for c in np.unique(ev["op"]).tolist():
            name = rd.op_name(int(c))
            omap[c] = op_index[name]
            ocode[c] = OP_CODES.get(name, OP_CODES["custom"])
        gsize = np.where(gid >= 0, gsize_all[np.maximum(gid, 0)], 0).astype(np.int32)
        size = nccl_tests_size_array(ocode[ev["op"]], ev["in_bytes"], ev["out_bytes"], gsize)
        start = ev["start_ns"].astype(np.int64)
        dur = ev["duration_ns"].astype(np.int64)
        done = dur >= 0
        wait = np.full(n, -1, dtype=np.int64)
        rows = by_rank.rows(r)
        wait[table.index[rows]] = wait_row[rows]
        gid_safe = np.maximum(gid, 0)
        batches.append(
            pa.record_batch(
                {
                    "rank": pa.array(np.full(n, r, dtype=np.int32)),
                    "index": pa.array(np.arange(n, dtype=np.int32)),
                    "op": _dict_array(pa, omap[ev["op"]], op_names),
                    "status": _dict_array(
                        pa, np.minimum(ev["status"], len(statuses) - 1), statuses
                    ),
                    "group_name": pa.DictionaryArray.from_arrays(
                        pa.array(gid.astype(np.int32), mask=gid < 0),
                        pa.array(gnames, type=pa.string()),
                    ),
                    "group_desc": _dict_array(pa, g_desc_code[gid_safe], desc_names),
                    "dimension": _dict_array(pa, g_dim_code[gid_safe], dim_names),
                    "group_size": pa.array(gsize),
                    "seq": pa.array(ev["seq"].astype(np.int64)),
                    "peer": pa.array(ev["peer"].astype(np.int32)),
                    "in_bytes": pa.array(ev["in_bytes"].astype(np.int64)),
                    "out_bytes": pa.array(ev["out_bytes"].astype(np.int64)),
                    "size_bytes": pa.array(size.astype(np.int64)),
                    "start_ns": pa.array(start),
                    "aligned_start_ns": pa.array(start + off),
                    "aligned_end_ns": pa.array(start + off + dur, mask=~done),
                    "duration_ns": pa.array(dur, mask=~done),
                    "step": pa.array(ev["step"].astype(np.int32)),
                    "flags": pa.array(ev["flags"].astype(np.uint8)),
                    "wait_ns": pa.array(wait, mask=wait < 0),
                }
            )
        )
        sp = rd.spans
        names = rd.span_names
        sn = (
            [names[i] if i < len(names) else f"#{i}" for i in range(int(sp["name"].max()) + 1)]
            if len(sp)
            else []
        )
        spans.append(
            {
                "rank": np.full(len(sp), r, dtype=np.int32),
                "kind": [
                    SPAN_KINDS[k] if k < len(SPAN_KINDS) else str(k) for k in sp["kind"].tolist()
                ],
                "name": [sn[i] for i in sp["name"].tolist()],
                "status": [statuses[min(s, len(statuses) - 1)] for s in sp["status"].tolist()],
                "depth": sp["depth"].astype(np.int32),
                "step": sp["step"].astype(np.int32),
                "start_ns": sp["start_ns"].astype(np.int64),
                "aligned_start_ns": sp["start_ns"].astype(np.int64) + off,
                "duration_ns": sp["duration_ns"].astype(np.int64),
                "tokens": sp["tokens"].astype(np.int64),
                "samples": sp["samples"].astype(np.int64),
                "cpu_ns": sp["cpu_ns"].astype(np.int64),
            }
        )
        memory.append(
            _timed_rows(
                rd.memory, r, off, "t_ns", ("allocated", "reserved", "peak", "rss", "capacity")
            )
        )
        steps.append(
            _timed_rows(
                rd.steps,
                r,
                off,
                "start_ns",
                ("duration_ns", "collectives", "comm_ns", "comm_bytes", "tokens", "memory_peak"),
            )
        )
        rank_rows.append(r)
    events = pa.Table.from_batches(batches) if batches else pa.table({})

    def concat(parts: list[dict[str, Any]]) -> Any:
        if not parts:
            return pa.table({})
        cols = {}
        for k in parts[0]:
            vals = [p[k] for p in parts]
            if isinstance(vals[0], list):
                cols[k] = pa.array(
                    [x for v in vals for x in v], type=pa.string()
                ).dictionary_encode()
            else:
                cols[k] = pa.array(np.concatenate(vals))
        return pa.table(cols)

    clock_of = {c.rank: c for c in clock.ranks}
    ev_count = {r: by_rank.count(r) for r in run.ranks}
    entries = {e.first: e for e in run.problems.entries()}  # (missing ranks: one row a span)
    all_ranks = sorted(set(run.ranks) | set(entries))
    ranks_t = pa.table(
        {
            "rank": pa.array(all_ranks, type=pa.int32()),
            "last_rank": pa.array(
                [entries[r].last if r in entries and r not in run.ranks else r for r in all_ranks],
                type=pa.int32(),
            ),
            "host": pa.array(
                [
                    str(run.ranks[r].meta.hostname or "") if r in run.ranks else None
                    for r in all_ranks
                ],
                type=pa.string(),
            ),
            "loaded": pa.array([r in run.ranks for r in all_ranks]),
            "problem": pa.array(
                [entries[r].reason if r in entries else None for r in all_ranks], type=pa.string()
            ),
            "clock_offset_ns": pa.array(
                [clock_of[r].offset_ns if r in clock_of else None for r in all_ranks],
                type=pa.int64(),
            ),
            "clock_uncertainty_ns": pa.array(
                [clock_of[r].uncertainty_ns if r in clock_of else None for r in all_ranks],
                type=pa.int64(),
            ),
            "clock_method": pa.array(
                [clock_of[r].method if r in clock_of else None for r in all_ranks], type=pa.string()
            ),
            "events": pa.array([ev_count.get(r, 0) for r in all_ranks], type=pa.int64()),
            "steps": pa.array(
                [
                    int((run.ranks[r].spans["kind"] == 0).sum()) if r in run.ranks else 0
                    for r in all_ranks
                ],
                type=pa.int64(),
            ),
        }
    )
    groups_t = pa.table(
        {
            "name": pa.array(gnames, type=pa.string()),
            "desc": pa.array(gdesc, type=pa.string()),
            "dimension": pa.array(gdim, type=pa.string()),
            "size": pa.array([len(ginfo[n][2]) for n in gnames], type=pa.int32()),
            "ranks": pa.array([list(ginfo[n][2]) for n in gnames], type=pa.list_(pa.int32())),
        }
    )
    return {
        "events": events,
        "spans": concat(spans),
        "memory": concat(memory),
        "groups": groups_t,
        "ranks": ranks_t,
        "steps": concat(steps),
    }


def write_parquet(tables: dict[str, Any], out_dir: Path) -> list[Path]:
    """Write each table to ``out_dir/<name>.parquet`` (zstd; atomically, file by file)."""
    require_pyarrow()
    import pyarrow as pa
    import pyarrow.parquet as pq

    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise MeshprofError(f"{out_dir}: not a directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, t in tables.items():
        sink = pa.BufferOutputStream()
        pq.write_table(t, sink, compression="zstd")
        paths.append(atomic_write_bytes(out_dir / f"{name}.parquet", sink.getvalue().to_pybytes()))
    return paths


def _timed_rows(
    a: np.ndarray, rank: int, off: int, time_col: str, cols: tuple[str, ...]
) -> dict[str, Any]:
    """One rank's rows of a table with a time column: rank, step, the time as recorded and
    on the aligned clock (+ ``off`` ns), then ``cols`` as int64."""
    t = a[time_col].astype(np.int64)
    return (
        {"rank": np.full(len(a), rank, dtype=np.int32), "step": a["step"].astype(np.int32)}
        | {time_col: t, f"aligned_{time_col}": t + off}
        | {k: a[k].astype(np.int64) for k in cols}
    )

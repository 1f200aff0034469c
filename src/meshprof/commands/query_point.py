"""The rows ``meshprof query DIR --rank R [--step S]`` prints without SQL, read from the rank's
own folder with numpy alone.

The export's tables (:mod:`meshprof.render.parquet`) need pyarrow, which imports pandas on its
first numpy conversion, and the report's table, clock and match stages: together ~0.7 s of
imports before the first row, for a question answered from one rank folder in ~15 ms. These
rows are the same columns of the same tables (:data:`POINT_COLUMNS`): each step's totals
(``steps``), then the rank's collectives in its own order (``events``; ``index`` is the row's
position among the rank's events, ``duration_ns`` None while in flight).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from meshprof.errors import MeshprofError
from meshprof.events import STATUS_CODES
from meshprof.layout import dimension_of
from meshprof.rundir.loader import LoadedRun

POINT_COLUMNS = {
    "steps": (
        "rank", "step", "duration_ns", "collectives", "comm_ns", "comm_bytes", "tokens",
        "memory_peak", "start_ns",
    ),
    "events": (
        "rank", "step", "index", "op", "status", "group_name", "dimension", "seq", "peer",
        "in_bytes", "out_bytes", "start_ns", "duration_ns",
    ),
}  # fmt: skip
"""What ``--rank`` prints without SQL: each step's totals, then the events (in the rank's
order)."""

Rows = tuple[list[str], list[tuple[Any, ...]]]


def point_rows(run: LoadedRun, ranks: tuple[int, ...], step: int | None) -> dict[str, Rows]:
    """``{"steps": (columns, rows), "events": (columns, rows)}`` of ``ranks`` (loaded in
    ``run``), only ``step``'s rows when it is given; raises :class:`MeshprofError` for a step
    the first rank did not record."""
    statuses = sorted(STATUS_CODES, key=lambda s: STATUS_CODES[s])
    steps: list[tuple[Any, ...]] = []
    events: list[tuple[Any, ...]] = []
    for r in ranks:
        rd = run.ranks[r]
        st = rd.steps
        if step is not None and r == ranks[0] and len(st) and not (st["step"] == step).any():
            lo, hi = int(st["step"].min()), int(st["step"].max())
            raise MeshprofError(f"step {step}: not recorded by rank {r} (its steps: {lo}-{hi})")
        keep = st["step"] == step if step is not None else np.ones(len(st), dtype=bool)
        for row in st[keep]:
            steps.append((r, int(row["step"]), *(int(row[k]) for k in POINT_COLUMNS["steps"][2:])))
        lay = run.layout_of(r)
        groups: list[tuple[str | None, str]] = []
        for g in rd.groups:
            desc = str(g.desc or "")
            dim = dimension_of(g.ranks or (), lay, desc, g.mesh_dims or ())
            groups.append((str(g.name or ""), dim))
        ev = rd.events
        idx = np.flatnonzero(ev["step"] == step) if step is not None else np.arange(len(ev))
        ops: dict[int, str] = {}
        for i in idx.tolist():
            e = ev[i]
            code = int(e["op"])
            op = ops.get(code)
            if op is None:
                op = ops[code] = rd.op_name(code)
            gi = int(e["group"])
            name, dim = groups[gi] if 0 <= gi < len(groups) else (None, "")
            dur = int(e["duration_ns"])
            events.append(
                (r, int(e["step"]), i, op, statuses[min(int(e["status"]), len(statuses) - 1)],
                 name, dim, int(e["seq"]), int(e["peer"]), int(e["in_bytes"]),
                 int(e["out_bytes"]), int(e["start_ns"]), dur if dur >= 0 else None)
            )  # fmt: skip
    return {
        "steps": (list(POINT_COLUMNS["steps"]), steps),
        "events": (list(POINT_COLUMNS["events"]), events),
    }

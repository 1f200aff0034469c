"""One flat table of every completed event of every loaded rank, with run-wide group codes.

The analyzers (clock alignment, matching, stragglers) all start from this table: rank files name
groups by a per-rank code, here every group gets one code for the whole run (by group name), and
each group gets its parallelism dimension.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from meshprof.events import OP_CODES, STATUS_CODES, nccl_tests_size_array
from meshprof.layout import dimension_of
from meshprof.rundir import LoadedRun, resolve_layout

_SIZE_TIMES_N = [
    OP_CODES[o] for o in ("gather", "gather_object", "scatter", "scatter_object_list")
]  # ops whose nccl-tests size is not max(in, out) (see events.nccl_tests_size)
_BLOCK = 1 << 16  # rows copied at a time (54 B each: a few MB, cache-sized)


@dataclass(frozen=True, slots=True)
class GroupRef:
    """A process group of the run."""

    name: str
    """The group's name, unique in the job (the matching key)."""
    desc: str
    """Human description, e.g. "default_pg" or "mesh_tp"."""
    ranks: tuple[int, ...]
    """Global ranks of the members."""
    dimension: str
    """Parallelism dimension: "dp", "tp", "pp", "world", a "+"-joined mix ("dp+tp"), or
    "other" (see :func:`meshprof.layout.dimension_of`)."""


@dataclass(frozen=True, slots=True)
class EventTable:
    """Every completed (status ok, duration known) event of every loaded rank, as columns.

    Times are each rank's own wall clock in ns (not aligned). ``gid`` indexes :attr:`groups`,
    ``op`` indexes :attr:`ops`."""

    groups: tuple[GroupRef, ...]
    """Run-wide group table."""
    ops: tuple[str, ...]
    """Op-name table."""
    rank: np.ndarray
    """int32: the rank that recorded the row."""
    gid: np.ndarray
    """int32: run-wide group code."""
    op: np.ndarray
    """int32: index into :attr:`ops`."""
    seq: np.ndarray
    """int64: sequence number in the group (per (pair, direction) for send/recv)."""
    peer: np.ndarray
    """int32: global peer rank for send/recv, -1 for collectives."""
    start_ns: np.ndarray
    """int64: issue time, the rank's wall clock."""
    duration_ns: np.ndarray
    """int64: issue → completion."""
    size_bytes: np.ndarray
    """int64: nccl-tests buffer size S."""
    group_size: np.ndarray
    """int32: members of the group."""
    index: np.ndarray
    """int32: row in the rank's own events array."""

    @property
    def end_ns(self) -> np.ndarray:
        return self.start_ns + self.duration_ns

    def __len__(self) -> int:
        return len(self.rank)


def build_event_table(
    run: LoadedRun, *, after_rank: Callable[[int], None] | None = None
) -> EventTable:
    """Flatten the loaded ranks' events into one :class:`EventTable` (pending and failed events
    are left out: they have no completion time).

    ``after_rank(r)`` is called once rank r's rows are copied and no longer referenced here:
    a caller that needs nothing else from the raw rows (54 B each) can let them go then, so
    they and the table (56 B per row) are never both held for the whole run."""
    groups: list[GroupRef] = []
    gindex: dict[str, int] = {}
    ops: list[str] = []
    oindex: dict[str, int] = {}
    # first pass: group and op tables, the rows kept per rank; second: fill preallocated columns
    kept: list[tuple[int, np.ndarray, np.ndarray | None, np.ndarray, np.ndarray, np.ndarray]] = []
    for r in sorted(run.ranks):
        rd = run.ranks[r]
        layout = resolve_layout(rd.meta, run.manifest)
        gmap = []
        for g in rd.groups:
            name = str(g.get("name", ""))
            if name not in gindex:
                ranks = tuple(int(x) for x in g.get("ranks", ()))
                desc = str(g.get("desc", ""))
                gindex[name] = len(groups)
                groups.append(GroupRef(name, desc, ranks, dimension_of(ranks, layout, desc)))
            gmap.append(gindex[name])
        ev = rd.events
        keep = (
            (ev["status"] == STATUS_CODES["ok"])
            & (ev["duration_ns"] >= 0)
            & (ev["group"] < len(gmap))
        )
        idx = None if keep.all() else np.flatnonzero(keep)
        op_raw = ev["op"] if idx is None else ev["op"][idx]
        omap = np.zeros(256, dtype=np.int32)
        size_code = np.zeros(256, dtype=np.int64)
        # (op codes are uint8: a bincount is a quarter of np.unique's cost, once per rank)
        for c in np.flatnonzero(np.bincount(op_raw, minlength=256)).tolist():
            name = rd.op_name(int(c))
            if name not in oindex:
                oindex[name] = len(ops)
                ops.append(name)
            omap[c] = oindex[name]
            size_code[c] = _op_code(name)
        gm = np.asarray(gmap or [0], dtype=np.int32)
        kept.append((r, ev, idx, omap[op_raw], gm, size_code[op_raw]))
    n = sum(len(k[3]) for k in kept)
    kept.reverse()  # popped in rank order below, so each rank's raw rows can be let go
    out: dict[str, np.ndarray] = {
        "rank": np.empty(n, dtype=np.int32),
        "gid": np.empty(n, dtype=np.int32),
        "op": np.empty(n, dtype=np.int32),
        "seq": np.empty(n, dtype=np.int64),
        "peer": np.empty(n, dtype=np.int32),
        "start": np.empty(n, dtype=np.int64),
        "dur": np.empty(n, dtype=np.int64),
        "size": np.empty(n, dtype=np.int64),
        "gsize": np.empty(n, dtype=np.int32),
        "index": np.empty(n, dtype=np.int32),
    }
    sizes = np.asarray([len(g.ranks) for g in groups] or [0], dtype=np.int32)
    fields = (("seq", "seq"), ("peer", "peer"), ("start", "start_ns"), ("dur", "duration_ns"))
    lo = 0
    while kept:
        r, ev, idx, op, gm, code = kept.pop()
        hi = lo + len(op)
        plain = not np.isin(code, _SIZE_TIMES_N).any()
        out["rank"][lo:hi] = r
        out["op"][lo:hi] = op
        out["index"][lo:hi] = np.arange(len(op)) if idx is None else idx
        # rows in blocks that stay in cache while every column is copied out of them
        for b0 in range(0, len(op), _BLOCK):
            b1 = min(b0 + _BLOCK, len(op))
            blk = ev[b0:b1] if idx is None else ev[idx[b0:b1]]
            o0, o1 = lo + b0, lo + b1
            for dst, src in fields:
                out[dst][o0:o1] = blk[src]
            gid = gm[blk["group"]]
            out["gid"][o0:o1] = gid
            gsize = sizes[gid]
            out["gsize"][o0:o1] = gsize
            if plain:  # no gather/scatter-like op on this rank: S = max(in, out)
                np.maximum(blk["in_bytes"], blk["out_bytes"], out=out["size"][o0:o1])
            else:
                out["size"][o0:o1] = nccl_tests_size_array(
                    code[b0:b1], blk["in_bytes"], blk["out_bytes"], gsize
                )
        lo = hi
        del ev, idx
        if after_rank is not None:
            after_rank(r)
    return EventTable(
        groups=tuple(groups),
        ops=tuple(ops),
        rank=out["rank"],
        gid=out["gid"],
        op=out["op"],
        seq=out["seq"],
        peer=out["peer"],
        start_ns=out["start"],
        duration_ns=out["dur"],
        size_bytes=out["size"],
        group_size=out["gsize"],
        index=out["index"],
    )


def _op_code(name: str) -> int:
    from meshprof.events import OP_CODES

    return OP_CODES.get(name, OP_CODES["custom"])

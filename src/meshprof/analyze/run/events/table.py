"""One flat table of every completed event of every loaded rank, with run-wide group codes.

The analyzers (clock alignment, matching, stragglers) all start from this table: rank files name
groups by a per-rank code, here every group gets one code for the whole run (by group name), and
each group gets its parallelism dimension.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from meshprof.events import (
    FLAG_ASYNC,
    FLAG_DEVICE_TIMING,
    OP_CODES,
    STATUS_CODES,
    nccl_tests_size_array,
)
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
    ``op`` indexes :attr:`ops`. Integer columns use the narrowest of the dtypes named that holds
    this run's values (27 B per row for most runs, 56 B at most): read them as integers, not as
    a fixed dtype."""

    groups: tuple[GroupRef, ...]
    """Run-wide group table."""
    ops: tuple[str, ...]
    """Op-name table."""
    rank: np.ndarray
    """int16 or int32: the rank that recorded the row (ascending)."""
    gid: np.ndarray
    """int16 or int32: run-wide group code."""
    op: np.ndarray
    """uint8 or int32: index into :attr:`ops`."""
    seq: np.ndarray
    """int32 or int64: sequence number in the group (per (pair, direction) for send/recv)."""
    peer: np.ndarray
    """int16 or int32: global peer rank for send/recv, -1 for collectives."""
    start_ns: np.ndarray
    """int64: issue time, the rank's wall clock."""
    duration_ns: np.ndarray
    """int32 or int64: issue → completion."""
    size_bytes: np.ndarray
    """int32 or int64: nccl-tests buffer size S."""
    is_async: np.ndarray | None = None
    """bool: the host did not wait for it at the call — issued async (``FLAG_ASYNC``:
    ``async_op=True``) or timed on the device (``FLAG_DEVICE_TIMING``: its completion is the
    device's, which the host ran ahead of); None when unknown. False, for a collective: its
    caller waited for it before its next call (the what-if relies on that: see
    :mod:`meshprof.analyze.run.replay.replay_repair`)."""
    kept_index: np.ndarray | None = None
    """int32: row in the rank's own events array; None when every rank's rows were all kept
    (:attr:`index` then derives it)."""
    sample_fraction: float = 1.0
    """Fraction of the collectives the table holds (1.0: all; below 1 when the run was loaded
    with a consistent (group, seq) sample, :mod:`meshprof.rundir.sampling`)."""

    @property
    def end_ns(self) -> np.ndarray:
        return self.start_ns + self.duration_ns

    @property
    def group_size(self) -> np.ndarray:
        """int32: members of each row's group (computed from :attr:`groups` on each call)."""
        return self.group_sizes()[self.gid]

    def group_sizes(self) -> np.ndarray:
        """int32 per group code: its members."""
        return np.asarray([len(g.ranks) for g in self.groups] or [0], dtype=np.int32)

    @property
    def index(self) -> np.ndarray:
        """int32: row in the rank's own events array."""
        if self.kept_index is not None:
            return self.kept_index
        first = np.searchsorted(self.rank, self.rank, side="left")
        return (np.arange(len(self.rank), dtype=np.int64) - first).astype(np.int32)

    def __len__(self) -> int:
        return len(self.rank)


def _narrow(lo: int, hi: int, *dtypes: type[np.integer]) -> np.dtype:
    """The first of ``dtypes`` that holds every value in [lo, hi] (the last one otherwise)."""
    for dt in dtypes:
        info = np.iinfo(dt)
        if info.min <= lo and hi <= info.max:
            return np.dtype(dt)
    return np.dtype(dtypes[-1])


def build_event_table(
    run: LoadedRun,
    *,
    after_rank: Callable[[int], None] | None = None,
    sample_fraction: float = 1.0,
) -> EventTable:
    """Flatten the loaded ranks' events into one :class:`EventTable` (pending and failed events
    are left out: they have no completion time).

    ``after_rank(r)`` is called once rank r's rows are copied and no longer referenced here:
    a caller that needs nothing else from the raw rows (54 B each) can let them go then, so
    they and the table (27–56 B per row) are never both held for the whole run.
    ``sample_fraction``: the fraction of collectives the loaded run holds (see
    :attr:`EventTable.sample_fraction`)."""
    groups: list[GroupRef] = []
    gindex: dict[str, int] = {}
    ops: list[str] = []
    oindex: dict[str, int] = {}
    # first pass: group and op tables, the rows kept per rank and each column's value range;
    # second: fill preallocated columns of the narrowest dtypes that hold those ranges
    kept: list[
        tuple[int, np.ndarray, np.ndarray | None, np.ndarray, np.ndarray, np.ndarray, int]
    ] = []
    big = np.iinfo(np.int64).max
    seq_lo, seq_hi, peer_lo, peer_hi, dur_hi, size_hi = big, -big, -1, -1, 0, 0
    for r in sorted(run.ranks):
        rd = run.ranks[r]
        layout = resolve_layout(rd.meta, run.manifest)
        gmap = []
        for g in rd.groups:
            name = str(g.name or "")
            if name not in gindex:
                ranks = tuple(int(x) for x in g.ranks or ())
                desc = str(g.desc or "")
                gindex[name] = len(groups)
                dim = dimension_of(ranks, layout, desc, g.mesh_dims or ())
                groups.append(GroupRef(name, desc, ranks, dim))
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
        if len(op_raw):
            lo_hi = {k: _range(ev[k], idx) for k in ("seq", "peer", "duration_ns")}
            seq_lo, seq_hi = min(seq_lo, lo_hi["seq"][0]), max(seq_hi, lo_hi["seq"][1])
            peer_lo, peer_hi = min(peer_lo, lo_hi["peer"][0]), max(peer_hi, lo_hi["peer"][1])
            dur_hi = max(dur_hi, lo_hi["duration_ns"][1])
            s_hi = max(_range(ev["in_bytes"], idx)[1], _range(ev["out_bytes"], idx)[1])
            if np.isin(size_code[op_raw], _SIZE_TIMES_N).any():  # S = in · n or out · n
                s_hi *= max((len(g.ranks or ()) for g in rd.groups), default=1)
            size_hi = max(size_hi, s_hi)
        # (the op maps, not the mapped columns: 12 B per row for the whole run otherwise)
        kept.append((r, ev, idx, omap, gm, size_code, len(op_raw)))
    n = sum(k[6] for k in kept)
    all_rows = all(k[2] is None for k in kept)
    i16, i32, i64 = np.int16, np.int32, np.int64
    out: dict[str, np.ndarray] = {
        "rank": np.empty(n, dtype=_narrow(0, max(run.ranks, default=0), i16, i32)),
        "gid": np.empty(n, dtype=_narrow(0, len(groups), i16, i32)),
        "op": np.empty(n, dtype=_narrow(0, len(ops), np.uint8, i32)),
        "seq": np.empty(n, dtype=_narrow(seq_lo if n else 0, seq_hi if n else 0, i32, i64)),
        "peer": np.empty(n, dtype=_narrow(peer_lo, peer_hi, i16, i32)),
        "start": np.empty(n, dtype=np.int64),
        "dur": np.empty(n, dtype=_narrow(0, dur_hi, i32, i64)),
        "size": np.empty(n, dtype=_narrow(0, size_hi, i32, i64)),
        "async": np.empty(n, dtype=bool),
    }
    index = None if all_rows else np.empty(n, dtype=np.int32)
    # (a lean load leaves the flags out: async unknown)
    has_flags = all("flags" in (k[1].dtype.names or ()) for k in kept)
    kept.reverse()  # popped in rank order below, so each rank's raw rows can be let go
    sizes = np.asarray([len(g.ranks) for g in groups] or [0], dtype=np.int32)
    fields = (("seq", "seq"), ("peer", "peer"), ("start", "start_ns"), ("dur", "duration_ns"))
    lo = 0
    while kept:
        r, ev, idx, omap, gm, size_code, rows = kept.pop()
        hi = lo + rows
        # (codes of ops absent on this rank are 0, all_reduce's)
        plain = not np.isin(size_code, _SIZE_TIMES_N).any()
        out["rank"][lo:hi] = r
        if index is not None:
            index[lo:hi] = np.arange(rows) if idx is None else idx
        # rows in blocks that stay in cache while every column is copied out of them
        for b0 in range(0, rows, _BLOCK):
            b1 = min(b0 + _BLOCK, rows)
            blk = ev[b0:b1] if idx is None else ev[idx[b0:b1]]
            o0, o1 = lo + b0, lo + b1
            for dst, src in fields:
                out[dst][o0:o1] = blk[src]
            out["op"][o0:o1] = omap[blk["op"]]
            if has_flags:
                np.not_equal(
                    blk["flags"] & (FLAG_ASYNC | FLAG_DEVICE_TIMING), 0, out=out["async"][o0:o1]
                )
            gid = gm[blk["group"]]
            out["gid"][o0:o1] = gid
            if plain:  # no gather/scatter-like op on this rank: S = max(in, out)
                out["size"][o0:o1] = np.maximum(blk["in_bytes"], blk["out_bytes"])
            else:
                out["size"][o0:o1] = nccl_tests_size_array(
                    size_code[blk["op"]], blk["in_bytes"], blk["out_bytes"], sizes[gid]
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
        is_async=out["async"] if has_flags else None,
        kept_index=index,
        sample_fraction=float(sample_fraction),
    )


def _range(col: np.ndarray, idx: np.ndarray | None) -> tuple[int, int]:
    """(min, max) of a raw column over the kept rows (all rows when ``idx`` is None), read in
    blocks (no full-length copy of a strided column)."""
    n = len(col) if idx is None else len(idx)
    lo, hi = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    for b0 in range(0, n, _BLOCK * 4):
        v = col[b0 : b0 + _BLOCK * 4] if idx is None else col[idx[b0 : b0 + _BLOCK * 4]]
        lo, hi = min(lo, int(v.min())), max(hi, int(v.max()))
    return lo, hi


def _op_code(name: str) -> int:
    from meshprof.events import OP_CODES

    return OP_CODES.get(name, OP_CODES["custom"])

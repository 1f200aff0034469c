"""One flat table of every completed event of every loaded rank, with run-wide group codes.

The analyzers (clock alignment, matching, stragglers) all start from this table: rank files name
groups by a per-rank code, here every group gets one code for the whole run (by group name), and
each group gets its parallelism dimension.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshprof.events import STATUS_CODES, nccl_tests_size_array
from meshprof.rundir import LoadedRun

DIMENSIONS = ("dp", "tp", "pp", "other")


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
    """Parallelism dimension: "dp", "tp", "pp", a "+"-joined mix ("dp+tp"), or "other"."""


def _coords(rank: int, dp: int, tp: int, pp: int) -> tuple[int, int, int]:
    # rank = dp_rank * tp * pp + tp_rank * pp + pp_rank
    return rank // (tp * pp), (rank // pp) % tp, rank % pp


def dimension_of(desc: str, ranks: tuple[int, ...], layout: dict | None) -> str:
    """The dimension a group spans.

    With a layout ``{"dp", "tp", "pp"}`` the group's members are placed by
    rank = dp_rank·tp·pp + tp_rank·pp + pp_rank and the dimension is the coordinate(s) that vary
    among them (computed here, independent of :mod:`meshprof.parallel`). Without a layout the group
    description decides ("mesh_dp" → "dp"); anything else is "other".
    """
    if layout:
        try:
            dp, tp, pp = (max(int(layout.get(k, 1)), 1) for k in ("dp", "tp", "pp"))
            if dp * tp * pp >= max(ranks, default=0) + 1 and len(ranks) > 1:
                cs = [_coords(r, dp, tp, pp) for r in ranks]
                varying = [
                    n for i, n in enumerate(("dp", "tp", "pp")) if len({c[i] for c in cs}) > 1
                ]
                return "+".join(varying) if varying else "other"
        except (TypeError, ValueError):
            pass
    d = desc.lower()
    for dim in ("dp", "tp", "pp"):
        if d == dim or d.endswith("_" + dim) or f"_{dim}_" in d or d.startswith(dim + "_"):
            return dim
    return "other"


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
    """int64: row in the rank's own events array."""

    @property
    def end_ns(self) -> np.ndarray:
        return self.start_ns + self.duration_ns

    def __len__(self) -> int:
        return len(self.rank)


def build_event_table(run: LoadedRun) -> EventTable:
    """Flatten the loaded ranks' events into one :class:`EventTable` (pending and failed events
    are left out: they have no completion time)."""
    groups: list[GroupRef] = []
    gindex: dict[str, int] = {}
    ops: list[str] = []
    oindex: dict[str, int] = {}
    cols: dict[str, list[np.ndarray]] = {
        k: []
        for k in ("rank", "gid", "op", "seq", "peer", "start", "dur", "in", "out", "gsize", "index")
    }
    for r in sorted(run.ranks):
        rd = run.ranks[r]
        layout = rd.meta.get("layout") or run.manifest.get("layout")
        gmap = []
        for g in rd.groups:
            name = str(g.get("name", ""))
            if name not in gindex:
                ranks = tuple(int(x) for x in g.get("ranks", ()))
                desc = str(g.get("desc", ""))
                gindex[name] = len(groups)
                groups.append(GroupRef(name, desc, ranks, dimension_of(desc, ranks, layout)))
            gmap.append(gindex[name])
        ev = rd.events
        keep = (
            (ev["status"] == STATUS_CODES["ok"])
            & (ev["duration_ns"] >= 0)
            & (ev["group"] < len(gmap))
        )
        idx = np.nonzero(keep)[0]
        ev = ev[idx]
        codes = np.unique(ev["op"])
        omap = np.zeros(256, dtype=np.int32)
        for c in codes:
            name = rd.op_name(int(c))
            if name not in oindex:
                oindex[name] = len(ops)
                ops.append(name)
            omap[int(c)] = oindex[name]
        gm = np.asarray(gmap, dtype=np.int32) if gmap else np.zeros(1, dtype=np.int32)
        gid = gm[ev["group"].astype(np.int64)] if len(ev) else np.zeros(0, dtype=np.int32)
        cols["rank"].append(np.full(len(ev), r, dtype=np.int32))
        cols["gid"].append(gid)
        cols["op"].append(omap[ev["op"]])
        cols["seq"].append(ev["seq"].astype(np.int64))
        cols["peer"].append(ev["peer"].astype(np.int32))
        cols["start"].append(ev["start_ns"].astype(np.int64))
        cols["dur"].append(ev["duration_ns"].astype(np.int64))
        cols["in"].append(ev["in_bytes"].astype(np.int64))
        cols["out"].append(ev["out_bytes"].astype(np.int64))
        cols["gsize"].append(np.asarray([len(groups[g].ranks) for g in gid], dtype=np.int32))
        cols["index"].append(idx.astype(np.int64))

    def cat(k: str, dt: type) -> np.ndarray:
        return np.concatenate(cols[k]).astype(dt) if cols[k] else np.zeros(0, dtype=dt)

    op = cat("op", np.int32)
    codes_by_name = np.asarray([_op_code(o) for o in ops] or [0], dtype=np.int64)
    gsize = cat("gsize", np.int32)
    size = nccl_tests_size_array(
        codes_by_name[op] if len(op) else op, cat("in", np.int64), cat("out", np.int64), gsize
    )
    return EventTable(
        groups=tuple(groups),
        ops=tuple(ops),
        rank=cat("rank", np.int32),
        gid=cat("gid", np.int32),
        op=op,
        seq=cat("seq", np.int64),
        peer=cat("peer", np.int32),
        start_ns=cat("start", np.int64),
        duration_ns=cat("dur", np.int64),
        size_bytes=size.astype(np.int64),
        group_size=gsize,
        index=cat("index", np.int64),
    )


def _op_code(name: str) -> int:
    from meshprof.events import OP_CODES

    return OP_CODES.get(name, OP_CODES["custom"])

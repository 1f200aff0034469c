"""The read side of the recorder: events, columns, statistics, metadata and JSON export.

:class:`RecordQueries` is the base of :class:`meshprof.comm.recorder.CommProfiler`: everything
here works on one :class:`Reading` (the recorder's :meth:`~RecordQueries.read`: the completed
events and the collectives in flight at one instant, each collective in one of the two) and
never touches the hot path. Times are integer nanoseconds; bandwidths GB/s (1e9 bytes per
second).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from meshprof.comm.completion import PendingOps
from meshprof.comm.mesh_names import MeshNames
from meshprof.config import ProfilerConfig
from meshprof.event_log import EventLog
from meshprof.events import (
    FLAG_ASYNC,
    STATUS_NAMES,
    CommEvent,
    bandwidth_arrays,
    nccl_tests_size_array,
    size_bucket_array,
)
from meshprof.records.members import Members
from meshprof.stats import ALL_GROUPS, ALL_RANKS, Accumulator, Key, StatsReport, compute_stats


@dataclass(frozen=True, slots=True)
class Reading:
    """What the recorder held at one instant (:meth:`RecordQueries.read`): the completed events
    and the collectives issued and not completed, each collective in exactly one of the two.

    A collective in flight at one read is completed in a later read (it then has an event id
    and its duration), and is never in both parts of one read."""

    events: np.ndarray
    """Completed retained events (EVENT_DTYPE) with ids below :attr:`total`, in completion
    order (empty when the read did not ask for them)."""
    ids: np.ndarray
    """Their event ids."""
    pending: PendingOps
    """The collectives issued and not completed at the instant (in flight), oldest first:
    rows with status ``pending``, ``duration_ns`` -1 and the issue time as ``start_ns``."""
    total: int
    """Events completed and moved into the log by the instant (ids 0 .. total-1)."""
    chunks: int
    """Chunks the log had fed its listeners by the instant (:attr:`EventLog.chunks`)."""
    acc: Accumulator | None
    """The statistics at the instant with the ops in flight counted as issued (None when the
    read did not ask for them)."""


def compute_device() -> str:
    """What this process computes on: ``"cuda"`` once it initialized CUDA (the test the memory
    sampler makes), ``"xpu"`` likewise, else ``"cpu"``. Never initializes a device itself."""
    try:
        import torch

        if torch.cuda.is_initialized():
            return "cuda"
        xpu = getattr(torch, "xpu", None)
        if xpu is not None and xpu.is_initialized():
            return "xpu"
    except Exception:
        pass
    return "cpu"


class RecordQueries:
    """Queries over what a CommProfiler recorded (its ``log`` and ``acc``).

    Every query reads at one instant (:meth:`read`): what completed before it and what was in
    flight at it, each collective once."""

    config: ProfilerConfig
    log: EventLog
    acc: Accumulator
    """Running statistics of every event ever flushed (sampled out and evicted ones included)."""
    rank: int
    world_size: int
    created_ns: int
    internal_errors: int
    first_internal_error: str
    mesh_names: MeshNames

    def flush(self) -> None:
        raise NotImplementedError

    def read(self, *, events: bool = True, stats: bool = False) -> Reading:
        raise NotImplementedError

    def recorder_info(self) -> dict[str, Any]:
        raise NotImplementedError

    def recorder_cpu(self) -> dict[str, Any]:
        raise NotImplementedError

    def ensure_rank(self) -> int:
        raise NotImplementedError

    # -- public queries -----------------------------------------------------------------------
    def events(
        self,
        since_id: int = 0,
        until_id: int | None = None,
        *,
        inflight: bool = True,
        reading: Reading | None = None,
    ) -> list[CommEvent]:
        """Retained events (oldest first) as :class:`CommEvent` objects, optionally only those
        with event id in [since_id, until_id), followed (``inflight``, and when the window is
        open: no ``until_id``) by the collectives in flight, status ``"pending"``,
        ``duration_ns`` -1, oldest issue first. ``reading``: of that read (default: a new one)."""
        r = reading if reading is not None else self.read()
        arr, ids = _window(r, since_id, until_id)
        out = self._to_events(arr, ids, self.log.errors, self.log.metadata)
        if inflight and until_id is None and len(r.pending):
            rows = r.pending.rows
            keys = np.arange(len(rows), dtype=np.int64)
            out += self._to_events(rows, keys, {}, r.pending.metadata)
        return out

    def columns(self) -> tuple[np.ndarray, np.ndarray]:
        """Retained completed events as the raw structured array (EVENT_DTYPE) and their ids
        (the ops in flight at the same instant: :meth:`read`)."""
        r = self.read()
        return r.events, r.ids

    def stats(
        self, since_id: int = 0, until_id: int | None = None, *, reading: Reading | None = None
    ) -> StatsReport:
        """Statistics per op, rank, group and size bucket (see :mod:`meshprof.stats`): the
        collectives in flight count as issued (``count``, ``inflight``), not in the times.

        With a window (event ids), only retained events of the window count (and the ops in
        flight while the window is open)."""
        r = reading if reading is not None and reading.acc is not None else None
        if r is None:
            r = self.read(stats=True)
        if since_id or until_id is not None:
            arr, _ = _window(r, since_id, until_id)
            acc = Accumulator(self.config.sketch_relative_error)
            self.fold(acc, arr)
            if until_id is None:
                self.fold(acc, r.pending.rows)
            return compute_stats(acc, self._exact_samples(arr))
        assert r.acc is not None
        exact = None
        # exact while every completed event is retained (and in this read: it copied them)
        if r.acc.dropped == 0 and len(r.events) == r.total:
            exact = self._exact_samples(r.events)
        return compute_stats(r.acc, exact)

    def accumulated_stats_dict(self, reading: Reading | None = None) -> dict[str, Any]:
        """The running statistics as plain data: those of ``reading`` (ops in flight counted
        as issued), else read now, while no flush is folding into them."""
        if reading is not None and reading.acc is not None:
            return reading.acc.to_dict()
        with self.log.locked():
            return self.acc.to_dict()

    def meta(self, reading: Reading | None = None) -> dict[str, Any]:
        """Who recorded and what, at ``reading`` (default: a new read)."""
        import torch

        from meshprof._version import __version__

        self.ensure_rank()
        r = reading if reading is not None else self.read(events=False)
        capacity = self.log.capacity
        mesh = self.mesh_names.names()
        return {
            "meshprof_version": __version__,
            "torch_version": torch.__version__,
            "rank": self.rank,
            "world_size": self.world_size,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "created_ns": self.created_ns,
            "exported_ns": time.time_ns(),
            "total_events": r.total,
            "retained_events": min(r.total, capacity),
            "evicted_events": max(0, r.total - capacity),
            "inflight_events": len(r.pending),
            "dropped_events": (r.acc if r.acc is not None else self.acc).dropped,
            "recorder": self.recorder_info(),
            "recorder_cpu": self.recorder_cpu(),
            "internal_errors": self.internal_errors,
            "first_internal_error": self.first_internal_error,
            "groups": [
                {
                    "name": g.name,
                    "desc": g.desc,
                    "ranks": Members.of(g.ranks).to_json_data(),  # O(1) for a progression
                    "backend": g.backend,
                    **({"mesh_dims": mesh[g.name]} if g.name in mesh else {}),
                }
                for g in self.log.groups
            ],
            "config": self.config.to_dict(),
            "device": compute_device(),
        }

    def to_json_dict(self, since_id: int = 0, until_id: int | None = None) -> dict[str, Any]:
        """``{"meta", "events", "stats"}`` of one read (the export's content)."""
        r = self.read(stats=True)
        return {
            "meta": self.meta(r),
            "events": [e.to_dict() for e in self.events(since_id, until_id, reading=r)],
            "stats": self.stats(since_id, until_id, reading=r).to_dict(),
        }

    # -- statistics ---------------------------------------------------------------------------
    def fold(self, acc: Accumulator, chunk: np.ndarray) -> None:
        """Add a chunk of EVENT_DTYPE rows to ``acc`` under this recorder's statistics keys."""
        acc.add_chunk(
            chunk, self._stats_rank(), self.log.op_name, self._stats_group, self._group_size
        )

    def _group_size(self, g: int) -> int:
        return self.log.groups[g].size if g < len(self.log.groups) else 1

    def _group_name(self, g: int) -> str:
        return self.log.groups[g].name if g < len(self.log.groups) else str(g)

    def _stats_group(self, g: int) -> str:
        """The group part of a statistics key: the name, or ALL_GROUPS without per-group tracking."""
        return self._group_name(g) if self.config.track_per_group else ALL_GROUPS

    def _stats_rank(self) -> int:
        """The rank part of a statistics key: this rank, or ALL_RANKS without per-rank tracking."""
        return max(self.rank, 0) if self.config.track_per_rank else ALL_RANKS

    def _exact_samples(self, arr: np.ndarray) -> dict[Key, np.ndarray]:
        if len(arr) == 0:
            return {}
        sizes = np.array(
            [self._group_size(g) for g in range(len(self.log.groups) or 1)], dtype=np.int64
        )[arr["group"]]
        buckets = size_bucket_array(
            nccl_tests_size_array(arr["op"], arr["in_bytes"], arr["out_bytes"], sizes)
        )
        keys = np.stack(
            [arr["op"].astype(np.int64), arr["group"].astype(np.int64), buckets], axis=1
        )
        uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        rank = self._stats_rank()
        out: dict[Key, np.ndarray] = {}
        dur = arr["duration_ns"]
        for k, (opc, g, b) in enumerate(uniq.tolist()):
            key = (rank, self.log.op_name(opc), self._stats_group(g), int(b))
            sel = dur[(inverse == k) & (dur >= 0)]
            out[key] = np.concatenate([out[key], sel]) if key in out else sel
        return out

    # -- events -------------------------------------------------------------------------------
    def _to_events(
        self,
        arr: np.ndarray,
        ids: np.ndarray,
        errors: Mapping[int, str],
        metadata: Mapping[int, dict[str, Any]],
    ) -> list[CommEvent]:
        """``arr``'s rows as CommEvents; ``errors`` / ``metadata`` keyed by ``ids``."""
        if len(arr) == 0:
            return []
        groups = self.log.groups
        sizes = np.array([g.size for g in groups] or [1], dtype=np.int64)[arr["group"]]
        alg, bus = bandwidth_arrays(
            arr["op"], arr["in_bytes"], arr["out_bytes"], arr["duration_ns"], sizes
        )
        rank = max(self.ensure_rank(), 0)
        ws = self.world_size if self.world_size > 0 else 1
        out = []
        for i, row in enumerate(arr.tolist()):
            opc, status, dtype, flags, g, peer, seq, in_b, out_b, start, dur, step = row
            gi = groups[g]
            eid = int(ids[i])
            out.append(
                CommEvent(
                    op=self.log.op_name(opc),
                    rank=rank,
                    world_size=ws,
                    group_name=gi.name,
                    group_desc=gi.desc,
                    group_ranks=gi.ranks,
                    seq=seq,
                    dtype=self.log.dtypes[dtype] if dtype < len(self.log.dtypes) else "",
                    in_bytes=in_b,
                    out_bytes=out_b,
                    start_ns=start,
                    duration_ns=dur,
                    algbw_gbps=float(alg[i]),
                    busbw_gbps=float(bus[i]),
                    status=STATUS_NAMES[status],
                    error=errors.get(eid, ""),
                    metadata=metadata.get(eid) or {},
                    peer=peer,
                    step=step,
                    async_op=bool(flags & FLAG_ASYNC),
                )
            )
        return out


def _window(r: Reading, since_id: int, until_id: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The completed events of ``r`` with ids in [since_id, until_id)."""
    arr, ids = r.events, r.ids
    if since_id or until_id is not None:
        keep = ids >= since_id
        if until_id is not None:
            keep &= ids < until_id
        arr, ids = arr[keep], ids[keep]
    return arr, ids

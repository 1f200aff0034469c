"""The rank side of live monitoring: a thread that publishes this rank's :class:`RankLive`
every ``interval_s`` seconds into ``RUN_DIR/live/`` (see :mod:`meshprof.rundir.live`).

Cost: nothing per collective on the training thread beyond appending a reference to each
flushed chunk of events (one per ~1,000 collectives, or per read); everything else — the
per-(op, dimension) counters and latency histograms, the per-step communication, the recent
steps' medians — is computed on the publisher's own thread once per interval, from the chunks
that arrived since the last tick and the last few dozen step spans.

Communication and exposed communication over the recent window follow the step analysis'
definitions (:mod:`meshprof.analyze.steps.communication`) at step granularity: a step's
communication is the length of the union of the intervals [issue, completion] of the collectives
issued in it, clipped to the step (overall, and per dimension: overlapping DDP buckets count
once); its exposed communication is min(max(wall − CPU time of the training thread, 0),
communication), split over dimensions in proportion to their communication (the full report
refines this phase by phase). The shares are these over the window's wall time.
"""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from meshprof.analyze.compute.intervals import clipped_total
from meshprof.events import FLAG_UNSAMPLED, OP_NAMES
from meshprof.monitor.request_monitor import get_request_monitor
from meshprof.process import env_rank
from meshprof.records.live import HIST_BOUNDS_S, DimLive, InflightLive, OpSeries, RankLive
from meshprof.records.serving import ServiceLevels, ServingLive
from meshprof.rundir.live import LiveWriter, live_file
from meshprof.session.live_ledger import LiveLedger
from meshprof.session.live_serving import LiveServing, decode_figures

#: Steps in the recent window (medians, shares, rates).
WINDOW_STEPS = 32
#: Steps whose collective intervals are kept (older ones are dropped).
KEEP_STEPS = 2 * WINDOW_STEPS
_BOUNDS_NS = np.array([int(b * 1e9) for b in HIST_BOUNDS_S], dtype=np.int64)
_STEP_KIND = 0  # SPAN_KINDS.index("step")


class LiveCounters:
    """Cumulative per-(op, dimension) counters and per-step communication, fed with the event
    chunks the recorder's log flushes (:meth:`on_chunk` only queues; :meth:`fold` computes)."""

    def __init__(self, prof: Any, layout: object = None) -> None:
        self.prof = prof
        self.layout = layout
        self._pending: deque[tuple[int, np.ndarray]] = deque()
        self.series: dict[tuple[int, str], OpSeries] = {}
        self.step_iv: dict[int, dict[str, list[np.ndarray]]] = {}
        """Per step (the step each collective was issued in), per dimension: (start, end)
        int64 pairs of its collectives, in chunks as they came (merged when measured)."""
        self.collectives = 0
        self._dims: dict[int, str] = {}
        self._mesh_version = 0

    def on_chunk(self, chunk: np.ndarray) -> None:
        """Event-log listener (runs in whatever thread flushes): queue only, with the chunk's
        number in the log (:attr:`meshprof.event_log.EventLog.chunks`)."""
        self._pending.append((int(self.prof.log.chunks), chunk))

    def dim_of_group(self, gidx: int) -> str:
        """Parallel dimension of the log's group ``gidx``."""
        mesh = getattr(self.prof, "mesh_names", None)
        version = mesh.version if mesh is not None else 0
        if version != self._mesh_version:  # the job named more groups: look again
            self._mesh_version = version
            self._dims.clear()
        d = self._dims.get(gidx)
        if d is None:
            from meshprof.layout import dimension_of

            groups = self.prof.log.groups
            if gidx >= len(groups):
                return "other"
            g = groups[gidx]
            names = mesh.of(g.name) if mesh is not None else ()
            d = self._dims[gidx] = dimension_of(g.ranks, self.layout, g.desc, names)
        return d

    def fold(self, upto: int | None = None) -> None:
        """Fold the queued chunks into the counters (publisher thread); with ``upto``, only
        those fed up to that chunk number (a read's instant: what completed later is in flight
        in that read, and folded at the next one)."""
        while self._pending:
            if upto is not None and self._pending[0][0] > upto:
                break
            chunk = self._pending.popleft()[1]
            dur = chunk["duration_ns"]
            ok = ((chunk["flags"] & FLAG_UNSAMPLED) == 0) & (dur >= 0)
            if not ok.any():
                continue
            c = chunk[ok]
            dur = dur[ok]
            self.collectives += len(c)
            buckets = np.searchsorted(_BOUNDS_NS, dur, side="left")
            keys = c["op"].astype(np.int64) << 16 | c["group"].astype(np.int64)
            for key in np.unique(keys).tolist():
                sel = keys == key
                op_code, gidx = key >> 16, key & 0xFFFF
                dim = self.dim_of_group(gidx)
                name = self._op_name(op_code)
                s = self.series.get((op_code, dim))
                if s is None:
                    s = self.series[(op_code, dim)] = OpSeries(name, dim)
                s.count += int(sel.sum())
                s.sum_ns += int(dur[sel].sum())
                counts = np.bincount(buckets[sel], minlength=len(_BOUNDS_NS) + 1)
                s.buckets = [a + int(b) for a, b in zip(s.buckets, counts.tolist(), strict=True)]
                steps = c["step"][sel]
                start = c["start_ns"][sel].astype(np.int64)
                iv = np.stack((start, start + dur[sel].astype(np.int64)), axis=1)
                for st in np.unique(steps).tolist():
                    if st < 0:
                        continue
                    per = self.step_iv.setdefault(int(st), {})
                    per.setdefault(dim, []).append(iv[steps == st])
        if len(self.step_iv) > KEEP_STEPS:
            for st in sorted(self.step_iv)[: len(self.step_iv) - KEEP_STEPS]:
                del self.step_iv[st]

    def step_comm(self, step: int, lo: int, hi: int) -> tuple[int, dict[str, int]]:
        """Communication of the collectives issued in ``step`` inside [lo, hi) (the step's
        span), ns: the union of all their intervals and the union per dimension."""
        per = self.step_iv.get(step)
        if not per:
            return 0, {}
        by_dim: dict[str, int] = {}
        parts = []
        for d, chunks in per.items():
            iv = np.concatenate(chunks) if len(chunks) > 1 else chunks[0]
            per[d] = [iv]
            parts.append(iv)
            by_dim[d] = clipped_total(iv[:, 0], iv[:, 1], lo, hi)
        every = np.concatenate(parts) if len(parts) > 1 else parts[0]
        return clipped_total(every[:, 0], every[:, 1], lo, hi), by_dim

    def _op_name(self, code: int) -> str:
        try:
            return str(self.prof.log.op_name(code))
        except Exception:
            return OP_NAMES[code] if code < len(OP_NAMES) else f"op{code}"


def recent_steps(monitor: Any, n: int = WINDOW_STEPS, scan: int = 20_000) -> list[tuple[Any, ...]]:
    """The last ``n`` closed step spans of ``monitor`` (SPAN rows), oldest first; at most
    ``scan`` span rows are looked at (phases sit between steps)."""
    spans = getattr(monitor, "span_rows", None)
    if spans is None:
        return []
    for _ in range(3):  # the training thread may append while we read: retry
        try:
            out: list[tuple[Any, ...]] = []
            for i, row in enumerate(reversed(spans)):
                if i >= scan or len(out) >= n:
                    break
                if row[0] == _STEP_KIND and row[2] == 0:
                    out.append(row)
            return out[::-1]
        except RuntimeError:
            continue
    return []


class LivePublisher:
    """Publishes this rank's live state every ``interval_s`` (a daemon thread); never raises."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        prof: Any,
        monitor: Any = None,
        interval_s: float = 1.0,
        rank: int | None = None,
        layout: object = None,
        extra: dict[str, Any] | None = None,
        slo: ServiceLevels | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.prof = prof
        self.monitor = monitor
        self.interval_s = float(interval_s)
        self.rank = rank
        self.extra = extra if extra is not None else {}
        lay = layout if layout is not None else getattr(monitor, "layout", None)
        self.counters = LiveCounters(prof, lay)
        self.ledger = LiveLedger(self.counters)
        self.serving = LiveServing(slo)
        """The serving figures (a rank with a request monitor, or with decode steps)."""
        self.started_ns = time.time_ns()
        self.publishes = 0
        self.failures = 0
        self.cost_ns = 0
        """Thread time (CPU) spent in publishing so far, ns."""
        self._status = "running"
        self.exit_how = ""
        """How the process is ending (set by :meth:`set_exit`); "" while running."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._writer: LiveWriter | None = None
        self.storage_state: Any = None
        """A callable returning why the rank stopped writing its files ("" while it writes),
        published as the record's ``storage`` (the session sets it to the rank writer's)."""

    def start(self) -> LivePublisher:
        """Register the chunk listener and start the thread (the first record right away)."""
        self.prof.log.listeners.append(self.counters.on_chunk)
        self._thread = threading.Thread(target=self._run, name="meshprof-live", daemon=True)
        self._thread.start()
        return self

    def stop(self, how: str = "normal") -> None:
        """Publish a last record marked "ended" and stop the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        if self._status == "ended":
            return
        self._status, self.exit_how = "ended", how or "normal"
        self.publish()
        with contextlib.suppress(ValueError):
            self.prof.log.listeners.remove(self.counters.on_chunk)
        if self._writer is not None:
            self._writer.close()

    def set_exit(self, how: str) -> None:
        """Remember how the process ends (the last record says it)."""
        self.exit_how = how

    def _run(self) -> None:
        self.publish()
        while not self._stop.wait(self.interval_s):
            self.publish()

    def publish(self) -> Path | None:
        """Build and write the record now; its path, or None on failure (counted)."""
        t0 = time.thread_time_ns()
        try:
            with self._lock:
                reading = None
                with contextlib.suppress(Exception):
                    reading = self.prof.read(events=False)
                read_ns = time.time_ns()  # the instant its in-flight ages are measured at
                self.counters.fold(reading.chunks if reading is not None else None)
                rec = self.build(reading, read_ns)
                if self._writer is None or self._writer.path != live_file(self.run_dir, rec.rank):
                    self._writer = LiveWriter(live_file(self.run_dir, rec.rank), self.run_dir)
                path = self._writer.write(rec)
                self.publishes += 1
                return path
        except Exception:
            self.failures += 1
            return None
        finally:
            self.cost_ns += time.thread_time_ns() - t0

    # -- the record ------------------------------------------------------------------------------
    def build(self, reading: Any = None, read_ns: int | None = None) -> RankLive:
        """This rank's :class:`RankLive` (``reading``: the recorder's read whose completed
        collectives the counters hold; its ops in flight are the record's). The record's time
        (``updated_ns``) is ``read_ns``, when the recorder was read (default: now, with the
        ops in flight read at once): the ops' ages are measured then, and building the rest
        of the record took 80 ms once on a loaded host, which put their issue that much late."""
        ops = reading.pending.ops if reading is not None else self._ops_in_flight()
        now = time.time_ns() if read_ns is None else read_ns
        rank = self._rank()
        rec = RankLive(
            rank=rank,
            updated_ns=now,
            interval_s=self.interval_s,
            world_size=int(self.extra.get("world_size", getattr(self.prof, "world_size", -1))),
            pid=os.getpid(),
            hostname=socket.gethostname(),
            node_id=str(self.extra.get("node_id", "") or ""),
            stage=self._stage(rank),
            started_ns=self.started_ns,
            status=self._status,
            exit_how=self.exit_how if self._status != "running" else "",
            collectives=self.counters.collectives,
            series=sorted(self.counters.series.values(), key=lambda s: (s.dim, s.op)),
            internal_errors=int(getattr(self.prof, "internal_errors", 0)),
            storage=str(self.storage_state() or "") if self.storage_state is not None else "",
        )
        mon = self.monitor
        if mon is not None:
            rec.step = int(getattr(mon, "current_step", -1))
            self._fill_steps(rec, recent_steps(mon))
            self._fill_memory(rec, mon)
            self.ledger.fill(rec, mon)
        self._fill_serving(rec, mon)
        rec.inflight_count = len(ops)
        rec.inflight = self._inflight(ops, now)
        return rec

    def _fill_serving(self, rec: RankLive, mon: Any) -> None:
        rm = get_request_monitor()
        if rm is not None:
            self.serving.fold(rm)
            rec.serving = self.serving.build(rm, rec.updated_ns, mon, self.counters)
            return
        live = ServingLive(serves_requests=False)
        decode_figures(live, mon, self.counters)
        if live.decode_steps:
            rec.serving = live

    def _rank(self) -> int:
        if self.rank is not None:
            return self.rank
        env = env_rank()
        if env is not None:
            return env
        try:
            return max(int(self.prof.ensure_rank()), 0)
        except Exception:
            return 0

    def _stage(self, rank: int) -> int:
        """The rank's pipeline stage from the layout (-1 without one)."""
        try:
            from meshprof.layout import Layout

            lay = Layout.from_any(self.counters.layout)
        except Exception:
            return -1
        if lay is None or rank >= lay.world_size:
            return -1
        return lay.coords(rank)[2]

    def _fill_steps(self, rec: RankLive, steps: list[tuple[Any, ...]]) -> None:
        if not steps:
            return
        # SPAN row: (kind, status, depth, name, step, start_ns, duration_ns, tokens, samples, cpu)
        rec.steps_done = int(steps[-1][4]) + 1
        durs = [int(s[6]) for s in steps]
        rec.recent_step_ns = durs
        rec.step_ns = int(statistics.median(durs))
        rec.last_step_end_ns = int(steps[-1][5] + steps[-1][6])
        span_ns = int(steps[-1][5] + steps[-1][6] - steps[0][5])
        if span_ns > 0:
            rec.steps_per_s = len(steps) * 1e9 / span_ns
            tokens = sum(int(s[7]) for s in steps)
            rec.tokens_per_s = tokens * 1e9 / span_ns
        comm_by_dim: dict[str, int] = {}
        exposed_by_dim: dict[str, float] = {}
        compute: list[int] = []
        total_wall = sum(durs)
        comm_all = 0
        for s in steps:
            lo = int(s[5])
            comm, per = self.counters.step_comm(int(s[4]), lo, lo + int(s[6]))
            comm_all += comm
            per_sum = sum(per.values())
            wall, cpu = int(s[6]), int(s[9])
            blocked = wall - cpu if cpu >= 0 else wall
            exposed = min(max(blocked, 0), comm)
            compute.append(wall - exposed)
            for d, v in per.items():
                comm_by_dim[d] = comm_by_dim.get(d, 0) + v
                if per_sum > 0:
                    exposed_by_dim[d] = exposed_by_dim.get(d, 0.0) + exposed * v / per_sum
        rec.compute_ns = int(statistics.median(compute))
        if total_wall > 0:
            rec.comm_share = min(comm_all / total_wall, 1.0)
            rec.exposed_share = min(sum(exposed_by_dim.values()) / total_wall, 1.0)
            rec.dims = [
                DimLive(
                    dim=d,
                    comm_ns=v,
                    exposed_ns=int(exposed_by_dim.get(d, 0.0)),
                    comm_share=min(v / total_wall, 1.0),
                    exposed_share=min(exposed_by_dim.get(d, 0.0) / total_wall, 1.0),
                )
                for d, v in sorted(comm_by_dim.items())
            ]

    @staticmethod
    def _fill_memory(rec: RankLive, mon: Any) -> None:
        mem = getattr(mon, "memory_rows", None)
        if not mem:
            return
        with contextlib.suppress(IndexError, RuntimeError):
            last = mem[-1]  # (step, t_ns, allocated, reserved, peak, rss, capacity)
            rec.memory_bytes = int(last[2])
            rec.memory_peak_bytes = max(int(last[4]), int(last[2]))
            rec.memory_capacity_bytes = int(last[6])

    def _ops_in_flight(self) -> list[Any]:
        try:
            return list(self.prof.inflight())
        except Exception:
            return []

    def _inflight(self, ops: list[Any], now_ns: int) -> InflightLive | None:
        """The oldest of ``ops`` (their ages measured at ``now_ns``, epoch ns)."""
        if not ops:
            return None
        op = max(ops, key=lambda o: o.age_ns)
        desc = op.group_name
        for g in self.prof.log.groups:
            if g.name == op.group_name:
                desc = g.desc or g.name
                break
        from meshprof.layout import dimension_of

        mesh = getattr(self.prof, "mesh_names", None)
        names = mesh.of(op.group_name) if mesh is not None else ()
        dim = dimension_of(op.group_ranks, self.counters.layout, desc, names)
        age = max(int(op.age_ns), 0)
        return InflightLive(
            op=op.op,
            group=desc,
            dim=dim,
            seq=int(op.seq),
            age_ns=age,
            issued_ns=now_ns - age,
        )


__all__ = ["KEEP_STEPS", "WINDOW_STEPS", "LiveCounters", "LivePublisher", "recent_steps"]

"""The per-process collective recorder: ``CommProfiler``.

The dispatcher kernels (:mod:`meshprof.comm.hooks`) call ``_begin`` before a c10d op and
``_finish`` after it. ``_begin`` assigns the collective its ``seq`` within its group (the same on
every member rank), decides sampling, and notes the start; completion is taken from the op's
``Work`` future (a callback on the backend's thread) or, for works without a future (gloo
send/recv), from a poller thread; on CUDA from CUDA events resolved later, never by
synchronizing the host. Every failure inside meshprof is caught, counted and reported once.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import socket
import sys
import threading
import time
import warnings
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from meshprof.comm.ops import OpSpec, _first
from meshprof.config import ProfilerConfig
from meshprof.events import (
    EVENT_DTYPE,
    FLAG_ASYNC,
    FLAG_DEVICE_TIMING,
    FLAG_DROPPED,
    FLAG_UNSAMPLED,
    P2P_OPS,
    STATUS_CODES,
    STATUS_NAMES,
    CommEvent,
    GroupInfo,
    bandwidth_arrays,
    nccl_tests_size_array,
    size_bucket_array,
)
from meshprof.recorder import EventLog
from meshprof.stats import ALL_GROUPS, ALL_RANKS, Accumulator, Key, StatsReport, compute_stats

_Work = torch._C._distributed_c10d.Work
_PG = torch._C._distributed_c10d.ProcessGroup
_OK = STATUS_CODES["ok"]
perf_counter_ns = time.perf_counter_ns
get_ident = threading.get_ident
_ERR = STATUS_CODES["error"]


class _Rec:
    """A collective between issue and completion."""

    __slots__ = (
        "composite",
        "dtype",
        "end_event",
        "flags",
        "group",
        "in_bytes",
        "meta",
        "op",
        "op_name",
        "out_bytes",
        "peer",
        "seq",
        "start_event",
        "start_ns",
        "step",
        "t0",
        "thread",
        "token",
        "work",
    )
    composite: bool
    dtype: int
    end_event: Any
    flags: int
    group: int
    in_bytes: int
    meta: dict[str, Any] | None
    op: int
    op_name: str
    out_bytes: int
    peer: int
    seq: int
    start_event: Any
    start_ns: int
    step: int
    t0: int
    thread: int
    token: int
    work: Any


@dataclass(frozen=True, slots=True)
class InflightOp:
    """A collective issued but not completed (what the hang watchdog looks at)."""

    op: str
    group_name: str
    group_ranks: tuple[int, ...]
    seq: int
    peer: int
    dtype: str
    in_bytes: int
    out_bytes: int
    start_ns: int
    age_ns: int
    thread_id: int


# Works of these ops (gloo's reduce_scatter) have no future and never report is_completed();
# a short-lived thread waits on them instead (Work.wait is safe to call from several threads).
_WAIT_IN_THREAD = frozenset({"reduce_scatter"})


class _Poller:
    """Notices completion of works that nobody waits on from Python, by polling
    ``is_completed()`` on a daemon thread.

    Two tiers: works of asynchronous ops (DDP's reducer, functional collectives, ``async_op=True``
    calls) are polled every 0.1 ms, backing off to 1 ms while none completes; works of synchronous
    calls, which ``torch.distributed`` waits on at once (so the ``Work.wait`` hook completes
    them), are only a safety net swept every 20 ms. With nothing pending the thread sleeps on an
    event, so an idle or synchronous-only job pays nothing for it.
    """

    SLOW_S = 0.020
    FAST_MIN_S = 0.0001
    FAST_MAX_S = 0.001

    def __init__(self, done: Callable[[_Rec, int, BaseException | None], None]) -> None:
        self._done = done
        self._fast: deque[tuple[Any, _Rec]] = deque()
        self._slow: deque[tuple[Any, _Rec]] = deque()
        self._wake = threading.Event()
        self._idle = True
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._stop = False

    def add(self, work: Any, rec: _Rec, sync: bool) -> None:
        if rec.op_name in _WAIT_IN_THREAD and not sync:
            threading.Thread(
                target=self._wait, args=(work, rec), name="meshprof-wait", daemon=True
            ).start()
            return
        (self._slow if sync else self._fast).append((work, rec))
        if self._thread is None or not self._thread.is_alive():
            with self._start_lock:  # several issuing threads must not start two pollers
                if self._thread is None or not self._thread.is_alive():
                    self._stop = False
                    self._thread = threading.Thread(
                        target=self._run, name="meshprof-poller", daemon=True
                    )
                    self._thread.start()
        if self._idle and not sync:
            self._wake.set()

    def _wait(self, work: Any, rec: _Rec) -> None:
        err: BaseException | None = None
        try:
            work.wait()
        except BaseException as e:
            err = e
        self._done(rec, time.perf_counter_ns(), err)

    def stop(self) -> None:
        self._stop = True
        self._wake.set()

    def pending(self) -> int:
        """Works not yet seen complete."""
        return len(self._fast) + len(self._slow)

    def settle(self, timeout_s: float) -> None:
        """Sweep the pending works on the calling thread until none is left or ``timeout_s``
        passes (0: one sweep). Before a final write this catches ops that completed while the
        poller thread was starved of the GIL or CPU (a loaded host at interpreter exit)."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        while True:
            self._sweep(self._fast)
            self._sweep(self._slow)
            if not self.pending() or time.monotonic() >= deadline:
                return
            time.sleep(0.001)

    def _sweep(self, items: deque[tuple[Any, _Rec]]) -> bool:
        progressed = False
        for _ in range(len(items)):
            try:
                work, rec = items.popleft()
            except IndexError:
                break
            if rec.work is None:  # already completed through Work.wait
                continue
            try:
                completed = work.is_completed()
            except Exception:
                completed = True
            if not completed:
                items.append((work, rec))
                continue
            progressed = True
            # An error surfaces (and is recorded) where the caller waits on the work; the
            # poller only notes completion. _complete reports its own errors.
            with contextlib.suppress(Exception):
                self._done(rec, time.perf_counter_ns(), None)
        return progressed

    def _run(self) -> None:
        # Pending works are drained even after stop(), so no recorded op is lost.
        delay = self.FAST_MIN_S
        last_slow = 0.0
        while not self._stop or self._fast or self._slow:
            if not self._fast:
                if not self._slow:
                    self._idle = True
                    self._wake.wait(0.5)
                    self._wake.clear()
                    self._idle = False
                    delay = self.FAST_MIN_S
                    continue
                self._wake.wait(self.SLOW_S)
                self._wake.clear()
            now = time.monotonic()
            if now - last_slow >= self.SLOW_S:
                self._sweep(self._slow)
                last_slow = now
            if self._fast:
                progressed = self._sweep(self._fast)
                delay = self.FAST_MIN_S if progressed else min(delay * 2, self.FAST_MAX_S)
                time.sleep(delay)


class CommProfiler:
    """Records every collective and point-to-point op of this process.

    Create it with :func:`meshprof.enable`; it is installed in PyTorch's dispatcher until
    :func:`meshprof.disable`.
    """

    def __init__(self, config: ProfilerConfig | None = None) -> None:
        self.config = config or ProfilerConfig()
        self.log = EventLog(self.config.max_events)
        self.acc = Accumulator(self.config.sketch_relative_error)
        self.log.listeners.append(self._on_flush)
        self._step = -1
        self._native: Any = None  # meshprof.native.NativeRecorder when config.native
        """Current training step (set by the step monitor or automatic step detection)."""
        self.internal_errors = 0
        """Errors inside meshprof that were caught so training could go on."""
        self.first_internal_error = ""
        self.rank = -1
        self.world_size = -1
        self._groups: dict[Any, tuple[int, int, int, tuple[int, ...], str]] = {}
        self._dtype_codes: dict[Any, int] = {}  # torch.dtype -> the log's dtype code
        self._seq: dict[int, int] = {}
        self._p2p_seq: dict[tuple[int, int, int], int] = {}
        self._seq_lock = threading.Lock()  # seqs assigned at completion (recv from any source)
        self._inflight: dict[int, _Rec] = {}
        self._tokens = itertools.count(1)  # next() is atomic under the GIL
        self._tls = threading.local()
        self._poller = _Poller(self._work_polled)
        self._by_work: dict[int, tuple[Any, _Rec]] = {}
        self._device_pending: deque[_Rec] = deque()
        self._threshold = int(self.config.sample_rate * 2**32)
        self._min_ns = int(self.config.min_duration_us * 1000)
        self._wall_offset = time.time_ns() - time.perf_counter_ns()
        self._installation: Any = None
        self.created_ns = time.time_ns()

    # -- public API ---------------------------------------------------------------------------
    @property
    def installed(self) -> bool:
        return self._installation is not None

    def update_config(self, **changes: Any) -> ProfilerConfig:
        """Change configuration fields in place (``max_events`` resizes the buffer, keeping the
        newest events)."""
        new = self.config.updated(**changes)
        if new.max_events != self.config.max_events:
            events, _ids = self.log.snapshot()
            old = self.log
            self.log = EventLog(new.max_events)
            self.log.listeners = []
            self.log.groups, self.log._group_index = old.groups, old._group_index
            self.log.dtypes, self.log._dtype_index = old.dtypes, old._dtype_index
            self.log.labels, self.log._label_index = old.labels, old._label_index
            keep = events[-new.max_events :]
            self.log._write(keep, 0)
            self.log.listeners.append(self._on_flush)
        self.config = new
        self._threshold = int(new.sample_rate * 2**32)
        self._min_ns = int(new.min_duration_us * 1000)
        if self._native is not None:
            self._native.configure()  # enabled, sampling and the ops filter live in C++ too
        return new

    def clear(self) -> None:
        """Forget every recorded event and statistic (group sequence numbers keep counting)."""
        self._resolve_device()
        self.log.clear()
        self.acc = Accumulator(self.config.sketch_relative_error)

    @property
    def step(self) -> int:
        """Current training step (set by the step monitor or automatic step detection); every
        collective issued from now on carries it."""
        return self._step

    @step.setter
    def step(self, value: int) -> None:
        self._step = int(value)
        if self._native is not None:
            self._native.set_step(self._step)

    def set_step(self, step: int) -> None:
        self.step = int(step)

    def flush(self) -> None:
        """Resolve finished device timings and move staged events into the buffer."""
        self._resolve_device()
        self._wall_offset = time.time_ns() - time.perf_counter_ns()
        if self._native is not None:
            try:
                self._native.drain()
            except Exception as e:
                self._internal_error(e)
        self.log.flush()

    def settle(self, timeout_s: float = 0.2) -> None:
        """Notice every op that has completed, then flush: pending works are swept on this
        thread for up to ``timeout_s`` (an op that never completes, such as a gloo send nobody
        waits on, stays in flight). Called before a rank file's final write; never raises."""
        try:
            self._poller.settle(timeout_s)
            if self._native is not None:
                self._native.settle(timeout_s)
        except Exception as e:
            self._internal_error(e)
        try:
            self.flush()
        except Exception as e:
            self._internal_error(e)

    def inflight(self) -> list[InflightOp]:
        """Collectives issued and not yet completed, oldest first."""
        now = time.perf_counter_ns()
        out = []
        if self._native is not None:
            try:
                out += [InflightOp(**d) for d in self._native.inflight()]
            except Exception as e:
                self._internal_error(e)
        for rec in sorted(list(self._inflight.values()), key=lambda r: r.t0):
            g = self.log.groups[rec.group]
            out.append(
                InflightOp(
                    op=rec.op_name,
                    group_name=g.name,
                    group_ranks=g.ranks,
                    seq=rec.seq,
                    peer=rec.peer,
                    dtype=self.log.dtypes[rec.dtype] if rec.dtype < len(self.log.dtypes) else "",
                    in_bytes=rec.in_bytes,
                    out_bytes=rec.out_bytes,
                    start_ns=rec.start_ns,
                    age_ns=now - rec.t0,
                    thread_id=rec.thread,
                )
            )
        return out

    def _window(self, since_id: int, until_id: int | None) -> tuple[np.ndarray, np.ndarray]:
        arr, ids = self.log.snapshot()
        if since_id or until_id is not None:
            keep = ids >= since_id
            if until_id is not None:
                keep &= ids < until_id
            arr, ids = arr[keep], ids[keep]
        return arr, ids

    def events(self, since_id: int = 0, until_id: int | None = None) -> list[CommEvent]:
        """Retained events (oldest first) as :class:`CommEvent` objects, optionally only those
        with event id in [since_id, until_id)."""
        self.flush()
        return self._to_events(*self._window(since_id, until_id))

    def columns(self) -> tuple[np.ndarray, np.ndarray]:
        """Retained events as the raw structured array (EVENT_DTYPE) and their ids."""
        self.flush()
        return self.log.snapshot()

    def stats(self, since_id: int = 0, until_id: int | None = None) -> StatsReport:
        """Statistics per op, rank, group and size bucket (see :mod:`meshprof.stats`).

        With a window (event ids), only retained events of the window count."""
        self.flush()
        if since_id or until_id is not None:
            arr, _ = self._window(since_id, until_id)
            acc = Accumulator(self.config.sketch_relative_error)
            self._fold(acc, arr)
            return compute_stats(acc, self._exact_samples(arr))
        exact = None
        if self.log.evicted == 0 and self.acc.dropped == 0:
            arr, _ = self.log.snapshot()
            exact = self._exact_samples(arr)
        return compute_stats(self.acc, exact)

    def meta(self) -> dict[str, Any]:
        from meshprof import __version__

        self._ensure_rank()
        self.flush()  # staged events count in the totals
        return {
            "meshprof_version": __version__,
            "torch_version": torch.__version__,
            "rank": self.rank,
            "world_size": self.world_size,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "created_ns": self.created_ns,
            "exported_ns": time.time_ns(),
            "total_events": self.log.total,
            "retained_events": len(self.log),
            "evicted_events": self.log.evicted,
            "dropped_events": self.acc.dropped,
            "internal_errors": self.internal_errors,
            "first_internal_error": self.first_internal_error,
            "groups": [
                {"name": g.name, "desc": g.desc, "ranks": list(g.ranks), "backend": g.backend}
                for g in self.log.groups
            ],
            "config": self.config.to_dict(),
        }

    def to_json_dict(self, since_id: int = 0, until_id: int | None = None) -> dict[str, Any]:
        return {
            "meta": self.meta(),
            "events": [e.to_dict() for e in self.events(since_id, until_id)],
            "stats": self.stats(since_id, until_id).to_dict(),
        }

    def export_json(
        self, path: str | os.PathLike[str], since_id: int = 0, until_id: int | None = None
    ) -> Path:
        """Write ``{"meta", "events", "stats"}`` to ``path`` atomically; returns the path."""
        from meshprof.rundir import atomic_write_text

        data = self.to_json_dict(since_id, until_id)
        return atomic_write_text(Path(path), json.dumps(data, default=_json_default))

    def summary(self, since_id: int = 0, until_id: int | None = None) -> str:
        """The statistics as a text table."""
        from meshprof.render.console import render_stats

        return render_stats(self.stats(since_id, until_id), header=f"rank {self._ensure_rank()}")

    def label(self, name: str, group: Any = None, metadata: dict[str, Any] | None = None) -> Any:
        """Context manager: record what runs inside as one op named ``name`` (a custom op)."""
        from meshprof.comm.hooks import composite_op

        return composite_op(self, name, group, metadata)

    # -- recording (called from the dispatcher kernels) ---------------------------------------
    def _internal_error(self, e: BaseException) -> None:
        self.internal_errors += 1
        if self.internal_errors == 1:
            self.first_internal_error = f"{type(e).__name__}: {e}"
            with contextlib.suppress(Exception):
                warnings.warn(
                    f"meshprof: internal error, recording continues: {self.first_internal_error}",
                    RuntimeWarning,
                    stacklevel=3,
                )

    def _ensure_rank(self) -> int:
        if self.rank < 0:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                self.rank = dist.get_rank()
                self.world_size = dist.get_world_size()
            else:
                return 0
        return self.rank

    def _group(self, pg: Any) -> tuple[int, int, int, tuple[int, ...], str]:
        """(index, size, crc of name, global ranks, name) of a Python ProcessGroup."""
        g = self._groups.get(pg)
        if g is None:
            import torch.distributed as dist

            name = str(pg.group_name)
            try:
                desc = str(pg.group_desc)
            except Exception:
                desc = ""
            try:
                ranks = tuple(int(r) for r in dist.get_process_group_ranks(pg))
            except Exception:
                ranks = tuple(range(pg.size()))
            try:
                backend = str(dist.get_backend(pg))
            except Exception:
                backend = ""
            idx = self.log.group_index(GroupInfo(name, desc, ranks, backend))
            g = (idx, len(ranks), zlib.crc32(name.encode()), ranks, name)
            self._groups[pg] = g
            self._ensure_rank()
        return g

    def _stack(self) -> list[_Rec]:
        s = getattr(self._tls, "stack", None)
        if s is None:
            s = self._tls.stack = []
        return s

    def _begin(self, spec: OpSpec, args: tuple[Any, ...]) -> _Rec | None:
        cfg = self.config
        if not cfg.enabled:
            return None
        stack = getattr(self._tls, "stack", None)
        if stack:
            top = stack[-1]
            top.in_bytes += spec.in_bytes(args)
            top.out_bytes += spec.out_bytes(args)
            top.meta["c10d_ops"] = top.meta.get("c10d_ops", 0) + 1
            return None
        pg = _PG.unbox(args[spec.pg])
        g = self._groups.get(pg)
        if g is None:
            g = self._group(pg)
        gidx, _gsize, crc, ranks, _ = g
        peer = -1
        if spec.p2p:
            if spec.peer_arg is not None:
                peer_local = int(args[spec.peer_arg])
                peer = ranks[peer_local] if 0 <= peer_local < len(ranks) else peer_local
            # recv from any source counts on its own (peer -1) so group seqs stay aligned
            key = (gidx, peer, 0 if spec.op == "send" else 1)
            seq = self._p2p_seq.get(key, 0)
            self._p2p_seq[key] = seq + 1
        else:
            seq = self._seq.get(gidx, 0)
            self._seq[gidx] = seq + 1
        op = spec.op
        if cfg.ops is not None and op not in cfg.ops:
            return None
        in_b = spec.in_bytes(args)
        out_b = spec.out_bytes(args)
        if (
            self._threshold < 4294967296
            and (((seq * 2654435761) ^ crc) & 0xFFFFFFFF) >= self._threshold
        ):
            # not sampled: counted exactly (folded into the statistics at flush), never retained
            self.log.append(
                (
                    self.log.op_code(op),
                    _OK,
                    0,
                    FLAG_DROPPED | FLAG_UNSAMPLED,
                    gidx,
                    peer,
                    seq,
                    in_b,
                    out_b,
                    0,
                    -1,
                    self.step,
                    None,
                    None,
                )
            )
            return None
        t = _first(args[spec.tensor_arg])
        rec = _Rec()
        rec.op = self.log.op_code(op)
        rec.op_name = op
        rec.group = gidx
        rec.peer = peer
        rec.seq = seq
        rec.in_bytes = in_b
        rec.out_bytes = out_b
        if t is None:
            rec.dtype = self.log.dtype_code("none")
        else:
            dt = t.dtype
            code = self._dtype_codes.get(dt)
            if code is None:
                code = self._dtype_codes[dt] = self.log.dtype_code(str(dt)[6:])
            rec.dtype = code
        # trailing arguments equal to their default (async_op=True) may be left out of the stack
        a = spec.async_arg
        rec.flags = FLAG_ASYNC if (a is not None and (a >= len(args) or args[a])) else 0
        rec.step = self.step
        rec.meta = {"coalesced": True} if spec.coalesced else None
        rec.composite = False
        rec.start_event = None
        rec.end_event = None
        rec.work = None
        rec.thread = get_ident()
        rec.token = token = next(self._tokens)
        if t is not None and t.is_cuda and cfg.device_timing:
            rec.start_event = torch.cuda.Event(enable_timing=True)
            rec.start_event.record()
            rec.flags |= FLAG_DEVICE_TIMING
        self._inflight[token] = rec
        rec.t0 = t0 = perf_counter_ns()
        rec.start_ns = t0 + self._wall_offset
        return rec

    def _finish(self, rec: _Rec, out: Any) -> None:
        """Arrange for the op's completion to be noticed.

        Host timing never puts a Python callback on the backend's thread (it would need the GIL
        there, stalling the backend's worker and skewing the timestamp by the GIL wait).
        Instead the op ends at whichever comes first: ``Work.wait()`` returning in Python (the
        caller's own thread: exact for synchronous collectives, which ``torch.distributed``
        waits on at once), or the poller seeing ``is_completed()`` (C++ callers such as DDP's
        reducer and functional collectives; 0.1–1 ms resolution).
        """
        try:
            work = out[1] if isinstance(out, tuple) and len(out) == 2 else out
            if work is None or isinstance(work, tuple):
                self._complete(rec, time.perf_counter_ns(), None)
                return
            w = _Work.unbox(work)
            if rec.start_event is not None:  # CUDA: the end event goes on the work's stream
                fut = w.get_future()
                if fut.done():
                    self._on_future(rec, fut)
                else:
                    fut.add_done_callback(functools.partial(self._on_future, rec))
                return
            rec.work = w
            self._by_work[id(w)] = (w, rec)
            # A work that goes back to Python code (a torch.distributed function or a
            # ProcessGroup method called from Python) is waited on there, where the Work.wait
            # hook completes it exactly: the poller only keeps a slow safety net for it. Works
            # of C++ callers (DDP's reducer, functional collectives) need the fast poller.
            caller = sys._getframe(2).f_globals.get("__name__", "")
            from_python = caller == "torch.distributed.distributed_c10d"
            self._poller.add(w, rec, from_python or not (rec.flags & FLAG_ASYNC))
        except Exception as e:
            self._inflight.pop(rec.token, None)
            self._internal_error(e)

    def _work_waited(self, w: Any, end: int, err: BaseException | None) -> None:
        """``Work.wait()`` returned (or raised) in Python: complete the op it belongs to."""
        entry = self._by_work.pop(id(w), None)
        if entry is not None and entry[0] is w:
            self._complete(entry[1], end, err)

    def _work_polled(self, rec: _Rec, end: int, err: BaseException | None) -> None:
        entry = self._by_work.get(id(rec.work)) if rec.work is not None else None
        if entry is not None and entry[1] is rec:
            self._by_work.pop(id(rec.work), None)
        self._complete(rec, end, err)

    def _on_future(self, rec: _Rec, fut: Any) -> None:
        end = time.perf_counter_ns()
        err: BaseException | None = None
        try:
            fut.value()
        except BaseException as e:
            err = e
        try:
            if rec.start_event is not None and err is None:
                rec.end_event = torch.cuda.Event(enable_timing=True)
                rec.end_event.record()  # on the stream the future synchronized with the work
                self._device_pending.append(rec)
                return
            self._complete(rec, end, err)
        except Exception as e:
            self._internal_error(e)

    def _fail(self, rec: _Rec, exc: BaseException) -> None:
        try:
            if rec.composite:
                stack = self._stack()
                if stack and stack[-1] is rec:
                    stack.pop()
                self._native_composite_exit(rec)
            rec.start_event = None
            self._complete(rec, time.perf_counter_ns(), exc)
        except Exception as e:
            self._internal_error(e)

    def _complete(
        self, rec: _Rec, end: int, err: BaseException | None, dur: int | None = None
    ) -> None:
        if self._inflight.pop(rec.token, None) is None:
            return  # already completed (by Work.wait or by the poller, whichever came first)
        work = rec.work
        rec.work = None
        if rec.peer < 0 and rec.op_name == "recv" and err is None and work is not None:
            self._resolve_any_source(rec, work)
        if dur is None:
            dur = end - rec.t0
        flags = rec.flags
        status = _OK
        error = None
        if err is not None:
            status = _ERR
            error = f"{type(err).__name__}: {err}"
        elif dur < self._min_ns:
            flags |= FLAG_DROPPED
        self.log.append(
            (
                rec.op,
                status,
                rec.dtype,
                flags,
                rec.group,
                rec.peer,
                rec.seq,
                rec.in_bytes,
                rec.out_bytes,
                rec.start_ns,
                dur,
                rec.step,
                error,
                rec.meta,
            )
        )

    def _resolve_any_source(self, rec: _Rec, work: Any) -> None:
        """A recv from any source learns its sender at completion (``Work._source_rank``): it
        gets that peer and the next seq of the (sender → this rank) direction, so it pairs with
        the sender's send like a recv that named its source. Exact when the pair's messages are
        all received from any source, or all by name (PyTorch matches each direction in order)."""
        try:
            src_local = int(work._source_rank())
            ranks = self.log.groups[rec.group].ranks
            src = ranks[src_local] if 0 <= src_local < len(ranks) else src_local
            with self._seq_lock:
                key = (rec.group, src, 1)
                seq = self._p2p_seq.get(key, 0)
                self._p2p_seq[key] = seq + 1
            rec.peer, rec.seq = src, seq
            rec.meta = {**(rec.meta or {}), "any_source": True}
        except Exception as e:
            self._internal_error(e)

    def _resolve_device(self) -> None:
        pending = self._device_pending
        for _ in range(len(pending)):
            rec = pending.popleft()
            try:
                if rec.end_event.query():
                    dur = int(rec.start_event.elapsed_time(rec.end_event) * 1e6)
                    self._complete(rec, 0, None, dur=dur)
                else:
                    pending.append(rec)
            except Exception as e:
                self._internal_error(e)

    def _begin_composite(
        self, label: str, group: Any, peer: int, metadata: dict[str, Any] | None = None
    ) -> _Rec | None:
        import torch.distributed as dist

        if group is None:
            group = dist.distributed_c10d._get_default_group()
        gidx, _gsize, _crc, _ranks, gname = self._group(group)
        if self._native is not None:  # one set of counters: the native recorder's
            p2p = (3 if label.startswith("send") else 4) if label in P2P_OPS else 0
            seq = int(self._native.mod.next_seq(gname, peer if p2p else -1, p2p))
        elif label in P2P_OPS:
            key = (gidx, peer, 0 if label.startswith("send") else 1)
            seq = self._p2p_seq.get(key, 0)
            self._p2p_seq[key] = seq + 1
        else:
            seq = self._seq.get(gidx, 0)
            self._seq[gidx] = seq + 1
        if self.config.ops is not None and label not in self.config.ops:
            return None
        rec = _Rec()
        rec.op = self.log.op_code(label)
        rec.op_name = label
        rec.group = gidx
        rec.peer = peer
        rec.seq = seq
        rec.in_bytes = 0
        rec.out_bytes = 0
        rec.dtype = self.log.dtype_code(
            "object" if label.endswith(("object", "object_list")) else "none"
        )
        rec.flags = 0
        rec.step = self.step
        rec.meta = dict(metadata or {})
        rec.meta["c10d_ops"] = 0
        rec.composite = True
        rec.start_event = None
        rec.end_event = None
        rec.work = None
        rec.thread = threading.get_ident()
        rec.token = next(self._tokens)
        self._inflight[rec.token] = rec
        if self._native is not None:
            self._native.mod.composite_enter()
        rec.t0 = time.perf_counter_ns()
        rec.start_ns = rec.t0 + self._wall_offset
        self._stack().append(rec)
        return rec

    def _native_composite_exit(self, rec: _Rec) -> None:
        if self._native is not None:
            in_b, out_b, n = self._native.mod.composite_exit()
            rec.in_bytes += int(in_b)
            rec.out_bytes += int(out_b)
            if rec.meta is not None:
                rec.meta["c10d_ops"] = rec.meta.get("c10d_ops", 0) + int(n)

    def _finish_composite(self, rec: _Rec) -> None:
        try:
            end = time.perf_counter_ns()
            stack = self._stack()
            if stack and stack[-1] is rec:
                stack.pop()
            self._native_composite_exit(rec)
            self._complete(rec, end, None)
        except Exception as e:
            self._internal_error(e)

    # -- helpers ------------------------------------------------------------------------------
    def _on_flush(self, chunk: np.ndarray) -> None:
        self._fold(self.acc, chunk)

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

    def _fold(self, acc: Accumulator, chunk: np.ndarray) -> None:
        acc.add_chunk(
            chunk, self._stats_rank(), self.log.op_name, self._stats_group, self._group_size
        )

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

    def _to_events(self, arr: np.ndarray, ids: np.ndarray) -> list[CommEvent]:
        if len(arr) == 0:
            return []
        groups = self.log.groups
        sizes = np.array([g.size for g in groups] or [1], dtype=np.int64)[arr["group"]]
        alg, bus = bandwidth_arrays(
            arr["op"], arr["in_bytes"], arr["out_bytes"], arr["duration_ns"], sizes
        )
        rank = max(self._ensure_rank(), 0)
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
                    error=self.log.errors.get(eid, ""),
                    metadata=self.log.metadata.get(eid) or {},
                    peer=peer,
                    step=step,
                    async_op=bool(flags & FLAG_ASYNC),
                )
            )
        return out


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    return str(o)


__all__ = ["EVENT_DTYPE", "CommProfiler", "InflightOp"]

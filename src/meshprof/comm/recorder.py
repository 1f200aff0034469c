"""The per-process collective recorder, ``CommProfiler``: the hot path of every recorded op.

A dispatcher kernel (:mod:`meshprof.comm.python_kernel`, or the C++ one in
:mod:`meshprof.comm.native`, both behind :class:`~meshprof.comm.backend.KernelBackend`) calls
:meth:`CommProfiler.begin` before a c10d op and :meth:`CommProfiler.fail` if it raises; completion
(:mod:`meshprof.comm.completion`) then calls :meth:`CommProfiler.complete`, which appends the
event to the log. ``begin`` assigns the collective its ``seq`` within its group (the same on every
member rank, :class:`SeqCounters`), decides sampling and notes the start. Composite ops (object
collectives, ``label()``) go through :meth:`begin_composite`. Every failure inside meshprof is
caught, counted and reported once. Times: ``perf_counter_ns`` on the hot path, wall-clock ns in
the log. The read side (events, stats, export) is :class:`~meshprof.comm.reads.RecordQueries`.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import warnings
import zlib
from typing import Any

import numpy as np
import torch

from meshprof.comm.backend import GroupRef, KernelBackend, SeqCounters, SeqSource
from meshprof.comm.completion import Completion, InflightOp, PendingOp, PendingOps
from meshprof.comm.composite import OpenComposites, composite_op, patch_object_collectives
from meshprof.comm.mesh_names import MeshNames
from meshprof.comm.ops import OpSpec, first_tensor
from meshprof.comm.patching import Patches
from meshprof.comm.reads import Reading, RecordQueries
from meshprof.comm.thread_cpu import recorder_cpu
from meshprof.config import ProfilerConfig
from meshprof.event_log import EventLog
from meshprof.events import (
    EVENT_DTYPE,
    FLAG_ASYNC,
    FLAG_DEVICE_TIMING,
    FLAG_DROPPED,
    FLAG_UNSAMPLED,
    STATUS_CODES,
    GroupInfo,
)
from meshprof.stats import Accumulator

_PG = torch._C._distributed_c10d.ProcessGroup
_OK = STATUS_CODES["ok"]
_ERR = STATUS_CODES["error"]
_PENDING = STATUS_CODES["pending"]
perf_counter_ns = time.perf_counter_ns

#: Seconds a read waits for the completion lock before it reads without it (a completion
#: interrupted by a signal whose handler writes the rank file holds it for good).
READ_LOCK_TIMEOUT_S = 1.0


class CommProfiler(RecordQueries):
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
        self.internal_errors = 0
        """Errors inside meshprof that were caught so training could go on."""
        self.first_internal_error = ""
        self.rank = -1
        self.world_size = -1
        self.seqs: SeqSource = SeqCounters()
        self.completion = Completion(self)
        """Completion of the ops recorded in Python (Work.wait hook, poller, CUDA events)."""
        self._backend: KernelBackend | None = None
        self._last_backend: KernelBackend | None = None
        self._patches = Patches()
        self.mesh_names = MeshNames()
        """The job's DeviceMesh dimension names of its groups (learnt while installed)."""
        self.mesh_names.on_error = self.report_internal_error
        self._groups: dict[Any, GroupRef] = {}
        self._dtype_codes: dict[Any, int] = {}  # torch.dtype -> the log's dtype code
        self._inflight: dict[int, PendingOp] = {}
        self._read_lock = threading.Lock()
        """Held by a Python-recorded op's completion (leaving ``_inflight``, entering the log)
        and by a read while it takes its instant: a read sees such an op in flight or
        completed, never both, never neither."""
        self._tokens = itertools.count(1)  # next() is atomic under the GIL
        self.composites = OpenComposites()
        """The composite ops (object collectives, labels) open now."""
        self._threshold = int(self.config.sample_rate * 2**32)
        self._min_ns = int(self.config.min_duration_us * 1000)
        self._wall_offset = time.time_ns() - time.perf_counter_ns()
        self.created_ns = time.time_ns()
        self.step_listeners: list[Any] = []
        """Callables ``(step)`` told each time the step changes (once per step, never per
        collective; they must not raise): the crash-safe store notes the step in its mapped
        cursor."""

    # -- installation -------------------------------------------------------------------------
    @property
    def installed(self) -> bool:
        return self._backend is not None

    @property
    def backend(self) -> KernelBackend | None:
        """The dispatcher kernel installed now (None when not installed)."""
        return self._backend

    @property
    def backend_name(self) -> str:
        """``"python"`` or ``"native"``: which kernel records now ("" when none is installed)."""
        return self._backend.name if self._backend is not None else ""

    def recorder_cpu(self) -> dict[str, Any]:
        """CPU used so far by meshprof's own threads in this process (pollers, writer, live
        publisher...): per thread name, in all, per collective recorded and per second of wall
        time since recording began (:func:`meshprof.comm.thread_cpu.recorder_cpu`)."""
        self.flush()  # the collectives finished so far count
        backend = self._backend or self._last_backend
        return recorder_cpu(
            backend.thread_cpu_ns if backend is not None else None,
            int(self.log.total),
            self.created_ns,
        )

    def recorder_info(self) -> dict[str, Any]:
        """Which kernel recorded (``kernel``: python or native, the last one installed) and,
        when the Python kernel handed over to the native one during the run, ``handover``:
        {from, to, at_ns} (or the build ``error`` that kept Python)."""
        backend = self._backend or self._last_backend
        if backend is None:
            return {"kernel": ""}
        out: dict[str, Any] = {"kernel": backend.name}
        describe = getattr(backend, "describe", None)
        if describe is not None:
            out["handover"] = describe()
        return out

    def install(self) -> None:
        """Register a kernel for every c10d op (:func:`~meshprof.comm.backend.choose_backend`),
        wrap the object collectives and ``DeviceMesh.__init__`` (the mesh names)."""
        if self._backend is not None:
            return
        from meshprof.comm.selection import choose_backend

        backend = choose_backend(self)
        self._backend = backend
        backend.install()
        patch_object_collectives(self, self._patches)
        try:
            self.mesh_names.install(self._patches)
        except Exception as e:
            self.report_internal_error(e)

    def uninstall(self) -> None:
        """Remove the kernel and the wrappers (no cost afterwards); recorded data stays."""
        backend = self._backend
        if backend is None:
            return
        self.flush()
        backend.uninstall()
        self.flush()  # what the kernel's last ops in flight recorded
        self._last_backend = backend
        self._backend = None
        self._patches.undo()

    # -- configuration and state --------------------------------------------------------------
    def update_config(self, **changes: Any) -> ProfilerConfig:
        """Change configuration fields in place (``max_events`` resizes the buffer, keeping the
        newest events)."""
        new = self.config.updated(**changes)
        if new.max_events != self.config.max_events:
            self.log = self.log.resized(new.max_events)
        self.config = new
        self._threshold = int(new.sample_rate * 2**32)
        self._min_ns = int(new.min_duration_us * 1000)
        if self._backend is not None:
            self._backend.configure()  # enabled, sampling and the ops filter live in C++ too
        return new

    def clear(self) -> None:
        """Forget every recorded event and statistic (group sequence numbers keep counting)."""
        self.completion.resolve_device()
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
        if self._backend is not None:
            self._backend.set_step(self._step)
        for listener in self.step_listeners:
            listener(self._step)

    def set_step(self, step: int) -> None:
        self.step = int(step)

    @property
    def wall_offset_ns(self) -> int:
        """Wall clock minus ``perf_counter_ns`` (refreshed at every flush)."""
        return self._wall_offset

    @property
    def min_duration_ns(self) -> int:
        """Ops shorter than this are counted in the statistics but not retained."""
        return self._min_ns

    def flush(self) -> None:
        """Complete the ops whose works have already finished, resolve finished device timings
        and move staged events into the buffer.

        Every read (``events()``, ``columns()``, ``stats()``, ``export_json``, a rank-file write)
        goes through here, so an op that completed before the read is in it even when nobody
        waited on it from Python (DDP's C++ reducer waits on its buckets itself) and the poller
        has not looked yet: one sweep of the pending works runs on the reading thread (no
        waiting: a work that is not complete stays pending)."""
        self._sweep()
        if self._backend is not None:
            try:
                self._backend.drain()
            except Exception as e:
                self.report_internal_error(e)
        self.log.flush()

    def _sweep(self) -> None:
        """Complete the ops whose works have finished (one sweep, no waiting) and the device
        timings that resolved; refresh the wall-clock offset. Never raises."""
        try:
            self.completion.settle(0)
            if self._backend is not None:
                self._backend.sweep()
        except Exception as e:
            self.report_internal_error(e)
        self.completion.resolve_device()
        self._wall_offset = time.time_ns() - time.perf_counter_ns()

    def settle(self, timeout_s: float = 0.2) -> None:
        """Notice every op that has completed, then flush: pending works are swept on this
        thread for up to ``timeout_s`` (an op that never completes, such as a gloo send nobody
        waits on, stays in flight). Called before a rank file's final write; never raises."""
        try:
            self.completion.settle(timeout_s)
            if self._backend is not None:
                self._backend.settle(timeout_s)
        except Exception as e:
            self.report_internal_error(e)
        try:
            self.flush()
        except Exception as e:
            self.report_internal_error(e)

    def read(self, *, events: bool = True, stats: bool = False) -> Reading:
        """One consistent read: the completed events and the collectives in flight at one
        instant, every collective issued so far in exactly one of the two (``events``: copy the
        retained completed events; ``stats``: the statistics at that instant, with the ops in
        flight counted as issued). An error inside meshprof while taking the instant is caught
        and counted (the read then holds what could be read).

        The instant: completion is swept as by :meth:`flush`, then, holding the completion lock
        (no Python-recorded op completes meanwhile) and the kernel's drain lock (no other thread
        moves native records into the log), the native kernel hands over its finished records
        and its ops not finished in one step, staged events go into the log, the Python ops in
        flight are copied and the log's count (and statistics) are noted. The ring is copied
        afterwards, cut at that count. Work per read: a copy of the ops in flight (few) and,
        with ``stats``, of the running statistics; nothing on the collective's path but the
        Python recorder's completion taking an uncontended lock."""
        self._sweep()
        pending = PendingOps.empty()
        mine: list[PendingOp] = []
        log = self.log
        total, chunks, acc = log.total, log.chunks, None
        locked = self._read_lock.acquire(timeout=READ_LOCK_TIMEOUT_S)
        try:
            backend = self._backend
            with backend.exclusive() if backend is not None else contextlib.nullcontext():
                if backend is not None:
                    pending = backend.drain(pending=True) or pending
                log.flush()
                mine = sorted(list(self._inflight.values()), key=lambda r: r.t0)
                with log.locked():
                    total, chunks = log.total, log.chunks
                    if stats:
                        acc = self.acc.copy()
        except Exception as e:
            self.report_internal_error(e)
        finally:
            if locked:
                self._read_lock.release()
        try:
            pending = pending.joined(self._pending_ops(mine))
        except Exception as e:
            self.report_internal_error(e)
        if stats and acc is None:  # the locked part failed: the totals as they are
            with log.locked():
                acc = self.acc.copy()
        if acc is not None and len(pending):
            self.fold(acc, pending.rows)
        arr, ids = np.zeros(0, dtype=EVENT_DTYPE), np.zeros(0, dtype=np.int64)
        if events:
            arr, ids = log.snapshot()
            if len(ids) and ids[-1] >= total:
                keep = ids < total
                arr, ids = arr[keep], ids[keep]
        return Reading(arr, ids, pending, total, chunks, acc)

    def _pending_ops(self, recs: list[PendingOp]) -> PendingOps:
        """The Python-recorded ops in flight as a read returns them."""
        if not recs:
            return PendingOps.empty()
        groups, dtypes = self.log.groups, self.log.dtypes
        now = time.perf_counter_ns()
        rows = np.empty(len(recs), dtype=EVENT_DTYPE)
        meta: dict[int, dict[str, Any]] = {}
        ops = []
        for i, rec in enumerate(recs):
            # a rec is in flight from begin(), which stamps its start last
            start = rec.start_ns or (now + self._wall_offset)
            rows[i] = (
                rec.op, _PENDING, rec.dtype, rec.flags, rec.group, rec.peer, rec.seq,
                rec.in_bytes, rec.out_bytes, start, -1, rec.step,
            )  # fmt: skip
            if rec.meta:
                meta[i] = dict(rec.meta)
            dtype = dtypes[rec.dtype] if rec.dtype < len(dtypes) else ""
            ops.append(rec.inflight(groups[rec.group], dtype, now))
        return PendingOps(rows, meta, ops)

    def inflight(self) -> list[InflightOp]:
        """Collectives issued and not yet completed, oldest first (cheap: no flush; a read
        that must agree with the events: :meth:`read`)."""
        now = time.perf_counter_ns()
        out = []
        if self._backend is not None:
            try:
                out += self._backend.inflight()
            except Exception as e:
                self.report_internal_error(e)
        groups, dtypes = self.log.groups, self.log.dtypes
        for rec in sorted(list(self._inflight.values()), key=lambda r: r.t0):
            dtype = dtypes[rec.dtype] if rec.dtype < len(dtypes) else ""
            out.append(rec.inflight(groups[rec.group], dtype, now))
        return out

    def label(self, name: str, group: Any = None, metadata: dict[str, Any] | None = None) -> Any:
        """Context manager: record what runs inside as one op named ``name`` (a custom op)."""
        return composite_op(self, name, group, metadata)

    def report_internal_error(self, e: BaseException) -> None:
        """Count an error inside meshprof that was caught so training goes on; warn once."""
        self.internal_errors += 1
        if self.internal_errors == 1:
            self.first_internal_error = f"{type(e).__name__}: {e}"
            with contextlib.suppress(Exception):
                warnings.warn(
                    f"meshprof: internal error, recording continues: {self.first_internal_error}",
                    RuntimeWarning,
                    stacklevel=3,
                )

    def ensure_rank(self) -> int:
        """This process's global rank, learnt from torch.distributed once it is initialized
        (0 until then; ``rank`` stays -1 until it is known)."""
        if self.rank < 0:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                self.rank = dist.get_rank()
                self.world_size = dist.get_world_size()
            else:
                return 0
        return self.rank

    def group_of(self, pg: Any) -> GroupRef:
        """The recorder's reference to a Python ProcessGroup (registered in the log on first
        use)."""
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
            g = GroupRef(idx, len(ranks), zlib.crc32(name.encode()), ranks, name)
            self._groups[pg] = g
            self.ensure_rank()
        return g

    # -- the hot path (called by the kernels and completion) ----------------------------------
    def begin(self, spec: OpSpec, args: tuple[Any, ...]) -> PendingOp | None:
        """A c10d op is about to run (Python kernel): number it, sample it, note its start.
        None: not recorded on its own (disabled, filtered, not sampled, inside a composite)."""
        cfg = self.config
        if not cfg.enabled:
            return None
        top = self.composites.top()
        if top is not None:
            top.in_bytes += spec.in_bytes(args)
            top.out_bytes += spec.out_bytes(args)
            if top.meta is not None:
                top.meta["c10d_ops"] = top.meta.get("c10d_ops", 0) + 1
            return None
        pg = _PG.unbox(args[spec.pg])
        g = self._groups.get(pg)
        if g is None:
            g = self.group_of(pg)
        gidx, _gsize, crc, ranks, _ = g
        peer = -1
        if spec.peer_arg is not None:
            peer_local = int(args[spec.peer_arg])
            peer = ranks[peer_local] if 0 <= peer_local < len(ranks) else peer_local
        op = spec.op
        seq = self.seqs.next(gidx, op, peer)
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
                (self.log.op_code(op), _OK, 0, FLAG_DROPPED | FLAG_UNSAMPLED, gidx, peer, seq,
                 in_b, out_b, 0, -1, self.step, None, None)
            )  # fmt: skip
            return None
        t = first_tensor(spec, args)
        if t is None:
            dtype = self.log.dtype_code("none")
        else:
            code = self._dtype_codes.get(t.dtype)
            if code is None:
                code = self._dtype_codes[t.dtype] = self.log.dtype_code(str(t.dtype)[6:])
            dtype = code
        # trailing arguments equal to their default (async_op=True) may be left out of the stack
        a = spec.async_arg
        flags = FLAG_ASYNC if (a is not None and (a >= len(args) or args[a])) else 0
        meta = {"coalesced": True} if spec.coalesced else None
        start_event = None
        if t is not None and t.is_cuda and cfg.device_timing:
            start_event = torch.cuda.Event(enable_timing=True)
            start_event.record()
            flags |= FLAG_DEVICE_TIMING
        rec = self.start_op(op, gidx, peer, seq, dtype, in_b, out_b, flags, meta, False)
        rec.start_event = start_event
        rec.t0 = t0 = perf_counter_ns()
        rec.start_ns = t0 + self._wall_offset
        return rec

    def start_op(
        self,
        op: str,
        gidx: int,
        peer: int,
        seq: int,
        dtype: int,
        in_b: int,
        out_b: int,
        flags: int,
        meta: dict[str, Any] | None,
        composite: bool,
    ) -> PendingOp:
        """The one record fill: a PendingOp in flight (the caller stamps its start time last)."""
        token = next(self._tokens)
        rec = PendingOp(
            self.log.op_code(op), op, gidx, peer, seq, dtype, in_b, out_b, flags, self.step,
            meta, composite, token,
        )  # fmt: skip
        self._inflight[token] = rec
        return rec

    def fail(self, rec: PendingOp, exc: BaseException) -> None:
        """The op raised: record it with the error."""
        try:
            if rec.composite:
                self.composites.pop(rec, self._backend)
            rec.start_event = None
            self.complete(rec, time.perf_counter_ns(), exc)
        except Exception as e:
            self.report_internal_error(e)

    def discard(self, rec: PendingOp) -> None:
        """Forget an op in flight without recording it (its completion could not be watched)."""
        self._inflight.pop(rec.token, None)

    def complete(
        self, rec: PendingOp, end: int, err: BaseException | None, dur: int | None = None
    ) -> None:
        """The op ended at ``end`` (perf_counter_ns): append its event. With ``dur`` (the device
        time of a CUDA-timed op) ``end`` is when the host saw it complete, kept as
        ``metadata.host_duration_ns``. The first completion wins (Work.wait or the poller,
        whichever noticed it first)."""
        # leaving _inflight and entering the log are one step for a read (read())
        with self._read_lock:
            if self._inflight.pop(rec.token, None) is None:
                return
            work = rec.work
            rec.work = None
            if rec.peer < 0 and rec.op_name == "recv" and err is None and work is not None:
                self._resolve_any_source(rec, work)
            meta = rec.meta
            if dur is None:
                dur = end - rec.t0
            elif end:
                meta = {**(meta or {}), "host_duration_ns": end - rec.t0}
            flags = rec.flags
            status = _OK
            error = None
            if err is not None:
                status = _ERR
                error = f"{type(err).__name__}: {err}"
            elif dur < self._min_ns:
                flags |= FLAG_DROPPED
            full = self.log.stage(
                (rec.op, status, rec.dtype, flags, rec.group, rec.peer, rec.seq, rec.in_bytes,
                 rec.out_bytes, rec.start_ns, dur, rec.step, error, meta)
            )  # fmt: skip
        if full:
            self.log.flush()

    def _resolve_any_source(self, rec: PendingOp, work: Any) -> None:
        """A recv from any source learns its sender at completion (``Work._source_rank``): it
        gets that peer and the next seq of the (sender → this rank) direction, so it pairs with
        the sender's send like a recv that named its source. Exact when the pair's messages are
        all received from any source, or all by name (PyTorch matches each direction in order)."""
        try:
            src_local = int(work._source_rank())
            ranks = self.log.groups[rec.group].ranks
            src = ranks[src_local] if 0 <= src_local < len(ranks) else src_local
            rec.peer, rec.seq = src, self.seqs.next(rec.group, "recv", src)
            rec.meta = {**(rec.meta or {}), "any_source": True}
        except Exception as e:
            self.report_internal_error(e)

    # -- composite ops (object collectives, label()): see meshprof.comm.composite -----------
    def begin_composite(
        self, label: str, group: Any, peer: int, metadata: dict[str, Any] | None = None
    ) -> PendingOp | None:
        """A composite op starts: the c10d ops issued inside count into it until it ends."""
        return self.composites.begin(self, label, group, peer, metadata)

    def finish_composite(self, rec: PendingOp) -> None:
        self.composites.finish(self, rec)

    @property
    def open_composites(self) -> int:
        """Composite ops open on any thread: a kernel handover waits until none is (their inner
        ops must stay inside them)."""
        return self.composites.count

    def _on_flush(self, chunk: np.ndarray) -> None:
        self.fold(self.acc, chunk)


__all__ = ["EVENT_DTYPE", "CommProfiler", "InflightOp"]

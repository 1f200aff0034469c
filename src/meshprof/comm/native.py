"""The dispatcher kernel in C++ (one :class:`~meshprof.comm.backend.KernelBackend`), built and
cached: the same records as the Python kernel, about 20× cheaper per collective.

The default kernel wherever it can run (:mod:`meshprof.comm.selection`); built once per host and
torch build by :mod:`meshprof.comm.native_ext` (``torch.utils.cpp_extension``, about 30 s;
needs a C++ compiler). The C++ kernel
runs at the same ``BackendSelect`` key for every ``c10d::`` op, assigns seq with the same rules,
samples with the same hash and takes completion from the Work's future (a C++ callback, no GIL)
or, for works without one (gloo's send/recv; each Work class is asked for its future once), from
``Work.wait()`` returning in Python (``work_waited``), with a C++ polling thread (1 ms, backing off
to 20 ms) as the safety net for works nobody waits on. Python drains finished records into the
event log at every flush. Its table of op argument layouts comes from :mod:`meshprof.comm.ops`.

On CUDA (an extension built with CUDA: ``torch.cuda.is_available()`` and ``CUDA_HOME``) an op
on CUDA tensors is timed on the device without ever synchronizing the host: by the work's own
start/end events when its backend keeps them (ProcessGroupNCCL with
``TORCH_NCCL_ENABLE_TIMING=1``: ``Work::getDuration()``), else by CUDA events the kernel records
on the issuing stream and on the stream the work's future completes on. A record waits, after its
host completion, until its end event has been reached (queried at every drain); its
``duration_ns`` is then the device time and ``metadata.host_duration_ns`` the host's issue to
completion, as the Python kernel reports them. With CUDA present the native kernel is opt-in
(``native=True``) until that path is verified on a GPU
(:func:`meshprof.comm.selection.native_supports_device`).
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from typing import Any

import numpy as np

from meshprof.comm.backend import GroupRef, RecorderCore
from meshprof.comm.completion import (
    InflightOp,
    PendingOps,
    is_bound_in_cpp,
    patch_work_wait,
    wrap_wait_native,
)
from meshprof.comm.native_ext import load
from meshprof.comm.ops import available_specs
from meshprof.comm.patching import Patches
from meshprof.errors import MeshprofError
from meshprof.events import (
    EVENT_DTYPE,
    FLAG_ASYNC,
    FLAG_DEVICE_TIMING,
    FLAG_DROPPED,
    FLAG_UNSAMPLED,
    OP_CODES,
    P2P_OPS,
    STATUS_CODES,
    GroupInfo,
)

#: Finished records waiting in C++ that wake the drainer thread (76 B each: 4.75 MiB).
BACKLOG_RECORDS = 65536

#: Seconds uninstall() waits for native ops still in flight to complete before the last drain.
SETTLE_ON_UNINSTALL_S = 0.5

#: Mirror of ``struct Rec`` in native_kernel.cpp (packed, 76 bytes).
NATIVE_DTYPE = np.dtype(
    [
        ("op", np.uint8),
        ("status", np.uint8),
        ("dtype", np.int16),
        ("flags", np.uint8),
        ("sampled", np.uint8),
        ("group", np.uint16),
        ("peer", np.int32),
        ("seq", np.int64),
        ("in_bytes", np.int64),
        ("out_bytes", np.int64),
        ("t0", np.int64),
        ("dur", np.int64),
        ("step", np.int64),
        ("token", np.int64),
        ("host_dur", np.int64),
    ]
)

#: Rec.flags bits of the C++ kernel beyond the event log's own (FLAG_ASYNC, FLAG_DEVICE_TIMING)
_DEVICE_ABANDONED = 0x40
_LOG_FLAGS = FLAG_ASYNC | FLAG_DEVICE_TIMING

#: Seconds after its host completion that a record waits for its device end before it keeps
#: its host duration (``metadata.device_timing_abandoned``).
DEVICE_TIMEOUT_S = 300.0

#: c10::ScalarType codes -> dtype names
_SCALAR_TYPES = {
    0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32",
    7: "float64", 8: "complex32", 9: "complex64", 10: "complex128", 11: "bool", 15: "bfloat16",
    23: "float8_e5m2", 24: "float8_e4m3fn",
}  # fmt: skip


class NativeKernel:
    """The installed C++ kernel of one CommProfiler, and the translation of its records."""

    name = "native"

    def __init__(self, prof: RecorderCore) -> None:
        self.prof = prof
        self.mod = load()
        self._group_map: dict[int, int] = {}  # native group id -> the log's group index
        self._dtype_codes: dict[int, int] = {}
        self._patches = Patches()
        self._drain_lock = threading.RLock()
        self.names: list[str] = []
        self._drainer_stop: threading.Event | None = None
        self._drainer: threading.Thread | None = None
        if self.mod.record_size() != NATIVE_DTYPE.itemsize:
            raise MeshprofError("the native recorder was built from another meshprof version")
        reset_seqs = getattr(self.mod, "reset_seqs", None)
        if reset_seqs is not None:  # a new profiler numbers from 0, as the Python kernel does
            reset_seqs()

    def configure(self) -> None:
        cfg = self.prof.config
        table = [spec.native_row(OP_CODES[spec.op]) for spec in available_specs()]
        mask = 0
        for name, code in OP_CODES.items():
            if cfg.ops is None or name in cfg.ops:
                mask |= 1 << code
        self.mod.configure(table, int(cfg.sample_rate * 2**32), mask)
        self.mod.set_enabled(bool(cfg.enabled))
        self.mod.set_device_timing(bool(cfg.device_timing))
        self.mod.set_device_timeout(int(DEVICE_TIMEOUT_S * 1e9))
        self.names = [str(t[0]) for t in table]

    def install(self) -> None:
        self.configure()
        typed = os.environ.get("MESHPROF_NATIVE_TYPED", "1") != "0"
        autograd = os.environ.get("MESHPROF_NATIVE_AUTOGRAD", "1") != "0"
        self.mod.install(self.names, typed, autograd)
        self.set_step(self.prof.step)
        self._patch_work_wait()
        self._patch_destroy()
        self._start_drainer()

    def _patch_destroy(self) -> None:
        """Drain before ``torch.distributed.destroy_process_group``: the C++ records name their
        group only, and its description and members are looked up by name when the records are
        drained; once the group is destroyed that lookup finds nothing, and a short job whose
        first drain came after its ``destroy_process_group()`` recorded its groups without
        members."""
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        original = c10d.destroy_process_group
        prof = self.prof

        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            try:
                prof.flush()
            except Exception as e:  # never in the user's way
                prof.report_internal_error(e)
            return original(*args, **kwargs)

        destroy_process_group.__wrapped__ = original  # type: ignore[attr-defined]
        destroy_process_group.__doc__ = original.__doc__
        for owner in (dist, c10d):
            if getattr(owner, "destroy_process_group", None) is original:
                self._patches.replace(
                    owner, "destroy_process_group", destroy_process_group, original
                )

    def _start_drainer(self) -> None:
        """A ``meshprof-drain`` thread that sleeps in C++ (without the GIL) until
        :data:`BACKLOG_RECORDS` finished records wait there, then flushes them into the event
        log (its ring is bounded by ``max_events``): a process nobody reads keeps a bounded
        backlog instead of ~80 B per collective for the whole run. Readers (``meshprof run``'s
        writer, ``events()``, ...) drain as before; this only wakes when they fall behind."""
        wait = getattr(self.mod, "wait_backlog", None)
        if wait is None:  # a build from before the backlog bound
            return
        self.mod.set_backlog_cap(BACKLOG_RECORDS)
        stop = self._drainer_stop = threading.Event()

        def loop() -> None:
            while not stop.is_set():
                try:
                    if wait(1000) and not stop.is_set():
                        self.prof.flush()
                except Exception as e:  # never let the thread die silently
                    self.prof.report_internal_error(e)
                    stop.wait(1.0)

        self._drainer = threading.Thread(target=loop, name="meshprof-drain", daemon=True)
        self._drainer.start()
        # stopped before the interpreter finalizes: a daemon thread that came back from C++
        # then would be ended inside pybind's GIL guard (std::terminate)
        atexit.register(self._stop_drainer)

    def _stop_drainer(self) -> None:
        stop = self._drainer_stop
        if stop is None:
            return
        self._drainer_stop = None
        atexit.unregister(self._stop_drainer)
        stop.set()
        self.mod.stop_backlog()
        drainer, self._drainer = self._drainer, None
        if drainer is not None and drainer is not threading.current_thread():
            drainer.join(timeout=5.0)

    def _patch_work_wait(self) -> None:
        """A future-less work (gloo's send/recv) waited on from Python ends when its wait
        returns (the C++ poller then only backs up works nobody waits on, so it can poll
        slowly: 1 ms, backing off to 20 ms)."""
        try:
            waited = self.mod.work_waited
        except AttributeError:  # a build from before this hook: keep its fast poller
            return
        method = getattr(self.mod, "wait_method", None)

        def wrap(cls: type, original: Any) -> Any:
            if method is not None and is_bound_in_cpp(original):
                return method(cls, getattr(original, "__doc__", None))  # no Python frame
            return wrap_wait_native(waited, original)  # a wait written in Python

        patch_work_wait(self._patches, wrap)
        self.mod.set_poll_interval(1000, 20000)

    def uninstall(self) -> None:
        self._stop_drainer()
        self.mod.uninstall()
        self.settle(SETTLE_ON_UNINSTALL_S)  # ops still in flight end in C++: wait for them
        self._patches.undo()

    def set_step(self, step: int) -> None:
        self.mod.set_step(int(step))

    def next_seq(self, group: GroupRef, op: str, peer: int) -> int:
        """The C++ counters number every op of a group: composite ops take theirs from them.
        Point-to-point ones (``send_object_list``) share the counter of the c10d sends to that
        peer, as in the Python kernel (:class:`~meshprof.comm.recorder.SeqCounters`), so both
        kernels number a job alike (a handover keeps ranks aligned)."""
        if op in P2P_OPS:
            local = group.ranks.index(peer) if peer in group.ranks else peer
            return int(self.mod.next_seq(group.name, local, 1 if op.startswith("send") else 2))
        return int(self.mod.next_seq(group.name, -1, 0))

    def continue_seqs(self, counts: dict[tuple[str, int, int], int]) -> None:
        """Go on from another kernel's counters: ``counts`` maps (group name, group-local peer
        or -1, 0 collective / 1 send / 2 recv) to the next number. The extension has no setter:
        its counters are advanced one by one (about 0.3 µs each, once per handover)."""
        for (name, peer, p2p), n in counts.items():
            if n <= 0:
                continue
            s = int(self.mod.next_seq(name, peer, p2p))
            while s < n - 1:
                s = int(self.mod.next_seq(name, peer, p2p))

    def composite_enter(self) -> None:
        self.mod.composite_enter()

    def thread_cpu_ns(self) -> dict[str, int]:
        reader = getattr(self.mod, "poller_cpu_ns", None)  # absent from older builds
        ns = int(reader()) if reader is not None else 0
        return {"meshprof-native-poller": ns} if ns > 0 else {}

    def composite_exit(self) -> tuple[int, int, int]:
        in_b, out_b, n = self.mod.composite_exit()
        return int(in_b), int(out_b), int(n)

    # -- translation --------------------------------------------------------------------------
    def _group(self, native_id: int, names: list[str]) -> int:
        idx = self._group_map.get(native_id)
        if idx is not None:
            return idx
        name = names[native_id] if native_id < len(names) else str(native_id)
        pg = None
        try:
            import torch

            pg = torch._C._distributed_c10d._resolve_process_group(name)  # type: ignore[arg-type]
        except Exception:
            pg = None
        if pg is not None:
            try:
                idx = self.prof.group_of(pg).log_index
            except Exception:
                idx = None
        if idx is None:
            idx = self.prof.log.group_index(GroupInfo(name, "", ()))
        self._group_map[native_id] = idx
        return idx

    def _dtype(self, code: int) -> int:
        c = self._dtype_codes.get(code)
        if c is None:
            name = "none" if code < 0 else _SCALAR_TYPES.get(code, f"scalar_type_{code}")
            c = self._dtype_codes[code] = self.prof.log.dtype_code(name)
        return c

    def _peer(self, gidx: int, local: int) -> int:
        if local < 0:
            return -1
        ranks = self.prof.log.groups[gidx].ranks
        return ranks[local] if local < len(ranks) else local

    def drain(self, pending: bool = False) -> PendingOps | None:
        """Move finished native records into the event log (called by ``CommProfiler.flush``),
        as one array: the records are converted column by column (numpy), so a drain costs a
        few µs plus well under a µs per record, not a Python tuple per record.

        With ``pending``: also the native ops not finished at that moment (in flight, or waiting
        for their device end), taken from C++ in the same lock as the finished records, so each
        op is either moved into the log by this drain or returned here, never both and never
        neither (a read holds :meth:`exclusive` around it, so no other drain moves an op that
        finished afterwards into the log before the read is complete).

        One drain at a time, start to end: a reader whose drain comes while another thread's
        (the rank writer's tick) holds records taken from C++ but not yet in the log waits for
        it, so it never reads the log without them. Re-entrant: a signal handler's final write
        on a thread that was draining goes on (without the records that drain holds)."""
        with self._drain_lock:
            raw, names, errors, open_raw = self.mod.drain(pending)
            if raw:
                self._append(raw, names, errors)
            if not pending:
                return None
            return self._pending(open_raw, names)

    def exclusive(self) -> Any:
        """Hold the drain lock: no other thread drains until the caller is done (a read takes
        the pending ops and the log's state at one instant under it)."""
        return self._drain_lock

    def _pending(self, raw: bytes, names: list[str]) -> PendingOps:
        """Native records of ops not finished yet as event-log rows (status pending, duration
        -1, the issue time) and as :class:`InflightOp` (age from C++'s clock), oldest first."""
        recs = np.frombuffer(raw, dtype=NATIVE_DTYPE)
        if len(recs) == 0:
            return PendingOps.empty()
        recs = recs[np.argsort(recs["t0"], kind="stable")]
        prof = self.prof
        gidx = np.array([self._group(g, names) for g in recs["group"].tolist()], dtype=np.int64)
        rows = np.empty(len(recs), dtype=EVENT_DTYPE)
        rows["op"] = recs["op"]
        rows["status"] = STATUS_CODES["pending"]
        rows["dtype"] = [self._dtype(d) for d in recs["dtype"].tolist()]
        rows["flags"] = recs["flags"] & _LOG_FLAGS
        rows["group"] = gidx
        rows["peer"] = [
            self._peer(g, p) for g, p in zip(gidx.tolist(), recs["peer"].tolist(), strict=True)
        ]
        rows["seq"] = recs["seq"]
        rows["in_bytes"] = recs["in_bytes"]
        rows["out_bytes"] = recs["out_bytes"]
        rows["start_ns"] = recs["t0"] + prof.wall_offset_ns
        rows["duration_ns"] = -1
        rows["step"] = recs["step"]
        now = int(self.mod.now())
        ops = [
            self._inflight_op(r, int(t0), now)
            for r, t0 in zip(rows, recs["t0"].tolist(), strict=True)
        ]
        return PendingOps(rows, {}, ops)

    def _inflight_op(self, row: np.void, t0: int, now: int) -> InflightOp:
        log = self.prof.log
        info = log.groups[int(row["group"])]
        dtype = int(row["dtype"])
        return InflightOp(
            op=log.op_name(int(row["op"])),
            group_name=info.name,
            group_ranks=info.ranks,
            seq=int(row["seq"]),
            peer=int(row["peer"]),
            dtype=log.dtypes[dtype] if dtype < len(log.dtypes) else "",
            in_bytes=int(row["in_bytes"]),
            out_bytes=int(row["out_bytes"]),
            start_ns=int(row["start_ns"]),
            age_ns=now - t0,
            thread_id=0,
        )

    def _append(self, raw: bytes, names: list[str], errors: list[tuple[int, str]]) -> None:
        """Translate packed native records into one chunk of the event log."""
        recs = np.frombuffer(raw, dtype=NATIVE_DTYPE)
        prof = self.prof
        n = len(recs)
        gids = recs["group"].astype(np.int64)
        gmap = np.zeros(int(gids.max()) + 1, dtype=np.int64)
        for g in np.unique(gids).tolist():
            gmap[g] = self._group(g, names)
        gidx = gmap[gids]
        dtypes = recs["dtype"].astype(np.int64)
        dmap = {d: self._dtype(d) for d in np.unique(dtypes).tolist()}
        dcode = (
            np.array([dmap[d] for d in dtypes.tolist()], dtype=np.uint8)
            if len(dmap) > 1
            else (np.full(n, next(iter(dmap.values())), dtype=np.uint8))
        )
        peer = np.full(n, -1, dtype=np.int32)
        local = recs["peer"]
        has = local >= 0
        if has.any():
            for g in np.unique(gidx[has]).tolist():
                ranks = np.asarray(prof.log.groups[g].ranks, dtype=np.int64)
                sel = has & (gidx == g)
                pl = local[sel].astype(np.int64)
                inside = pl < len(ranks)
                peer[sel] = np.where(inside, ranks[np.minimum(pl, max(len(ranks) - 1, 0))], pl)
        sampled = recs["sampled"] != 0
        status = recs["status"]
        flags = (recs["flags"] & _LOG_FLAGS).astype(np.uint8)
        flags[~sampled] |= FLAG_DROPPED | FLAG_UNSAMPLED
        flags[sampled & (status == 0) & (recs["dur"] < prof.min_duration_ns)] |= FLAG_DROPPED
        chunk = np.empty(n, dtype=EVENT_DTYPE)
        chunk["op"] = recs["op"]
        chunk["status"] = status
        chunk["dtype"] = dcode
        chunk["flags"] = flags
        chunk["group"] = gidx
        chunk["peer"] = peer
        chunk["seq"] = recs["seq"]
        chunk["in_bytes"] = recs["in_bytes"]
        chunk["out_bytes"] = recs["out_bytes"]
        chunk["start_ns"] = np.where(sampled, recs["t0"] + prof.wall_offset_ns, 0)
        chunk["duration_ns"] = np.where(sampled, recs["dur"], -1)
        chunk["step"] = recs["step"]
        err_text: dict[int, str] = {}
        if errors:
            err = dict(errors)
            for i in np.flatnonzero(status != 0).tolist():
                text = err.get(int(recs["token"][i]))
                if text is not None:
                    err_text[i] = text
        meta: dict[int, dict[str, Any]] = {}
        dev = (recs["flags"] & FLAG_DEVICE_TIMING) != 0
        if dev.any():
            hd = recs["host_dur"]
            meta.update({i: {"host_duration_ns": int(hd[i])} for i in np.flatnonzero(dev).tolist()})
        gone = ~dev & ((recs["flags"] & _DEVICE_ABANDONED) != 0)
        if gone.any():
            meta.update(
                {i: {"device_timing_abandoned": True} for i in np.flatnonzero(gone).tolist()}
            )
        prof.log.append_chunk(chunk, err_text, meta)

    def settle(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the native ops in flight to complete (their completion
        runs in C++: future callbacks, the poller)."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        while self.mod.inflight_records() or self._device_pending():
            if time.monotonic() >= deadline:
                return
            time.sleep(0.001)

    def _device_pending(self) -> bool:
        """Whether records wait for their device end (resolved at the next drain)."""
        try:
            return bool(self.mod.device_pending_count())
        except AttributeError:  # a build from before device timing
            return False

    def sweep(self) -> None:
        """One pass of the C++ poller's check on this thread (GIL released): polled works that
        have finished complete now. Works with a future complete in their C++ callback."""
        self.mod.sweep()

    def inflight(self) -> list[InflightOp]:
        """The native ops in flight, oldest first."""
        raw = self.mod.inflight_records()
        if not raw:
            return []
        names = self.mod.group_names()
        now = self.mod.now()
        out = []
        for r in sorted(np.frombuffer(raw, dtype=NATIVE_DTYPE).tolist(), key=lambda r: r[10]):
            op, _st, dtype, _f, _s, g, peer, seq, in_b, out_b, t0, _d, _step, _tok, _hd = r
            gidx = self._group(g, names)
            info = self.prof.log.groups[gidx]
            out.append(
                InflightOp(
                    op=self.prof.log.op_name(op),
                    group_name=info.name,
                    group_ranks=info.ranks,
                    seq=seq,
                    peer=self._peer(gidx, peer),
                    dtype=self.prof.log.dtypes[self._dtype(dtype)],
                    in_bytes=in_b,
                    out_bytes=out_b,
                    start_ns=t0 + self.prof.wall_offset_ns,
                    age_ns=now - t0,
                    thread_id=0,
                )
            )
        return out

"""Noticing when a collective issued through the Python kernel completes.

An op ends at whichever comes first: ``Work.wait()`` returning in Python (the caller's own thread:
exact for synchronous collectives, which ``torch.distributed`` waits on at once), or the
:class:`Poller` seeing ``is_completed()`` (C++ callers such as DDP's reducer and functional
collectives; 0.1–1 ms resolution). On CUDA the duration comes from a pair of CUDA events,
resolved later at a flush, never by synchronizing the host. Times are ``perf_counter_ns``.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from meshprof.comm.patching import Patches
from meshprof.events import EVENT_DTYPE, FLAG_ASYNC, FLAG_DEVICE_TIMING, GroupInfo

_Work = torch._C._distributed_c10d.Work


@dataclass(slots=True, eq=False)
class PendingOp:
    """A collective between issue and completion (what the recorder fills at issue)."""

    op: int = 0
    """Op code in the event log."""
    op_name: str = ""
    group: int = 0
    """Group index in the event log."""
    peer: int = -1
    """Global rank of the peer (point-to-point; -1: none or not known yet)."""
    seq: int = 0
    dtype: int = 0
    """Dtype code in the event log."""
    in_bytes: int = 0
    out_bytes: int = 0
    flags: int = 0
    step: int = -1
    meta: dict[str, Any] | None = None
    composite: bool = False
    """An object collective or a ``label()``: c10d ops inside add their bytes to it."""
    token: int = 0
    """Key of the op among the recorder's ops in flight."""
    work: Any = None
    """The op's c10d Work while completion is awaited through it."""
    start_event: Any = None
    end_event: Any = None
    host_end: int = 0
    """CUDA-timed: when the host saw the work complete, ``perf_counter_ns``."""
    thread: int = field(default_factory=threading.get_ident)
    t0: int = 0
    """Issue time, ``perf_counter_ns``."""
    start_ns: int = 0
    """Issue time, wall clock (ns since the epoch)."""

    def inflight(self, group: GroupInfo, dtype: str, now: int) -> InflightOp:
        """This op as the watchdog sees it (``now``: perf_counter_ns)."""
        return InflightOp(
            self.op_name, group.name, group.ranks, self.seq, self.peer, dtype, self.in_bytes,
            self.out_bytes, self.start_ns, now - self.t0, self.thread,
        )  # fmt: skip


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


@dataclass(frozen=True, slots=True)
class PendingOps:
    """The ops issued and not finished at one instant, as one read of the recorder sees them
    (:meth:`meshprof.comm.recorder.CommProfiler.read`): the same ops twice, as event-log rows
    and as :class:`InflightOp`, oldest issue first."""

    rows: np.ndarray
    """EVENT_DTYPE rows: status ``pending``, ``duration_ns`` -1, ``start_ns`` the issue time
    (wall clock), the other columns as the completed event will have them."""
    metadata: dict[int, dict[str, Any]]
    """Metadata by row index (only rows that have some)."""
    ops: list[InflightOp]
    """The same ops with their age and issuing thread (0 when unknown)."""

    @staticmethod
    def empty() -> PendingOps:
        return PendingOps(np.zeros(0, dtype=EVENT_DTYPE), {}, [])

    def __len__(self) -> int:
        return len(self.rows)

    def joined(self, other: PendingOps) -> PendingOps:
        """Both sets, oldest issue first."""
        if not len(other):
            return self
        if not len(self):
            return other
        rows = np.concatenate([self.rows, other.rows])
        order = np.argsort(rows["start_ns"], kind="stable")
        meta = {**self.metadata, **{len(self) + i: m for i, m in other.metadata.items()}}
        ops = [*self.ops, *other.ops]
        where = {int(old): new for new, old in enumerate(order.tolist())}
        return PendingOps(
            rows[order],
            {where[i]: m for i, m in meta.items()},
            [ops[i] for i in order.tolist()],
        )


class CompletionSink(Protocol):
    """What completion reports to (the recorder)."""

    def complete(
        self, rec: PendingOp, end: int, err: BaseException | None, dur: int | None = None
    ) -> None: ...

    def discard(self, rec: PendingOp) -> None: ...

    def report_internal_error(self, e: BaseException) -> None: ...


class Poller:
    """Notices completion of works that nobody waits on from Python, by polling
    ``is_completed()`` on a daemon thread.

    Two tiers: works of asynchronous ops (DDP's reducer, functional collectives, ``async_op=True``
    calls) are polled every 0.1 ms, backing off to 1 ms while none completes; works of synchronous
    calls, which ``torch.distributed`` waits on at once (so the ``Work.wait`` hook completes
    them), are only a safety net swept every 20 ms. With nothing pending the thread sleeps on an
    event, so an idle or synchronous-only job pays nothing for it. The poller never waits on a
    work: works that only complete in their caller's wait (gloo's reduce_scatter) are not
    polled at all (:meth:`Completion.watch`).
    """

    SLOW_S = 0.020
    FAST_MIN_S = 0.0001
    FAST_MAX_S = 0.001

    def __init__(self, done: Callable[[PendingOp, int, BaseException | None], None]) -> None:
        self._done = done
        self._fast: deque[tuple[Any, PendingOp]] = deque()
        self._slow: deque[tuple[Any, PendingOp]] = deque()
        self._wake = threading.Event()
        self._idle = True
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._sweep_lock = threading.Lock()
        """One sweep at a time: a sweep holds the works it took from the deques, so a reader's
        sweep waits for the poller's pass in progress instead of missing what it holds."""
        self._stop = False

    def add(self, work: Any, rec: PendingOp, sync: bool) -> None:
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

    def stop(self) -> None:
        self._stop = True
        self._wake.set()

    def pending(self) -> int:
        """Works not yet seen complete."""
        return len(self._fast) + len(self._slow)

    def settle(self, timeout_s: float) -> None:
        """Sweep the pending works on the calling thread until none is left or ``timeout_s``
        passes (0: one sweep). Before a final write this catches ops that completed while the
        poller thread was starved of the GIL or CPU (a loaded host at interpreter exit); before
        every read it completes the ops that finished since the poller last looked.

        These sweeps also ask each work's future: a backend marks the future complete (and
        wakes whoever waits on it, such as DDP's reducer) just before it flags the work itself,
        so a read right after such a wait must not depend on the order of the two."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        while True:
            with self._sweep_lock:
                self._sweep(self._fast, futures=True)
                self._sweep(self._slow, futures=True)
            if not self.pending() or time.monotonic() >= deadline:
                return
            time.sleep(0.001)

    def _sweep(self, items: deque[tuple[Any, PendingOp]], futures: bool = False) -> bool:
        progressed = False
        for _ in range(len(items)):
            try:
                work, rec = items.popleft()
            except IndexError:
                break
            if rec.work is None:  # already completed through Work.wait
                continue
            try:
                completed = work.is_completed() or (futures and _future_done(work))
            except Exception:
                completed = True
            if not completed:
                items.append((work, rec))
                continue
            progressed = True
            # An error surfaces (and is recorded) where the caller waits on the work; the
            # poller only notes completion. The recorder reports its own errors.
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
                with self._sweep_lock:
                    self._sweep(self._slow)
                last_slow = now
            if self._fast:
                with self._sweep_lock:
                    progressed = self._sweep(self._fast)
                delay = self.FAST_MIN_S if progressed else min(delay * 2, self.FAST_MAX_S)
                time.sleep(delay)


#: Work classes whose ``get_future()`` raises (gloo's send/recv): asked once, never again (each
#: raise builds a c10::Error with a backtrace, tens of µs).
_NO_FUTURE: set[type] = set()


def _future_done(work: Any) -> bool:
    """Whether the work's future is complete (False for works that have none)."""
    kind = type(work)
    if kind in _NO_FUTURE:
        return False
    try:
        fut = work.get_future()
    except Exception:
        _NO_FUTURE.add(kind)
        return False
    return bool(fut.done())


#: Frames from :meth:`Completion.watch` up to the Python code that issued the op:
#: watch <- the dispatcher kernel <- the caller.
_CALLER_DEPTH = 2


class Completion:
    """Completion of the ops the Python kernel recorded: Work.wait, the poller, CUDA events."""

    #: Ops awaiting their caller's wait (:meth:`watch`) kept at most: past it the oldest is
    #: forgotten unrecorded (a work its caller never waits on must not hold memory forever).
    CALLER_WAITS_CAP = 4096

    def __init__(self, sink: CompletionSink) -> None:
        self._sink = sink
        self.poller = Poller(self._polled)
        self._by_work: dict[int, tuple[Any, PendingOp]] = {}
        self._device_pending: deque[PendingOp] = deque()
        self._caller_waits: dict[int, list[int]] = {}
        """Works completed only by their caller's wait, by id: their outputs' data pointers
        (insertion order: oldest first)."""
        self._by_output: dict[int, int] = {}
        """Output data pointer -> id of the caller-completed work that writes it (what
        ``_c10d_functional.wait_tensor`` is given)."""
        self._group_future: dict[int, bool] = {}
        """Group index -> whether its works of caller-completed ops have a future (asked once
        per group: gloo's raise, NCCL's do not)."""

    def watch(self, rec: PendingOp, out: Any, outputs: list[Any] | None) -> None:
        """Arrange for the completion of the op that returned ``out`` to be noticed.

        Never a Python callback on the backend's thread: it would need the GIL there, stalling
        the backend's worker and skewing the timestamp by the GIL wait (measured on an H200
        with NCCL: future callbacks for CUDA end events, every one on NCCL's thread, made a GPT
        training step 16-20 % slower; ``benchmarks/gpu_kernel_probe.py``). A CUDA op's end
        event is marked where the current stream is ordered after the op, on the thread that
        issued or waited on it: a synchronous op's return (no work), ``Work.wait()``. A work
        nobody waits on from Python (DDP's reducer, FSDP) is polled and keeps its host time.
        Called by the kernel itself (the caller's frame is looked up at a fixed depth).

        ``outputs``: the op's output tensors when its spec is ``caller_completes``. Such a work
        without a future (gloo's reduce_scatter) is neither polled nor waited on: it completes
        when its caller waits (:meth:`work_waited`, :meth:`tensor_waited`), as the caller sees it.
        """
        try:
            work = out[1] if isinstance(out, tuple) and len(out) == 2 else out
            if work is None or isinstance(work, tuple):
                self._sink.complete(rec, time.perf_counter_ns(), None)
                return
            w = _Work.unbox(work)
            if w is None:
                # no work: the backend ran the op synchronously at the C++ level (NCCL with
                # async_op=False since torch 2.7: the op is ordered on the current stream),
                # so the host saw it end now and an end event marked now follows it
                self._ended_now(rec)
                return
            rec.work = w
            self._by_work[id(w)] = (w, rec)
            if outputs is not None and not self._has_future(rec.group, w):
                self._await_caller(w, outputs)
                return
            # A work that goes back to Python code (a torch.distributed function or a
            # ProcessGroup method called from Python) is waited on there, where the Work.wait
            # hook completes it exactly: the poller only keeps a slow safety net for it. Works
            # of C++ callers (DDP's reducer, functional collectives) need the fast poller.
            caller = sys._getframe(_CALLER_DEPTH).f_globals.get("__name__", "")
            from_python = caller == "torch.distributed.distributed_c10d"
            self.poller.add(w, rec, from_python or not (rec.flags & FLAG_ASYNC))
        except Exception as e:
            self._sink.discard(rec)
            self._sink.report_internal_error(e)

    def _has_future(self, group: int, w: Any) -> bool:
        known = self._group_future.get(group)
        if known is None:
            try:
                w.get_future()
                known = True
            except Exception:
                known = False
            self._group_future[group] = known
        return known

    def _await_caller(self, w: Any, outputs: list[Any]) -> None:
        """Leave the work's completion to its caller's wait (bounded: the oldest beyond
        :attr:`CALLER_WAITS_CAP` is forgotten unrecorded)."""
        ptrs = [t.data_ptr() for t in outputs]
        self._caller_waits[id(w)] = ptrs
        for p in ptrs:
            self._by_output[p] = id(w)
        while len(self._caller_waits) > self.CALLER_WAITS_CAP:
            oldest = next(iter(self._caller_waits))
            self._forget_caller_wait(oldest)
            entry = self._by_work.pop(oldest, None)
            if entry is not None:
                entry[1].work = None
                self._sink.discard(entry[1])

    def _forget_caller_wait(self, key: int) -> None:
        for p in self._caller_waits.pop(key, ()):
            if self._by_output.get(p) == key:
                del self._by_output[p]

    def tensor_waited(self, t: Any, end: int) -> None:
        """``_c10d_functional.wait_tensor(t)`` returned: complete the caller-completed op that
        writes ``t`` (a functional collective's output), if one awaits it."""
        if not self._by_output:
            return
        key = self._by_output.get(t.data_ptr())
        if key is not None:
            entry = self._by_work.get(key)
            if entry is not None:
                self.work_waited(entry[0], end, None)
            else:
                self._forget_caller_wait(key)

    @property
    def awaiting_caller(self) -> int:
        """Ops whose completion waits for their caller's wait (gloo's reduce_scatter)."""
        return len(self._caller_waits)

    def _ended_now(self, rec: PendingOp, end: int | None = None) -> None:
        """The op ended for the host now (or at ``end``), with the current stream ordered after
        it: a CUDA op's end event is marked on that stream."""
        end = time.perf_counter_ns() if end is None else end
        if rec.start_event is not None:
            rec.end_event = torch.cuda.Event(enable_timing=True)
            rec.end_event.record()
            rec.host_end = end
            self._device_pending.append(rec)
            return
        self._sink.complete(rec, end, None)

    def awaited_works(self) -> list[Any]:
        """The works whose completion is awaited (waiting on them completes their ops)."""
        return [w for w, _rec in list(self._by_work.values())]

    def work_waited(self, w: Any, end: int, err: BaseException | None) -> None:
        """``Work.wait()`` returned (or raised) in Python: complete the op it belongs to (a CUDA
        op: its end event marked now, the waiting thread's current stream being ordered after
        the work)."""
        entry = self._by_work.pop(id(w), None)
        if self._caller_waits:
            self._forget_caller_wait(id(w))
        if entry is not None and entry[0] is w:
            rec = entry[1]
            if rec.start_event is not None and err is None:
                self._ended_now(rec, end)
            else:
                self._sink.complete(rec, end, err)

    def _polled(self, rec: PendingOp, end: int, err: BaseException | None) -> None:
        entry = self._by_work.get(id(rec.work)) if rec.work is not None else None
        if entry is not None and entry[1] is rec:
            self._by_work.pop(id(rec.work), None)
        if rec.start_event is not None:
            # seen complete by the poller thread: no end event can be placed after the op from
            # here, so the op keeps its host time (issue -> seen complete), not device-timed
            rec.start_event = None
            rec.flags &= ~FLAG_DEVICE_TIMING
        self._sink.complete(rec, end, err)

    def resolve_device(self) -> None:
        """Complete the CUDA-timed ops whose end event has been reached (duration from the
        events' elapsed time)."""
        pending = self._device_pending
        for _ in range(len(pending)):
            rec = pending.popleft()
            try:
                if rec.end_event.query():
                    dur = int(rec.start_event.elapsed_time(rec.end_event) * 1e6)
                    self._sink.complete(rec, rec.host_end, None, dur=dur)
                else:
                    pending.append(rec)
            except Exception as e:
                self._sink.report_internal_error(e)

    def settle(self, timeout_s: float) -> None:
        """Sweep the works not yet complete on this thread for up to ``timeout_s``."""
        self.poller.settle(timeout_s)

    def stop(self) -> None:
        """Let the poller thread end once nothing is pending (it restarts on the next op)."""
        self.poller.stop()

    def wrap_wait(self, original: Any) -> Callable[..., Any]:
        """``Work.wait`` that completes the op of its work when it returns (or raises): the
        exact completion time as the caller sees it, on its own thread."""
        perf = time.perf_counter_ns
        waited = self.work_waited
        by_work = self._by_work
        report = self._sink.report_internal_error

        def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                result = original(self, *args, **kwargs)
            except BaseException as e:
                if by_work:
                    try:
                        waited(self, perf(), e)
                    except Exception as e2:
                        report(e2)
                raise
            if by_work:
                end = perf()
                try:
                    waited(self, end, None)
                except Exception as e:
                    report(e)
            return result

        return _like(wait, original)


def wrap_wait_native(waited: Callable[[Any, str], bool], original: Any) -> Callable[..., Any]:
    """``Work.wait`` that tells the native kernel (``work_waited(work, error text)``) when it
    returns or raises."""

    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            out = original(self, *args, **kwargs)
        except BaseException as e:
            with contextlib.suppress(Exception):
                waited(self, f"{type(e).__name__}: {e}")
            raise
        with contextlib.suppress(Exception):
            waited(self, "")
        return out

    return _like(wait, original)


def _like(wait: Callable[..., Any], original: Any) -> Callable[..., Any]:
    wait.__doc__ = getattr(original, "__doc__", None)
    wait.__meshprof_original__ = original  # type: ignore[attr-defined]
    return wait


def _work_classes() -> list[type]:
    """``Work`` and every subclass that binds its own ``wait`` (FakeWork, PythonCallbackWork...)."""
    out: list[type] = [_Work]
    todo = list(_Work.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if "wait" in cls.__dict__:
            out.append(cls)
    return out


def is_bound_in_cpp(method: Any) -> bool:
    """Whether ``method`` (a class attribute) is a pybind11 method: an ``instancemethod``
    around a builtin function, i.e. C++ that calls the work's virtual ``wait``."""
    import types

    return type(method).__name__ == "instancemethod" and isinstance(
        getattr(method, "__func__", None), types.BuiltinFunctionType
    )


def patch_work_wait(patches: Patches, wrap: Callable[[type, Any], Any]) -> None:
    """Replace ``Work.wait`` (and the subclasses' own) by ``wrap(cls, original)``."""
    for cls in _work_classes():
        original = cls.__dict__["wait"]
        patches.replace(cls, "wait", wrap(cls, original), original)

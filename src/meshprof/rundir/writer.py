"""The rank writer: what one rank records, appended to its segments in the run directory.

:class:`RankWriter` runs a daemon thread that, every ``tick_s`` seconds (:data:`TICK_S`), flushes
the recorder and appends what is new since the last tick — events, the step monitor's spans and
memory samples, the per-step totals — to the rank's segments (:mod:`meshprof.rundir.segments`,
written by :class:`~meshprof.rundir.segment_writer.SegmentWriter`), so a rank killed without
warning loses at most a tick. Every ``interval_s`` seconds it refreshes the rank's meta (its
tables, exact statistics) and fsyncs; at interpreter exit, on an unhandled exception and on
SIGTERM it appends the rest and writes the final meta (with the exit status). Nothing is ever
rewritten: the bytes written are the bytes stored.

A full or failing disk (ENOSPC, EDQUOT, EROFS, EIO) stops writing for good: recording goes on in
memory, one line says so on stderr (and :attr:`RankWriter.storage_state` for the live state),
and the last meta records what was not written (:class:`~meshprof.records.storage.StorageInfo`).

Everything here runs inside the user's training process: no method of :class:`RankWriter`
raises; a failed write is counted and reported once on stderr, and training goes on.
:func:`rank_data` (everything a recorder holds, as one :class:`RankData`) serves the callers that
write a single rank file (:func:`~meshprof.rundir.rankfile.write_rank_file`).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np

from meshprof.events import MEMORY_DTYPE, SPAN_DTYPE
from meshprof.process import env_rank
from meshprof.rundir.rankfile import rank_data
from meshprof.rundir.row_tail import RowTail, rows_since
from meshprof.rundir.schema import RANK_FORMAT, ExitStatus, RankMeta
from meshprof.rundir.segment_writer import SegmentWriter, StorageLimits, describe_stop
from meshprof.rundir.segments import BATCH_DTYPE, TICK_S, batch_payload
from meshprof.rundir.serving_rows import ServingRows
from meshprof.rundir.step_totals import StepTotals

if TYPE_CHECKING:
    from meshprof.comm.recorder import CommProfiler

#: Seconds the SIGTERM handler waits for the final write before exiting anyway (the write
#: cannot finish if the signal interrupted the main thread inside the recorder's own lock).
SIGNAL_WRITE_TIMEOUT_S = 10.0
#: Seconds the final write waits for completed-but-unnoticed ops to be swept (an op that never
#: completes costs this once, at exit).
SETTLE_S = 0.2
#: An idle rank still appends an empty batch this often (seconds): when it was last seen alive.
HEARTBEAT_S = 5.0
#: Per-step totals are appended at least this often (seconds), or when this many are waiting.
STEPS_EVERY_S = 10.0
STEPS_BATCH = 256


class RankWriter:
    """Appends this rank's new rows every tick; refreshes its meta periodically, at exit, on an
    unhandled exception and on SIGTERM.

    ``rank`` defaults to the ``RANK`` environment variable (torchrun sets it), else the
    profiler's rank once a process group exists, else 0. ``extra_meta`` is a dict the caller
    may keep updating (it is read at every meta write). ``limits``: retention and sync bounds
    (:class:`~meshprof.rundir.segment_writer.StorageLimits`); ``run_id`` goes into every file.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        prof: CommProfiler,
        monitor: Any = None,
        interval_s: float = 30.0,
        rank: int | None = None,
        extra_meta: dict[str, Any] | None = None,
        tick_s: float = TICK_S,
        limits: StorageLimits | None = None,
        run_id: str | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.prof = prof
        self.monitor = monitor
        self.interval_s = float(interval_s)
        self.tick_s = float(tick_s)
        self.rank = rank if rank is not None else env_rank()
        self.extra_meta: dict[str, Any] = extra_meta if extra_meta is not None else {}
        base = limits or StorageLimits()
        self.limits = StorageLimits(
            retain_s=base.retain_s,
            max_disk_bytes=base.max_disk_bytes,
            segment_bytes=base.segment_bytes,
            segment_s=base.segment_s,
            fsync_interval_s=self.interval_s if limits is None else base.fsync_interval_s,
            tick_s=self.tick_s,
        )
        self.run_id = run_id
        self.writes = 0
        """Meta files written so far (unchanged content is not rewritten)."""
        self.ticks = 0
        """Batches appended so far."""
        self.failures = 0
        """Writes that failed (the first is reported on stderr)."""
        self.last_path: Path | None = None
        """The meta file last written."""
        self.store: SegmentWriter | None = None
        """The rank's segment files (None until the first tick)."""
        self._lock = threading.Lock()
        self._lock_owner: int | None = None  # thread id of the write in progress
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_sig: tuple[Any, ...] | None = None
        self._tables_sig: tuple[Any, ...] | None = None
        self._exit: ExitStatus | None = None
        self._prev_sigterm: Any = None
        self._prev_excepthook: Any = None
        self._installed = False
        self._next_id = 0
        self._log: Any = None
        self._events_written = 0
        self._overrun = 0
        self._spans_tail = RowTail()
        self._memory_tail = RowTail()
        self.serving = ServingRows()  # a serving rank's requests and tokens not appended yet
        self._totals = StepTotals()
        self._steps_written = 0
        self._steps_pending: list[np.ndarray] = []
        self._steps_due = time.monotonic() + STEPS_EVERY_S
        self._last_batch_ns = 0
        self._inflight_sig: bytes | None = b""  # the in-flight rows of the last batch written
        self._step_seen = (-1, time.time_ns())  # (step, when it began)
        self._listening = False
        self._warned = False
        self._stopped_step = -1

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> RankWriter:
        """Start the thread and install the atexit, excepthook and SIGTERM handlers."""
        if self._installed:
            return self
        self._installed = True
        atexit.register(self._at_exit)
        self._prev_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        if threading.current_thread() is threading.main_thread():
            try:
                self._prev_sigterm = signal.getsignal(signal.SIGTERM)
                signal.signal(signal.SIGTERM, self._on_sigterm)
                self._watch_wakeup_fd()
            except (ValueError, OSError):
                self._prev_sigterm = None
        if self.tick_s > 0 or self.interval_s > 0:
            self._thread = threading.Thread(target=self._run, name="meshprof-writer", daemon=True)
            self._thread.start()
        return self

    def stop(self, final_write: bool = True) -> None:
        """Stop the thread, remove the handlers, and (by default) append the rest and write the
        final meta."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=SIGNAL_WRITE_TIMEOUT_S)
        if self._installed:
            self._installed = False
            atexit.unregister(self._at_exit)
            if sys.excepthook == self._excepthook:
                sys.excepthook = self._prev_excepthook
            if (
                self._prev_sigterm is not None
                and signal.getsignal(signal.SIGTERM) == self._on_sigterm
            ):
                with contextlib.suppress(ValueError, OSError):
                    signal.signal(signal.SIGTERM, self._prev_sigterm)
        if final_write:
            self._settle(SETTLE_S)
            self.write(final=True)
        self._unlisten()

    def set_exit(self, how: str, code: int | None = None, error: str = "") -> None:
        """Record how the process ended ("normal", "exception", "signal"); goes into meta.exit."""
        self._exit = ExitStatus(how, code, error, time.time_ns())

    @property
    def storage_state(self) -> str:
        """ "" while the rank's files are written; else why writing stopped (one line)."""
        st = self.store
        if st is None or not st.stopped:
            return ""
        return f"writing stopped: {describe_stop(st)}"

    # -- writing --------------------------------------------------------------------------------
    def write(self, force: bool = False, final: bool = False) -> Path | None:
        """Append what is new and write the meta now (skipped when unchanged, unless ``force``);
        ``final``: also the per-step totals still open, an fsync, and the files closed. Returns
        the meta file's path, or None when skipped or failed. Never raises."""
        try:
            if not self._lock.acquire(timeout=SIGNAL_WRITE_TIMEOUT_S):
                return None
            self._lock_owner = threading.get_ident()
            try:
                self._tick(final)
                store = self.store
                if store is None:
                    return None
                if final:
                    self._append_steps(final=True)
                    store.close()
                path = self._write_meta(force or final, fsync=final)
                if not final:
                    store.maintain()
                return path
            finally:
                self._lock_owner = None
                self._lock.release()
        except BaseException as e:  # never into training, not even KeyboardInterrupt mid-write
            self._failed(e)
            return None

    def tick(self) -> None:
        """Append what is new since the last tick (the writer's thread calls it every
        ``tick_s``). Never raises."""
        try:
            with self._lock:
                self._lock_owner = threading.get_ident()
                try:
                    self._tick()
                    if self.store is not None:
                        self.store.maintain()
                finally:
                    self._lock_owner = None
        except BaseException as e:
            self._failed(e)

    def _failed(self, e: BaseException) -> None:
        self.failures += 1
        if self.failures == 1:
            with contextlib.suppress(Exception):
                print(
                    f"meshprof: could not write the rank's files in {self.run_dir}: "
                    f"{type(e).__name__}: {e}",
                    file=sys.stderr,
                )

    def _open(self, rank: int) -> SegmentWriter:
        store = self.store
        if store is not None and store.rank == rank:
            return store
        if store is not None:
            # the rank was provisional (0 before the process group existed): what was written
            # under it goes, and everything the ring still holds is written under the real one
            store.discard()
            self._log, self._next_id, self._overrun, self._events_written = None, 0, 0, 0
            self._spans_tail, self._memory_tail, self.serving = RowTail(), RowTail(), ServingRows()
            self._totals, self._steps_pending, self._steps_written = StepTotals(), [], 0
        self.store = store = SegmentWriter(
            self.run_dir, rank, self.limits, self.run_id, on_stop=self._on_storage_stop
        )
        self._tables_sig = None
        self._last_sig = None
        self._inflight_sig = None  # new files: their first batch says what is in flight
        if not self._listening:
            self._listening = True
            self.prof.step_listeners.append(self._note_step)
        return store

    def _tick(self, final: bool = False) -> None:
        """One tick (lock held): flush the recorder, append the new rows as one batch."""
        t0 = time.time_ns()
        prof = self.prof
        # one instant: the events completed by it and the collectives in flight at it (each
        # collective in one of the two; flush() alone could move an op into the log after the
        # in-flight copy)
        reading = prof.read(events=False)
        store = self._open(self._current_rank())
        if store.stopped:
            return  # recording goes on in memory; nothing more is written
        log = prof.log
        if log is not self._log or log.total < self._next_id:
            # the first tick, a resized log (renumbered from 0) or a cleared one: from its
            # oldest retained event
            self._log = log
            self._next_id = 0
        events, first = log.rows_since(self._next_id)
        if len(events) and first + len(events) > reading.total:
            events = events[: max(0, reading.total - first)]  # completed after the instant
        lost = max(0, first - self._next_id) if len(events) else 0
        self._overrun += lost
        self._next_id = first + len(events)
        mon = self.monitor
        spans = rows_since(getattr(mon, "span_rows", None), self._spans_tail, SPAN_DTYPE)
        memory = rows_since(getattr(mon, "memory_rows", None), self._memory_tail, MEMORY_DTYPE)
        self._totals.add(events, spans, memory)
        self.serving.append(store, t0, final)  # (``final``: with the requests still running)
        if self._tables_changed():
            self._write_meta(True, fsync=False)
        inflight = reading.pending.rows
        flying = inflight.tobytes()
        nothing = not (len(events) or len(spans) or len(memory)) and flying == self._inflight_sig
        if nothing and t0 - self._last_batch_ns < HEARTBEAT_S * 1e9:
            self._append_steps()
            return
        side = self._side_table(log, first, len(events))
        step, step_ns = self._step_seen
        batch = np.zeros(1, BATCH_DTYPE)
        batch[0] = (
            t0, first, step_ns, step, len(events), len(spans), len(memory), len(side), lost,
            len(inflight),
        )  # fmt: skip
        payload = batch_payload(batch, events, spans, memory, side, inflight)
        if store.append_batch(payload, len(events), len(spans), t0, (step, step_ns)):
            self._inflight_sig = flying
            self.ticks += 1
            self._events_written += len(events)
            self._last_batch_ns = t0
        self._append_steps()

    def _side_table(self, log: Any, first: int, n: int) -> bytes:
        """The error texts and metadata of events ``first`` .. ``first + n - 1`` (JSON)."""
        if not n or not (log.errors or log.metadata):
            return b""
        end = first + n
        errors = {str(i): t for i, t in list(log.errors.items()) if first <= i < end}
        meta = {str(i): m for i, m in list(log.metadata.items()) if first <= i < end}
        if not errors and not meta:
            return b""
        return json.dumps({"errors": errors, "metadata": meta}, default=str).encode("utf-8")

    def _append_steps(self, final: bool = False) -> None:
        ready = self._totals.ready(final)
        if len(ready):
            self._steps_pending.append(ready)
        waiting = sum(len(a) for a in self._steps_pending)
        now = time.monotonic()
        if not waiting or not (final or waiting >= STEPS_BATCH or now >= self._steps_due):
            return
        rows = np.concatenate(self._steps_pending)
        self._steps_pending.clear()
        self._steps_due = now + STEPS_EVERY_S
        store = self.store
        if store is not None and store.append_steps(rows.tobytes()):
            self._steps_written += len(rows)

    def _note_step(self, step: int) -> None:
        """A profiler step listener, on the training thread once per step: the step goes into
        the next batch, and into the cursor file at once (one small ``pwrite``)."""
        self._step_seen = seen = (int(step), time.time_ns())
        store = self.store
        if store is not None:
            store.note_step(*seen)

    def _unlisten(self) -> None:
        if self._listening:
            self._listening = False
            with contextlib.suppress(ValueError):
                self.prof.step_listeners.remove(self._note_step)

    def _tables_changed(self) -> bool:
        log = self.prof.log
        names = getattr(self.monitor, "span_names", None)
        sig = (
            len(log.groups),
            len(log.dtypes),
            len(log.labels),
            len(names or ()),
            tuple(sorted(self.extra_meta)),
            self.prof.world_size,
        )
        if sig == self._tables_sig:
            return False
        self._tables_sig = sig
        return True

    def _meta(self) -> RankMeta:
        prof, log = self.prof, self.prof.log
        store = self.store
        assert store is not None
        info = store.info(self._events_written, self._steps_written, self._overrun)
        if store.stopped:
            info = info.updated(stopped_step=self._stopped_step)
        reading = prof.read(events=False, stats=True)  # statistics with the ops in flight
        meta = RankMeta.from_dict(prof.meta(reading)).updated(
            format=RANK_FORMAT,
            rank=store.rank,
            dtypes=list(log.dtypes),
            labels=list(log.labels),
            stats=prof.accumulated_stats_dict(reading),
            span_names=[],
            current_step=prof.step,
            run_id=self.run_id,
            storage=info,
            writer={
                "writes": self.writes + 1,
                "interval_s": self.interval_s,
                "failures": self.failures,
            },
        )
        mon = self.monitor
        if mon is not None:
            meta = meta.updated(span_names=list(mon.span_names), monitor=mon.to_meta())
        meta = self.serving.counted(meta)
        extra = {k: v for k, v in self.extra_meta.items() if k not in ("exit", "writer")}
        if extra:
            meta = meta.updated(**extra)
        if self._exit is not None:
            meta = meta.updated(exit=self._exit)
        return meta

    def _write_meta(self, force: bool, fsync: bool) -> Path | None:
        store = self.store
        if store is None:
            return None
        meta = self._meta()
        sig = (
            meta.total_events,
            meta.exit,
            meta.world_size,
            len(meta.groups or []),
            repr((meta.clock_sync, meta.serving)),
            store.stopped,
            self._steps_written,
            self._events_written,
        )
        if not force and sig == self._last_sig:
            return None
        if store.stopped and (meta.exit is not None or store.closed_ns):
            store.release_reserve()  # the last meta: the rest of the reserve makes room for it
        path = store.write_meta(json.dumps(meta.to_dict(), default=str), fsync=fsync)
        if path is None:
            return None
        self._last_sig = sig
        self.writes += 1
        self.last_path = path
        return path

    def _on_storage_stop(self, store: SegmentWriter) -> None:
        """Writing stopped (a full or failing disk): say so once, and leave a meta that says
        what was not written (the freed reserve makes room for it)."""
        self.failures += 1
        self._stopped_step = self._step_seen[0]
        if not self._warned:
            self._warned = True
            with contextlib.suppress(Exception):
                print(
                    f"meshprof: rank {store.rank} stopped writing to {self.run_dir}: "
                    f"{describe_stop(store)}; training and recording go on (in memory only); "
                    "the report will say what was not written",
                    file=sys.stderr,
                )
        self._write_meta(True, fsync=False)

    def _current_rank(self) -> int:
        if self.rank is not None:
            return self.rank
        try:
            r = self.prof.ensure_rank()
        except Exception:
            r = 0
        return max(int(r), 0)

    def _run(self) -> None:
        """The thread: a tick every ``tick_s`` seconds and a meta refresh every ``interval_s``
        seconds, until stopped."""
        now = time.monotonic()
        never = float("inf")
        next_write = now + self.interval_s if self.interval_s > 0 else never
        tick = self.tick_s if self.tick_s > 0 else never
        next_tick = now
        while not self._stop.wait(max(0.0, min(next_write, next_tick) - time.monotonic())):
            now = time.monotonic()
            if now >= next_write:
                self.write()
                next_write = now + self.interval_s
                next_tick = now + tick
            elif now >= next_tick:
                self.tick()
                next_tick = now + tick

    # -- handlers -------------------------------------------------------------------------------
    def _settle(self, timeout_s: float) -> None:
        """Let the recorder notice ops that completed but were not seen yet (never raises)."""
        with contextlib.suppress(Exception):
            self.prof.settle(timeout_s)

    def _at_exit(self) -> None:
        if self._exit is None:
            self.set_exit("normal", 0)
        self._stop.set()
        self._settle(SETTLE_S)
        self.write(final=True)

    def _excepthook(
        self, etype: type[BaseException], value: BaseException, tb: TracebackType | None
    ) -> None:
        try:
            self.set_exit(
                "exception", 1, "".join(traceback.format_exception_only(etype, value)).strip()
            )
            self._settle(SETTLE_S)
            self.write(final=True)
        except BaseException:
            pass
        prev = self._prev_excepthook or sys.__excepthook__
        prev(etype, value, tb)

    def _watch_wakeup_fd(self) -> None:
        """Also see SIGTERM from a thread, through the signal wakeup fd.

        A Python signal handler runs only when the main thread returns to the interpreter; a
        main thread blocked in C (a collective waiting for a dead peer) never does, and torchrun
        would SIGKILL it after its grace period with nothing written. The wakeup fd receives the
        signal number as soon as the signal arrives, so a thread can write the rank file and end
        the process. Skipped when the fd is already in use (asyncio sets its own)."""
        r, w = os.pipe()
        os.set_blocking(w, False)
        try:
            prev = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except (ValueError, OSError):
            os.close(r)
            os.close(w)
            return
        if prev != -1:
            signal.set_wakeup_fd(prev)
            os.close(r)
            os.close(w)
            return
        threading.Thread(
            target=self._read_wakeup_fd, args=(r,), name="meshprof-sigterm", daemon=True
        ).start()

    def _read_wakeup_fd(self, fd: int) -> None:
        try:
            while True:
                data = os.read(fd, 64)
                if not data:
                    return
                if signal.SIGTERM in data and self._installed:
                    self._sigterm_from_thread()
        except Exception:
            pass

    def _sigterm_from_thread(self) -> None:
        self.set_exit("signal", 128 + signal.SIGTERM, signal.Signals.SIGTERM.name)
        self._stop.set()
        self._settle(0.0)
        self.write(final=True)
        if self._prev_sigterm not in (signal.SIG_DFL, None):
            return  # the script's own handler (or SIG_IGN) decides, from the main thread
        # Die by the signal as the default action would; signal.signal() only works in the main
        # thread, so reset the handler through libc.
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
            libc.signal.restype = ctypes.c_void_p
            libc.signal(int(signal.SIGTERM), None)  # SIG_DFL
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except Exception:
            pass
        os._exit(128 + signal.SIGTERM)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        # The main thread may have been interrupted inside the recorder's lock: write from a
        # helper thread and give up after a timeout rather than deadlock.
        try:
            self.set_exit("signal", 128 + signum, signal.Signals(signum).name)
            self._stop.set()
            # A write this thread was in when the signal came cannot finish before this handler
            # returns: waiting for it would only delay the death (the file written before it,
            # and the crash-safe files, stay).
            if self._lock_owner != threading.get_ident():
                t = threading.Thread(
                    target=self.write,
                    kwargs={"final": True},
                    name="meshprof-final-write",
                    daemon=True,
                )
                t.start()
                t.join(SIGNAL_WRITE_TIMEOUT_S)
        except BaseException:
            pass
        prev = self._prev_sigterm
        if callable(prev):
            prev(signum, frame)
            return
        if prev == signal.SIG_IGN:
            return
        # Default action: die by the signal, as the process would have without meshprof.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


__all__ = ["HEARTBEAT_S", "RankWriter", "rank_data"]

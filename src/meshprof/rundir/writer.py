"""The rank writer: what one rank recorded, written to its rank file in the run directory.

:func:`rank_data` turns a live :class:`~meshprof.comm.recorder.CommProfiler` (and, when given,
the step monitor) into a :class:`~meshprof.rundir.rankfile.RankData` with a typed
:class:`~meshprof.rundir.schema.RankMeta`; :class:`RankWriter` writes it atomically
(temporary file + rename, so a crash never leaves half a file) every ``interval_s`` seconds from a
daemon thread, at interpreter exit, on an unhandled exception and on SIGTERM. The same thread
keeps the crash-safe files (:mod:`meshprof.rundir.crashsafe`) up to date every
``crashsafe_tick_s`` seconds, so a rank killed by SIGKILL loses at most that much; they are
removed once the final rank file (with the exit status) is written.

Everything here runs inside the user's training process: no method of :class:`RankWriter`
raises; a failed write is counted and reported once on stderr, and training goes on.
"""

from __future__ import annotations

import atexit
import contextlib
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
from meshprof.rundir.crashsafe import TICK_S, CrashSafeStore
from meshprof.rundir.rankfile import RankData, write_rank_file
from meshprof.rundir.schema import RANK_FORMAT, ExitStatus, RankMeta

if TYPE_CHECKING:
    from meshprof.comm.recorder import CommProfiler

#: Seconds the SIGTERM handler waits for the final write before exiting anyway (the write
#: cannot finish if the signal interrupted the main thread inside the recorder's own lock).
SIGNAL_WRITE_TIMEOUT_S = 10.0
#: Seconds the final write waits for completed-but-unnoticed ops to be swept (an op that never
#: completes costs this once, at exit).
SETTLE_S = 0.2


def rank_data(
    prof: CommProfiler, monitor: Any = None, extra_meta: dict[str, Any] | None = None
) -> RankData:
    """Everything ``prof`` (and ``monitor``) hold now, as one rank file's content.

    Everything comes from one read of the recorder (:meth:`~meshprof.comm.recorder.CommProfiler.read`):
    the completed events go to ``events``, the collectives in flight at that instant to
    ``inflight`` (rewritten at every write: a collective in flight at one write is in
    ``events`` at a later one, and in one of the two only), and the statistics count both.
    Side tables keyed by event id in the recorder (errors, metadata) are re-keyed by the row
    index within the written ``events`` array (as strings: the meta is JSON). ``extra_meta``
    entries (RankMeta keys, or free-form ones kept in ``extra``) override the recorder's own
    (the launcher passes the rank from ``RANK``, the clock sync samples, the layout, the exit
    status).
    """
    reading = prof.read(stats=True)  # one instant: completed events, ops in flight, statistics
    events, ids = reading.events, reading.ids
    first_id = int(ids[0]) if len(ids) else 0
    log = prof.log
    errors = {str(i - first_id): text for i, text in list(log.errors.items()) if i >= first_id}
    metadata = {str(i - first_id): m for i, m in list(log.metadata.items()) if i >= first_id}
    stats = prof.accumulated_stats_dict(reading)
    meta = RankMeta.from_dict(prof.meta(reading))
    meta = meta.updated(
        format=RANK_FORMAT,
        dtypes=list(log.dtypes),
        labels=list(log.labels),
        errors=errors,
        metadata=metadata,
        stats=stats,
        first_event_id=first_id,
        span_names=[],
    )
    spans = np.zeros(0, dtype=SPAN_DTYPE)
    memory = np.zeros(0, dtype=MEMORY_DTYPE)
    if monitor is not None:
        spans, names = monitor.spans_array()
        memory = monitor.memory_array()
        meta = meta.updated(span_names=list(names), monitor=monitor.to_meta())
    if extra_meta:
        meta = meta.updated(**extra_meta)
    rank = int(meta.rank if meta.rank is not None else -1)
    return RankData(
        rank=max(rank, 0),
        events=events,
        spans=spans,
        memory=memory,
        meta=meta,
        inflight=reading.pending.rows,
    )


def _signature(data: RankData) -> tuple[Any, ...]:
    """What changes when a rank file would differ in substance (not just its timestamp)."""
    m = data.meta
    return (
        len(data.events),
        m.total_events,
        data.inflight.tobytes(),  # ops in flight (few rows): a change rewrites the file
        len(data.spans),
        int(data.spans["duration_ns"].sum()) if len(data.spans) else 0,
        len(data.memory),
        m.exit,
        m.world_size,
        len(m.groups or []),
        repr(m.clock_sync),
    )


class RankWriter:
    """Writes this rank's file periodically, at exit, on an unhandled exception and on SIGTERM.

    ``rank`` defaults to the ``RANK`` environment variable (torchrun sets it), else the
    profiler's rank once a process group exists, else 0. ``extra_meta`` is a dict the caller
    may keep updating (it is read at every write).
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        prof: CommProfiler,
        monitor: Any = None,
        interval_s: float = 30.0,
        rank: int | None = None,
        extra_meta: dict[str, Any] | None = None,
        crashsafe_tick_s: float = TICK_S,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.prof = prof
        self.monitor = monitor
        self.interval_s = float(interval_s)
        self.rank = rank if rank is not None else env_rank()
        self.extra_meta: dict[str, Any] = extra_meta if extra_meta is not None else {}
        self.writes = 0
        """Rank files written so far (unchanged content is not rewritten)."""
        self.failures = 0
        """Writes that failed (the first is reported on stderr)."""
        self.last_path: Path | None = None
        self._lock = threading.Lock()
        self._lock_owner: int | None = None  # thread id of the write in progress
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_sig: tuple[Any, ...] | None = None
        self._exit: ExitStatus | None = None
        self._prev_sigterm: Any = None
        self._prev_excepthook: Any = None
        self._installed = False
        self.crashsafe: CrashSafeStore | None = (
            CrashSafeStore(self.run_dir, crashsafe_tick_s) if crashsafe_tick_s > 0 else None
        )
        """The crash-safe mapped files of this rank (None: off)."""

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> RankWriter:
        """Start the periodic thread and install the atexit, excepthook and SIGTERM handlers."""
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
        if self.interval_s > 0 or self.crashsafe is not None:
            self._thread = threading.Thread(target=self._run, name="meshprof-writer", daemon=True)
            self._thread.start()
        return self

    def stop(self, final_write: bool = True) -> None:
        """Stop the thread, remove the handlers, and (by default) write a last time."""
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
            failures = self.failures
            self.write()
            if self.failures != failures:
                return  # the rank file may be behind: keep the crash-safe files
        self._discard_crashsafe()  # this rank's recording ends here, not by a crash

    def set_exit(self, how: str, code: int | None = None, error: str = "") -> None:
        """Record how the process ended ("normal", "exception", "signal"); goes into meta.exit."""
        self._exit = ExitStatus(how, code, error, time.time_ns())

    # -- writing --------------------------------------------------------------------------------
    def write(self, force: bool = False) -> Path | None:
        """Write the rank file now (skipped when nothing changed since the last write, unless
        ``force``). Returns its path, or None when skipped or failed. Never raises."""
        try:
            if not self._lock.acquire(timeout=SIGNAL_WRITE_TIMEOUT_S):
                return None
            self._lock_owner = threading.get_ident()
            try:
                extra = dict(self.extra_meta)
                rank = self._current_rank()
                extra["rank"] = rank
                extra["writer"] = {
                    "writes": self.writes + 1,
                    "interval_s": self.interval_s,
                    "failures": self.failures,
                }
                if self._exit is not None:
                    extra["exit"] = self._exit
                extra["current_step"] = self.prof.step
                data = rank_data(self.prof, self.monitor, extra)
                sig = _signature(data)
                if not force and sig == self._last_sig:
                    if data.meta.exit is not None:
                        self._discard_crashsafe()  # the file on disk is the final one
                    return None
                path = write_rank_file(self.run_dir, data)
                self._last_sig = sig
                self.writes += 1
                self.last_path = path
                if data.meta.exit is not None:
                    self._discard_crashsafe()
                return path
            finally:
                self._lock_owner = None
                self._lock.release()
        except BaseException as e:  # never into training, not even KeyboardInterrupt mid-write
            self.failures += 1
            if self.failures == 1:
                with contextlib.suppress(Exception):
                    print(
                        f"meshprof: could not write the rank file in {self.run_dir}: {type(e).__name__}: {e}",
                        file=sys.stderr,
                    )
            return None

    def _current_rank(self) -> int:
        if self.rank is not None:
            return self.rank
        try:
            r = self.prof.ensure_rank()
        except Exception:
            r = 0
        return max(int(r), 0)

    def _run(self) -> None:
        """The periodic thread: a crash-safe tick every ``crashsafe_tick_s`` seconds and a
        rank-file write every ``interval_s`` seconds, until stopped."""
        now = time.monotonic()
        never = float("inf")
        next_write = now + self.interval_s if self.interval_s > 0 else never
        tick = self.crashsafe.tick_s if self.crashsafe is not None else never
        next_tick = now
        while not self._stop.wait(max(0.0, min(next_write, next_tick) - time.monotonic())):
            now = time.monotonic()
            if now >= next_tick:
                self.persist_crashsafe()
                next_tick = now + tick
            if now >= next_write:
                self.write()
                next_write = now + self.interval_s

    # -- crash-safe files -------------------------------------------------------------------------
    def persist_crashsafe(self) -> None:
        """One crash-safe tick: flush the recorder and copy what is new into the mapped files
        (:meth:`meshprof.rundir.crashsafe.CrashSafeStore.tick`). Never raises."""
        cs = self.crashsafe
        if cs is None:
            return
        with contextlib.suppress(BaseException):
            cs.tick(self.prof, self.monitor, self._current_rank(), self.extra_meta)

    def _discard_crashsafe(self) -> None:
        if self.crashsafe is not None:
            with contextlib.suppress(Exception):
                self.crashsafe.discard()

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
        self.write()

    def _excepthook(
        self, etype: type[BaseException], value: BaseException, tb: TracebackType | None
    ) -> None:
        try:
            self.set_exit(
                "exception", 1, "".join(traceback.format_exception_only(etype, value)).strip()
            )
            self._settle(SETTLE_S)
            self.write()
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
        self.write()
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
                t = threading.Thread(target=self.write, name="meshprof-final-write", daemon=True)
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


__all__ = ["RankWriter", "rank_data"]

"""Appending one rank's segments (:mod:`meshprof.rundir.segments`), inside the training process.

:class:`SegmentWriter` owns the rank's files: it appends chunks with plain ``write`` calls (never a
memory-mapped store, whose page fault on a full disk is a SIGBUS Python cannot catch), closes a
segment and begins the next at ``segment_bytes`` or ``segment_s``, deletes the oldest segments
beyond the retention bounds (:class:`StorageLimits`), and fsyncs at most every
``fsync_interval_s``.

Any error of the file system (ENOSPC, EDQUOT, EROFS, EIO, or another ``OSError``) stops writing
for good: the chunk being written is cut back off the file, part of the reserve file is freed so
that the meta can still say what happened, and :attr:`SegmentWriter.stopped` names the error. No
method raises.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshprof.records.storage import SEGMENT_FORMAT, StorageInfo
from meshprof.rundir.atomic import FILE_MODE, atomic_write_bytes
from meshprof.rundir.confine import check_inside, make_dirs
from meshprof.rundir.segments import (
    CURSOR,
    KIND_BATCH,
    KIND_SERVING,
    KIND_STEPS,
    META_RE,
    RESERVE,
    SEGMENT_RE,
    STEPS_RE,
    TICK_S,
    chunk,
    cursor_name,
    header_chunk,
    meta_name,
    new_header,
    rank_dir,
    segment_name,
    steps_name,
)

DEFAULT_MAX_DISK = 1 << 30
"""Default bound of one rank's files (bytes): the oldest segments go beyond it."""
DEFAULT_SEGMENT_BYTES = 32 << 20
DEFAULT_SEGMENT_S = 1800.0
RESERVE_BYTES = 128 << 10
"""Space set aside per rank for the meta written after the disk filled up (half when writing
stops, the rest at exit)."""
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_OPEN = os.O_WRONLY | os.O_APPEND | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True, slots=True)
class StorageLimits:
    """How much of one rank's recording is kept on disk, and how often it is synced."""

    retain_s: float = 0.0
    """Delete segments whose newest row is older than this many seconds (0: no age bound)."""
    max_disk_bytes: int = DEFAULT_MAX_DISK
    """Delete the oldest segments while the rank's files take more (0: no size bound). The
    per-step totals and the meta are never deleted."""
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    """Close a segment and begin the next at this size."""
    segment_s: float = DEFAULT_SEGMENT_S
    """... or when it is this old (seconds), so that ``retain_s`` can free space in time."""
    fsync_interval_s: float = 30.0
    """Seconds between two fsyncs of the open files (0: only at rotation and at exit). A
    process' own death loses nothing that was appended; fsync guards against the machine's."""
    tick_s: float = TICK_S
    """Seconds between two appends (the rank writer's tick)."""
    reserve_bytes: int = RESERVE_BYTES
    """Space set aside at start for the meta written after the disk filled up (0: none)."""
    fsync: bool = True
    """False: never fsync (a run written whole by a tool, :func:`meshprof.rundir.rank_segments.
    write_rank_segments`: nothing to guard against a crash of the machine mid-run)."""


def error_name(e: BaseException) -> str:
    """``ENOSPC``, ``EROFS``, ... for an OSError; the exception's type name otherwise."""
    code = getattr(e, "errno", None)
    if isinstance(code, int) and code in errno.errorcode:
        return errno.errorcode[code]
    return type(e).__name__


@dataclass(slots=True)
class _Segment:
    index: int
    events: int = 0
    spans: int = 0
    last_ns: int = 0
    requests: int = 0
    tokens: int = 0


class SegmentWriter:
    """The append-only files of one rank (one generation: this process)."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        rank: int,
        limits: StorageLimits | None = None,
        run_id: str | None = None,
        on_stop: Callable[[SegmentWriter], None] | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.rank = int(rank)
        self.dir = rank_dir(self.run_dir, self.rank)
        self.limits = limits or StorageLimits()
        self.run_id = run_id
        self.on_stop = on_stop
        self.generation = 0
        self.stopped = ""
        """The error that stopped writing ("" while it writes)."""
        self.error = ""
        self.stopped_ns = 0
        self.bytes_written = 0
        self.meta_bytes_written = 0
        self.fsyncs = 0
        self.segments = 0
        self.rotated_segments = 0
        self.rotated_events = 0
        self.rotated_spans = 0
        self.rotated_requests = 0
        self.rotated_tokens = 0
        self.requests_written = 0
        self.tokens_written = 0
        self.closed_ns = 0
        self._seg: _Segment | None = None
        self._seg_fd = -1
        self._seg_size = 0
        self._seg_opened = 0.0
        self._steps_fd = -1
        self._steps_size = 0
        self._own: list[_Segment] = []  # this generation's closed segments, oldest first
        self._dirty = False
        self._last_sync = time.monotonic()
        self._cursor_fd = -1
        self._cursor_lock = threading.Lock()  # the training thread writes it, the writer closes it

    # -- state ------------------------------------------------------------------------------------
    @property
    def ok(self) -> bool:
        return not self.stopped

    def info(self, events_written: int, steps_written: int, overrun: int) -> StorageInfo:
        """The ``storage`` record of the rank meta."""
        lim = self.limits
        return StorageInfo(
            format=SEGMENT_FORMAT,
            generation=self.generation or None,
            segments=self.segments,
            bytes_written=self.bytes_written,
            meta_bytes_written=self.meta_bytes_written,
            fsyncs=self.fsyncs,
            events_written=events_written,
            steps_written=steps_written,
            ring_overrun=overrun,
            rotated_segments=self.rotated_segments,
            rotated_events=self.rotated_events,
            rotated_spans=self.rotated_spans,
            requests_written=self.requests_written or None,
            tokens_written=self.tokens_written or None,
            rotated_requests=self.rotated_requests or None,
            rotated_tokens=self.rotated_tokens or None,
            retain_s=lim.retain_s,
            max_disk_bytes=lim.max_disk_bytes,
            segment_bytes=lim.segment_bytes,
            tick_s=lim.tick_s,
            stopped=self.stopped or None,
            stopped_ns=self.stopped_ns or None,
            error=self.error or None,
            closed_ns=self.closed_ns or None,
        )

    # -- writing ----------------------------------------------------------------------------------
    def append_batch(
        self, payload: bytes, events: int, spans: int, t_ns: int, step: tuple[int, int] = (-1, 0)
    ) -> bool:
        """Append one batch to the open segment (opening or rotating as needed); ``step``: the
        step the rank is in and when it began, for the cursor file when it is not open yet."""
        if self.stopped:
            return False
        try:
            self._ensure_segment()
            if self._cursor_fd < 0:
                self._open_cursor(*step)
            if self._seg_size >= self.limits.segment_bytes or (
                self.limits.segment_s > 0
                and time.monotonic() - self._seg_opened >= self.limits.segment_s
            ):
                self._rotate()
            seg = self._append_chunk(KIND_BATCH, payload)
            seg.events += events
            seg.spans += spans
            seg.last_ns = t_ns
            return True
        except OSError as e:
            self._stop(e)
            return False

    def append_serving(self, payload: bytes, requests: int, tokens: int, t_ns: int) -> bool:
        """Append one serving chunk (:func:`~meshprof.rundir.segments.serving_payload`) to the
        open segment (opening or rotating as needed)."""
        if self.stopped:
            return False
        try:
            self._ensure_segment()
            if self._seg_size >= self.limits.segment_bytes:
                self._rotate()
            seg = self._append_chunk(KIND_SERVING, payload)
            seg.requests += requests
            seg.tokens += tokens
            seg.last_ns = max(seg.last_ns, t_ns)
            self.requests_written += requests
            self.tokens_written += tokens
            return True
        except OSError as e:
            self._stop(e)
            return False

    def _append_chunk(self, kind: int, payload: bytes) -> _Segment:
        """Append one chunk of ``kind`` to the open segment; returns the segment (raises
        OSError)."""
        data = chunk(kind, payload)
        self._append(self._seg_fd, data, self._seg_size)
        self._seg_size += len(data)
        seg = self._seg
        assert seg is not None
        return seg

    def append_steps(self, rows: bytes) -> bool:
        """Append per-step totals (STEP_TOTALS_DTYPE rows as bytes) to the steps file."""
        if self.stopped or not rows:
            return False
        try:
            self._ensure_segment()
            if self._steps_fd < 0:
                path = self.dir / steps_name(self.generation)
                self._steps_fd = os.open(path, _OPEN | os.O_CREAT, FILE_MODE)
                self._steps_size = os.fstat(self._steps_fd).st_size
                if self._steps_size == 0:
                    head = self._header(0)
                    self._append(self._steps_fd, head, 0)
                    self._steps_size = len(head)
            data = chunk(KIND_STEPS, rows)
            self._append(self._steps_fd, data, self._steps_size)
            self._steps_size += len(data)
            return True
        except OSError as e:
            self._stop(e)
            return False

    def write_meta(self, text: str, fsync: bool = False) -> Path | None:
        """Replace this generation's meta file atomically. Tried after writing stopped too (the
        reserve freed for it); a failure then stays silent. Returns its path, or None."""
        try:
            self._ensure_dir()
            path = self.dir / meta_name(self.generation)
            data = text.encode("utf-8")
            atomic_write_bytes(path, data, fsync=fsync)
            self.meta_bytes_written += len(data)
            if fsync:
                self.fsyncs += 1
            return path
        except OSError as e:
            if not self.stopped:
                self._stop(e)
            return None

    def maintain(self, final: bool = False) -> None:
        """fsync when due (always when ``final``); apply the retention bounds."""
        if self.stopped:
            return
        now = time.monotonic()
        due = (
            self.limits.fsync_interval_s > 0
            and now - self._last_sync >= self.limits.fsync_interval_s
        )
        try:
            if self._dirty and self.limits.fsync and (due or final):
                # the segment every interval; the small steps file only when closing (the page
                # cache keeps it across a process' death, the kernel writes it back in seconds)
                for fd in (self._seg_fd, self._steps_fd) if final else (self._seg_fd,):
                    if fd >= 0:
                        os.fsync(fd)
                        self.fsyncs += 1
                self._dirty = False
                self._last_sync = now
            if due or final:
                self._retain()
        except OSError as e:
            self._stop(e)

    def close(self) -> None:
        """fsync and close the open files and free the reserve; a later append opens the next
        segment of the same generation."""
        self.maintain(final=True)
        self._close_fds()
        self.closed_ns = time.time_ns()
        if self.limits.reserve_bytes > 0:
            with contextlib.suppress(OSError):
                (self.dir / RESERVE).unlink()

    def note_step(self, step: int, t_ns: int) -> None:
        """The rank entered ``step`` at ``t_ns``: rewrite the cursor in place (one ``pwrite`` of
        16 bytes into a block already allocated: no new space, no flush). Called on the training
        thread at every step change; a failure only turns the cursor off."""
        with self._cursor_lock:
            fd = self._cursor_fd
            if fd < 0:
                return
            try:
                os.pwrite(fd, CURSOR.pack(step, t_ns), 0)
            except OSError:
                self._cursor_fd = -1
                with contextlib.suppress(OSError):
                    os.close(fd)

    # -- files ----------------------------------------------------------------------------------
    def _open_cursor(self, step: int, t_ns: int) -> None:
        with self._cursor_lock:
            if self._cursor_fd >= 0:
                return
            fd = os.open(
                self.dir / cursor_name(self.generation),
                os.O_WRONLY | os.O_CREAT | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                FILE_MODE,
            )
            try:
                os.pwrite(fd, CURSOR.pack(step, t_ns), 0)
            except OSError:
                os.close(fd)
                raise
            self._cursor_fd = fd

    def _ensure_dir(self) -> None:
        if self.generation:
            return
        make_dirs(self.run_dir, self.dir)  # (a rank folder that is a link out: not written)
        taken = [0]
        for p in self.dir.iterdir():
            m = SEGMENT_RE.match(p.name) or STEPS_RE.match(p.name) or META_RE.match(p.name)
            if m is not None:
                taken.append(int(m.group(1)))
        self.generation = max(taken) + 1
        self._reserve()

    def _reserve(self) -> None:
        if self.limits.reserve_bytes <= 0:
            return
        try:
            fd = os.open(self.dir / RESERVE, os.O_WRONLY | os.O_CREAT | _NOFOLLOW, FILE_MODE)
        except OSError:
            return
        try:
            os.posix_fallocate(fd, 0, self.limits.reserve_bytes)
        except (OSError, AttributeError):
            pass
        finally:
            os.close(fd)

    def _ensure_segment(self) -> None:
        self._ensure_dir()
        if self._seg_fd >= 0:
            return
        check_inside(self.run_dir, self.dir)  # (at every new segment: replaced by a link since?)
        index = (self._own[-1].index if self._own else 0) + 1
        if self._seg is not None:
            index = max(index, self._seg.index + 1)
        while True:  # (a generation chosen by two processes at once: the second moves on)
            path = self.dir / segment_name(self.generation, index)
            try:
                fd = os.open(path, _OPEN | os.O_CREAT | os.O_EXCL, FILE_MODE)
                break
            except FileExistsError:
                if index == 1:
                    self.generation += 1
                else:
                    index += 1
        self._seg_fd = fd
        self._seg = _Segment(index)
        self._seg_size = 0
        self._seg_opened = time.monotonic()
        self.segments += 1
        head = self._header(index)
        self._append(fd, head, 0)
        self._seg_size = len(head)

    def _header(self, index: int) -> bytes:
        return header_chunk(
            new_header(self.rank, self.generation, index, os.getpid(), self.run_id, time.time_ns())
        )

    def _append(self, fd: int, data: bytes, size_before: int) -> None:
        """Write all of ``data``; on an error cut the file back to ``size_before`` (a chunk is
        in a file whole or not at all) and raise it."""
        view = memoryview(data)
        try:
            while view:
                n = os.write(fd, view)
                view = view[n:]
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size_before)
            raise
        self.bytes_written += len(data)
        self._dirty = True

    def _rotate(self) -> None:
        if self._seg_fd >= 0:
            if self._dirty and self.limits.fsync:
                os.fsync(self._seg_fd)
                self.fsyncs += 1
            os.close(self._seg_fd)
            self._seg_fd = -1
        if self._seg is not None:
            self._own.append(self._seg)
        self._ensure_segment()
        self._retain()

    def _retain(self) -> None:
        """Delete the oldest closed segments beyond the bounds (this generation's, and before
        them the older generations')."""
        lim = self.limits
        if lim.max_disk_bytes <= 0 and lim.retain_s <= 0:
            return
        files: list[tuple[tuple[int, int], Path, int, float]] = []
        total = 0
        active = self.dir / segment_name(self.generation, self._seg.index) if self._seg else None
        for p in self.dir.iterdir():
            if p.name == RESERVE:
                continue
            try:
                st = p.stat(follow_symlinks=False)  # (a link planted here counts nothing)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            total += st.st_size
            m = SEGMENT_RE.match(p.name)
            if m is not None and p != active:
                files.append(((int(m.group(1)), int(m.group(2))), p, st.st_size, st.st_mtime))
        files.sort()
        cutoff = time.time() - lim.retain_s if lim.retain_s > 0 else None
        for (gen, index), path, size, mtime in files:
            over = lim.max_disk_bytes > 0 and total > lim.max_disk_bytes
            old = cutoff is not None and mtime < cutoff
            if not (over or old):
                break
            path.unlink()
            total -= size
            if gen == self.generation:
                seg = next((s for s in self._own if s.index == index), None)
                if seg is not None:
                    self._own.remove(seg)
                    self.rotated_segments += 1
                    self.rotated_events += seg.events
                    self.rotated_spans += seg.spans
                    self.rotated_requests += seg.requests
                    self.rotated_tokens += seg.tokens

    def _close_fds(self) -> None:
        with self._cursor_lock:
            fd, self._cursor_fd = self._cursor_fd, -1
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        for attr in ("_seg_fd", "_steps_fd"):
            fd = getattr(self, attr)
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(self, attr, -1)
        if self._seg is not None:
            self._own.append(self._seg)
            self._seg = None

    def _stop(self, e: OSError) -> None:
        """Writing stops for good: close the files, free half the reserve for the meta."""
        self.stopped = error_name(e)
        self.error = str(e.strerror or e)
        self.stopped_ns = time.time_ns()
        self._close_fds()
        with contextlib.suppress(OSError):
            os.truncate(self.dir / RESERVE, RESERVE_BYTES // 2)
        if self.on_stop is not None:
            with contextlib.suppress(Exception):
                self.on_stop(self)

    def discard(self) -> None:
        """Close and delete this generation's files (written under a rank that turned out to be
        another: the process learnt its rank late); the folder too when nothing else is in it."""
        self._close_fds()
        if not self.generation:
            return
        prefix = f"g{self.generation:03d}-"
        with contextlib.suppress(OSError):
            for p in self.dir.iterdir():
                if p.name.startswith(prefix) or p.name == RESERVE:
                    p.unlink()
            self.dir.rmdir()

    def release_reserve(self) -> None:
        """Free the rest of the reserve (the last meta of a stopped writer)."""
        with contextlib.suppress(OSError):
            (self.dir / RESERVE).unlink()


def describe_stop(info: Any) -> str:
    """One line about a stopped writer: ``ENOSPC (No space left on device)``."""
    what = getattr(info, "stopped", "") or ""
    err = getattr(info, "error", "") or ""
    return f"{what} ({err})" if err and err != what else what


__all__ = [
    "DEFAULT_MAX_DISK",
    "RESERVE_BYTES",
    "SegmentWriter",
    "StorageLimits",
    "describe_stop",
    "error_name",
]

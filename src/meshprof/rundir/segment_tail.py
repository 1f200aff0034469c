"""Following a rank folder while its rank writes it: the batches appended since the last look.

:class:`RankTail` keeps, for each segment file of the rank's newest generation, how many bytes
it has read, and on each :meth:`~RankTail.poll` reads only what was appended since — whole
chunks, each checked as the loader checks them (head, length, CRC-32; the header's row
layouts). A chunk still being written is left for the next look. Segments the retention bounds
delete are forgotten; a new generation (the rank restarted) is followed from its first segment.

With ``requests``, it also keeps the finished-request rows of a serving rank's ``SERVING``
chunks (REQUEST_DTYPE; the token rows are not kept), with the ``traceparent`` rows of their
chunks (REQUEST_TRACE_DTYPE), until :meth:`~RankTail.take_requests` (at most
:data:`MAX_PENDING_REQUESTS`; beyond, the oldest are let go and counted).

It reads files only: the rank does nothing for it. ``meshprof run``'s OpenTelemetry exporter
follows every rank of its node with one tail each (:mod:`meshprof.live.otel.agent`).
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from meshprof.events import REQUEST_DTYPE, REQUEST_TRACE_DTYPE
from meshprof.records.codec import RecordError
from meshprof.rundir.schema import RankMeta
from meshprof.rundir.segments import (
    HEAD,
    KIND_BATCH,
    KIND_SERVING,
    MAGIC,
    VERSION,
    Batch,
    decode_batch,
    decode_serving,
    join_rows,
    parse_header,
    scan_rank_dir,
)

MAX_READ_BYTES = 32 << 20
"""At most this many bytes are read from one rank per poll (the rest at the next): a tail that
starts late, or falls behind, holds a bounded amount of a rank's rows at a time."""
MAX_PENDING_REQUESTS = 1 << 16
"""Finished-request rows kept at most until they are taken."""


@dataclass(slots=True)
class _File:
    offset: int = 0
    """Bytes read and decoded (whole chunks)."""
    header: bool = False
    """The header chunk was read and accepted."""
    problem: str = ""
    """Why the file is no longer read ("" while it is)."""


@dataclass(slots=True)
class TailCounters:
    """What a tail has read so far."""

    batches: int = 0
    """Batches decoded."""
    bytes_read: int = 0
    """Bytes of segment files read."""
    problems: list[str] = field(default_factory=list)
    """Files or chunks that could not be read (the newest 16)."""
    requests_dropped: int = 0
    """Finished-request rows let go before they were taken (:data:`MAX_PENDING_REQUESTS`)."""


class RankTail:
    """The batches one rank folder's newest generation gains, look by look (see the module
    docstring). Never raises for what is in the folder: unreadable files end their reading and
    are named in :attr:`counters`."""

    def __init__(self, path: str | os.PathLike[str], requests: bool = False) -> None:
        self.path = Path(path)
        self.keep_requests = requests
        """Keep the serving chunks' finished-request rows (see the module docstring)."""
        self._requests: list[np.ndarray] = []
        self._traces: list[np.ndarray] = []
        """Each kept chunk's trace rows (one per entry of ``_requests``)."""
        self._pending = 0
        self.generation = -1
        """The generation followed (-1: none yet)."""
        self.counters = TailCounters()
        self._files: dict[str, _File] = {}
        self._meta: RankMeta | None = None
        self._meta_key: tuple[str, int, int] | None = None

    def poll(self, max_bytes: int = MAX_READ_BYTES) -> list[Batch]:
        """The batches appended since the last poll, oldest first (at most ``max_bytes`` read)."""
        files = scan_rank_dir(self.path)
        if files is None:
            return []
        if files.generation != self.generation:
            self.generation = files.generation
            self._files = {}
        present = {p.name for p in files.segments}
        for name in [n for n in self._files if n not in present]:
            del self._files[name]  # rotated out by the retention bounds
        out: list[Batch] = []
        budget = max_bytes
        for seg in files.segments:
            st = self._files.setdefault(seg.name, _File())
            if st.problem:
                continue
            budget -= self._read(seg, st, out, budget)
            if budget <= 0:
                break
        self.counters.batches += len(out)
        return out

    def take_requests(self) -> np.ndarray:
        """The finished-request rows (REQUEST_DTYPE) read since the last call, oldest first."""
        return self.take_traced_requests()[0]

    def take_traced_requests(self) -> tuple[np.ndarray, np.ndarray]:
        """The finished-request rows (REQUEST_DTYPE) read since the last call, oldest first, and
        the ``traceparent`` rows (REQUEST_TRACE_DTYPE) of those that had one."""
        out = join_rows(self._requests, REQUEST_DTYPE)
        traces = join_rows([t for t in self._traces if len(t)], REQUEST_TRACE_DTYPE)
        self._requests, self._traces, self._pending = [], [], 0
        return out, traces

    def _keep_requests(self, rows: np.ndarray, traces: np.ndarray | None = None) -> None:
        self._requests.append(rows)
        self._traces.append(np.zeros(0, REQUEST_TRACE_DTYPE) if traces is None else traces)
        self._pending += len(rows)
        while self._pending > MAX_PENDING_REQUESTS and self._requests:
            old = self._requests.pop(0)
            self._traces.pop(0)
            self._pending -= len(old)
            self.counters.requests_dropped += len(old)

    def meta(self) -> RankMeta | None:
        """The newest generation's meta as last written (read again when the file changed);
        None before the rank writes one, or when it cannot be read."""
        files = scan_rank_dir(self.path)
        if files is None or files.meta is None:
            return self._meta
        try:
            st = files.meta.stat()
        except OSError:
            return self._meta
        key = (files.meta.name, st.st_mtime_ns, st.st_size)
        if key == self._meta_key:
            return self._meta
        try:
            raw = json.loads(files.meta.read_text(encoding="utf-8"))
            if isinstance(raw, dict):
                raw.pop("errors", None)
                raw.pop("metadata", None)
                raw.pop("stats", None)
                self._meta = RankMeta.from_dict(raw, "meta")
                self._meta_key = key
        except (OSError, ValueError, UnicodeDecodeError, RecordError):
            pass  # (raced the writer's rename, or damaged: the last good one stays)
        return self._meta

    def _read(self, path: Path, st: _File, out: list[Batch], budget: int) -> int:
        """Decode the whole chunks of ``path`` after ``st.offset`` into ``out``; bytes read."""
        try:
            with open(path, "rb") as f:
                f.seek(st.offset)
                want = max(budget, HEAD.size)
                data = f.read(want)
                if len(data) == want and len(data) >= HEAD.size:
                    whole = HEAD.size + HEAD.unpack_from(data, 0)[3]
                    if whole > len(data):  # one chunk larger than the budget: read it whole
                        data += f.read(whole - len(data))
        except OSError as e:
            if not isinstance(e, FileNotFoundError):
                self._problem(st, f"{path.name}: {e.strerror or e}")
            return 0
        self.counters.bytes_read += len(data)
        view = memoryview(data)
        pos, n = 0, len(data)
        while pos + HEAD.size <= n:
            magic, kind, version, size, crc = HEAD.unpack_from(view, pos)
            end = pos + HEAD.size + size
            if magic != MAGIC or version != VERSION:
                self._problem(st, f"{path.name}: damaged chunk at byte {st.offset + pos}")
                break
            if end > n:
                break  # still being written (or beyond this poll's budget)
            payload = view[pos + HEAD.size : end]
            if zlib.crc32(payload) != crc:
                break  # torn: the writer may still complete it (a crash leaves it torn)
            if not st.header:
                _, problem = parse_header(kind, payload, path.name)
                if problem:
                    self._problem(st, problem)
                    break
                st.header = True
            elif kind == KIND_BATCH:
                try:
                    out.append(decode_batch(payload))
                except ValueError as e:
                    self._problem(st, f"{path.name}: {e}")
                    break
            elif kind == KIND_SERVING and self.keep_requests:
                try:
                    got = decode_serving(payload)
                except ValueError as e:
                    self._problem(st, f"{path.name}: {e}")
                    break
                if len(got.requests):
                    self._keep_requests(got.requests.copy(), got.traces.copy())
            pos = end
        st.offset += pos
        return len(data)

    def _problem(self, st: _File, why: str) -> None:
        st.problem = why
        self.counters.problems = [*self.counters.problems[-15:], why]


def read_json_lines(path: Path, offset: int, max_bytes: int = 1 << 20) -> tuple[list[dict], int]:
    """The whole JSON-object lines appended to ``path`` after byte ``offset`` (a line not yet
    ended is left for the next call) and the new offset; lines that do not parse are skipped."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(max_bytes)
    except OSError:
        return [], offset
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset
    out: list[dict] = []
    for line in data[:end].split(b"\n"):
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict):
            out.append(d)
    return out, offset + end + 1


__all__ = ["MAX_READ_BYTES", "RankTail", "TailCounters", "read_json_lines"]

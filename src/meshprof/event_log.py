"""The bounded, columnar per-rank event log: a numpy ring buffer of finished collectives.

The hot path appends one plain tuple to a lock-free ``collections.deque`` (about 50 ns). Tuples
are moved in bulk into a preallocated numpy ring buffer (:data:`meshprof.events.EVENT_DTYPE`,
54 bytes per event) when 1024 are staged or when anyone reads the log; the oldest events are
overwritten in O(1). Strings (group names, dtypes, custom labels, error texts, metadata) live in
small side tables, so a retained event is never a Python object.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from meshprof.events import CUSTOM_BASE, EVENT_DTYPE, FLAG_DROPPED, OP_CODES, OP_NAMES, GroupInfo

#: Staged tuples are moved into the ring when this many are waiting.
STAGE_LIMIT = 1024

# Field order of a staged tuple: the EVENT_DTYPE fields, then (error text | None, metadata | None).
N_FIELDS = len(EVENT_DTYPE.names or ())


class EventLog:
    """Ring buffer of retained events plus the tables that name their codes."""

    def __init__(self, capacity: int) -> None:
        self.capacity = int(capacity)
        self._ring = np.zeros(self.capacity, dtype=EVENT_DTYPE)
        self._staged: deque[tuple[Any, ...]] = deque()
        self._lock = threading.Lock()
        self.total = 0  # events ever moved into the ring; event ids are 0..total-1
        self.groups: list[GroupInfo] = []
        self._group_index: dict[str, int] = {}
        self.dtypes: list[str] = []
        self._dtype_index: dict[str, int] = {}
        self.labels: list[str] = []
        self._label_index: dict[str, int] = {}
        self.errors: dict[int, str] = {}  # event id -> error text
        self.metadata: dict[int, dict[str, Any]] = {}  # event id -> metadata
        self.listeners: list[Any] = []  # callables(chunk: np.ndarray, groups) fed on every flush
        self.chunks = 0
        """Chunks fed to the listeners so far (a listener sees its chunk's number here)."""

    # -- tables -------------------------------------------------------------------------------
    def group_index(self, info: GroupInfo) -> int:
        idx = self._group_index.get(info.name)
        if idx is None:
            with self._lock:
                idx = self._group_index.get(info.name)
                if idx is None:
                    idx = len(self.groups)
                    self.groups.append(info)
                    self._group_index[info.name] = idx
        return idx

    def dtype_code(self, name: str) -> int:
        code = self._dtype_index.get(name)
        if code is None:
            with self._lock:
                code = self._dtype_index.get(name)
                if code is None:
                    code = len(self.dtypes)
                    if code > 255:
                        return 255
                    self.dtypes.append(name)
                    self._dtype_index[name] = code
        return code

    def op_code(self, name: str) -> int:
        code = OP_CODES.get(name)
        if code is not None:
            return code
        code = self._label_index.get(name)
        if code is None:
            with self._lock:
                code = self._label_index.get(name)
                if code is None:
                    if len(self.labels) >= 256 - CUSTOM_BASE:
                        return OP_CODES["custom"]
                    self.labels.append(name)
                    code = CUSTOM_BASE + len(self.labels) - 1
                    self._label_index[name] = code
        return code

    def op_name(self, code: int) -> str:
        if code >= CUSTOM_BASE:
            return self.labels[code - CUSTOM_BASE]
        return OP_NAMES[code]

    # -- write --------------------------------------------------------------------------------
    def append(self, row: tuple[Any, ...]) -> None:
        """Stage one event tuple (EVENT_DTYPE fields, error | None, metadata | None)."""
        self._staged.append(row)
        if len(self._staged) >= STAGE_LIMIT:
            self.flush()

    def stage(self, row: tuple[Any, ...]) -> bool:
        """Stage one event tuple without flushing: True when :data:`STAGE_LIMIT` are staged
        and the caller should :meth:`flush` (once it holds no lock of its own)."""
        self._staged.append(row)
        return len(self._staged) >= STAGE_LIMIT

    def flush(self) -> None:
        """Move every staged tuple into the ring (thread-safe)."""
        with self._lock:
            self._flush_staged()

    def append_chunk(
        self,
        chunk: np.ndarray,
        errors: dict[int, str] | None = None,
        metadata: dict[int, dict[str, Any]] | None = None,
    ) -> None:
        """Add a whole EVENT_DTYPE array at once (after the staged tuples, in order): the native
        kernel's drain. ``errors`` / ``metadata``: index in ``chunk`` -> error text / metadata."""
        with self._lock:
            self._flush_staged()
            self._ingest(chunk, errors or {}, metadata or {})

    def _flush_staged(self) -> None:
        staged = self._staged
        n = len(staged)
        if n == 0:
            return
        rows = [staged.popleft() for _ in range(n)]
        chunk = np.array([r[:N_FIELDS] for r in rows], dtype=EVENT_DTYPE)
        errors = {i: r[N_FIELDS] for i, r in enumerate(rows) if r[N_FIELDS] is not None}
        meta = {i: r[N_FIELDS + 1] for i, r in enumerate(rows) if r[N_FIELDS + 1] is not None}
        self._ingest(chunk, errors, meta)

    def _ingest(
        self, chunk: np.ndarray, errors: dict[int, str], metadata: dict[int, dict[str, Any]]
    ) -> None:
        """Feed the listeners every event, then keep the retained ones (lock held)."""
        self.chunks += 1
        for listener in self.listeners:
            listener(chunk)
        keep = (chunk["flags"] & FLAG_DROPPED) == 0
        if not keep.all():
            if errors or metadata:
                new_index = np.cumsum(keep) - 1
                errors = {int(new_index[i]): v for i, v in errors.items() if keep[i]}
                metadata = {int(new_index[i]): v for i, v in metadata.items() if keep[i]}
            chunk = chunk[keep]
        first_id = self.total
        for i, e in errors.items():
            self.errors[first_id + i] = e
        for i, m in metadata.items():
            self.metadata[first_id + i] = m
        if len(chunk):
            self._write(chunk, first_id)

    def _write(self, chunk: np.ndarray, first_id: int) -> None:
        n = len(chunk)
        if n > self.capacity:  # only the newest `capacity` survive
            chunk = chunk[n - self.capacity :]
            self.total += n - self.capacity
            n = self.capacity
        start = self.total % self.capacity
        end = start + n
        if end <= self.capacity:
            self._ring[start:end] = chunk
        else:
            k = self.capacity - start
            self._ring[start:] = chunk[:k]
            self._ring[: n - k] = chunk[k:]
        self.total += n
        if self.total > self.capacity and (self.errors or self.metadata):
            oldest = self.total - self.capacity
            for table in (self.errors, self.metadata):
                for key in [k for k in table if k < oldest]:
                    del table[key]

    @property
    def evicted(self) -> int:
        """Events overwritten because the ring was full."""
        return max(0, self.total - self.capacity)

    def resized(self, capacity: int) -> EventLog:
        """A log of ``capacity`` slots holding the newest retained events (renumbered from 0),
        the same name tables and the same listeners; error texts and metadata are not carried."""
        events, _ids = self.snapshot()
        new = EventLog(capacity)
        new.groups, new._group_index = self.groups, self._group_index
        new.dtypes, new._dtype_index = self.dtypes, self._dtype_index
        new.labels, new._label_index = self.labels, self._label_index
        new._write(events[-capacity:], 0)
        new.listeners = list(self.listeners)
        new.chunks = self.chunks
        return new

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the log's lock: no flush (which feeds the listeners) runs meanwhile."""
        with self._lock:
            yield

    # -- read ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        self.flush()
        return min(self.total, self.capacity)

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        """(events, ids): a copy of the retained events, oldest first, and their event ids."""
        self.flush()
        with self._lock:
            n = min(self.total, self.capacity)
            ids = np.arange(self.total - n, self.total, dtype=np.int64)
            if self.total <= self.capacity:
                return self._ring[:n].copy(), ids
            start = self.total % self.capacity
            return np.concatenate([self._ring[start:], self._ring[:start]]), ids

    def rows_since(self, first_id: int) -> tuple[np.ndarray, int]:
        """(rows, id of rows[0]): a copy of the retained events with ids >= ``first_id``, oldest
        first (from the oldest retained one when ``first_id`` was evicted already). Staged
        tuples are not flushed here: the caller flushes first (a crash-safe tick reads only what
        it has not copied yet, so its cost grows with the new events, not with the ring)."""
        with self._lock:
            oldest = max(0, self.total - self.capacity)
            a = max(int(first_id), oldest)
            n = self.total - a
            if n <= 0:
                return self._ring[:0].copy(), self.total
            start = a % self.capacity
            end = start + n
            if end <= self.capacity:
                return self._ring[start:end].copy(), a
            return np.concatenate([self._ring[start:], self._ring[: end - self.capacity]]), a

    @property
    def ring(self) -> np.ndarray:
        """The ring buffer itself as a read-only view (no copy; staged tuples are not flushed):
        the event of id ``i`` is in slot ``i % capacity`` while it is retained. For inspection;
        :meth:`snapshot` gives the events in order."""
        view = self._ring.view()
        view.flags.writeable = False
        return view

    def clear(self) -> None:
        with self._lock:
            self._staged.clear()
            self.total = 0
            self.errors.clear()
            self.metadata.clear()

    @property
    def nbytes(self) -> int:
        """Bytes held by the ring buffer (54 per slot)."""
        return int(self._ring.nbytes)

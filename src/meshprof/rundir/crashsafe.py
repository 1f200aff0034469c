"""Crash-safe rank data: what a rank recorded, kept in memory-mapped files that outlive it.

A rank killed by a signal it cannot catch (SIGKILL, the OOM killer, a segfault) never writes its
rank file. So, besides the periodic rank-file writes, the rank writer's thread calls
:meth:`CrashSafeStore.tick` every :data:`TICK_S` seconds: it flushes the recorder (staged events,
the native kernel's drain) and copies what is new since the last tick into files mapped into
memory (``numpy.lib.format.open_memmap``). The kernel keeps a mapped file's pages when the
process dies, so the files hold everything recorded up to the last tick: at most
``TICK_S`` (+ the tick's own time) before the death. Nothing is done per collective: the cost is
one flush and a copy of the new rows per tick, plus one store into the mapped cursor per step.

Files (``DIR/crashsafe/``, one set per rank, plain ``.npy`` files ``numpy.load`` reads)::

    rank00001.events.npy   EVENT_DTYPE ring: event id i is in slot i % capacity
    rank00001.spans.npy    SPAN_DTYPE ring (spans in the order they closed)
    rank00001.memory.npy   MEMORY_DTYPE ring
    rank00001.cursor.npy   int64[16]: see the CUR_* indices
    rank00001.meta.json    the rank meta without statistics (rewritten when its tables change)

A rank that ends normally removes its files once its final rank file is written
(:meth:`CrashSafeStore.discard`); files left behind belong to a rank that died.
:func:`recover_rank` turns them back into :class:`~meshprof.rundir.rankfile.RankData` (load_run
uses it when the rank file is missing or older; ``meshprof run``'s launcher writes the recovered
rank file with :func:`finalize_crashsafe`).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import threading
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from meshprof.events import EVENT_DTYPE, MEMORY_DTYPE, SPAN_DTYPE
from meshprof.rundir.rankfile import RankData, write_rank_file
from meshprof.rundir.schema import RANK_FORMAT, ExitStatus, RankMeta

if TYPE_CHECKING:
    from meshprof.comm.recorder import CommProfiler

CRASHSAFE_DIR = "crashsafe"
"""Folder of the mapped files inside the run directory."""
TICK_S = 0.5
"""Seconds between two ticks: a killed rank loses at most this (plus one tick's time)."""
SPAN_CAPACITY = 1_000_000
"""Slots of the mapped span and memory rings (at most the step monitor's own limit)."""

CURSOR_LEN = 16
CUR_VERSION = 0
"""Format version of the cursor (1)."""
CUR_PID = 1
CUR_EVENTS = 2
"""Events copied so far: the recorder's event ids 0 .. n-1 (id i in slot i % capacity; the
newest ``capacity`` are kept, as in the recorder's own ring)."""
CUR_SPANS = 3
CUR_MEMORY = 4
CUR_TICK_NS = 5
"""Wall clock (ns) when the last tick's flush began: everything recorded before it is in."""
CUR_STEP = 6
"""The step the rank was in (noted at every step change; -1 before the first)."""
CUR_STEP_NS = 7
"""Wall clock (ns) when that step began."""
CUR_TICKS = 8
CUR_RANK = 9

_NAME_RE = re.compile(r"^rank(\d+)\.cursor\.npy$")


def crashsafe_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CRASHSAFE_DIR


def crashsafe_path(run_dir: str | Path, rank: int, part: str) -> Path:
    """``DIR/crashsafe/rank00001.<part>`` (part: events.npy, spans.npy, memory.npy,
    cursor.npy, meta.json)."""
    return crashsafe_dir(run_dir) / f"rank{rank:05d}.{part}"


_PARTS = ("events.npy", "spans.npy", "memory.npy", "meta.json", "cursor.npy")


def _write_json(path: Path, obj: Any) -> None:
    """Temporary file + rename (no fsync: the page cache survives the process, which is what
    this file is for; a machine crash is not)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, default=str), encoding="utf-8")
    os.replace(tmp, path)


def _mapped(run_dir: Path, rank: int, part: str, dtype: np.dtype, n: int) -> np.ndarray:
    """A new ``.npy`` file of ``n`` zeroed rows mapped into memory, as a plain ndarray view (a
    store into it is an ndarray store, without np.memmap's per-operation overhead; the view
    keeps the mapping alive)."""
    mm = np.lib.format.open_memmap(crashsafe_path(run_dir, rank, part), "w+", dtype, (int(n),))
    return mm.view(np.ndarray)


class _Tail:
    """Copies the rows appended to a ``deque`` since the last call, without a counter in the
    producer: the last row copied is found again by identity, searching from the right."""

    def __init__(self) -> None:
        self.last: object = None
        self._window = 64

    def new_rows(self, dq: deque[Any]) -> list[Any]:
        k = self._window
        while True:
            # one C call (no Python code runs inside, so no other thread appends meanwhile)
            tail = list(itertools.islice(reversed(dq), k))
            found = -1
            if self.last is not None:
                for i, row in enumerate(tail):
                    if row is self.last:
                        found = i
                        break
            if found >= 0 or len(tail) < k:
                new = tail[:found] if found >= 0 else tail
                new.reverse()
                if new:
                    self.last = new[-1]
                self._window = max(64, 2 * len(new))
                return new
            k *= 4


class CrashSafeStore:
    """The mapped files of one rank, written from the rank writer's thread. No method raises:
    a failure switches the store off and is kept in :attr:`error`."""

    def __init__(self, run_dir: str | Path, tick_s: float = TICK_S) -> None:
        self.run_dir = Path(run_dir)
        self.tick_s = float(tick_s)
        self.error = ""
        """Why the store switched itself off ("" while it works)."""
        self.ticks = 0
        self._rank: int | None = None
        self._cursor: np.ndarray | None = None
        self._events: np.ndarray | None = None
        self._spans: np.ndarray | None = None
        self._memory: np.ndarray | None = None
        self._log: Any = None
        self._next_id = 0
        self._spans_tail = _Tail()
        self._memory_tail = _Tail()
        self._meta_sig: tuple[Any, ...] | None = None
        self._closed = False
        self._prof: CommProfiler | None = None
        self._lock = threading.Lock()  # a tick and discard() never interleave

    # -- writing (inside the training process) --------------------------------------------------
    def tick(
        self,
        prof: CommProfiler,
        monitor: Any,
        rank: int,
        extra_meta: dict[str, Any] | None = None,
    ) -> None:
        """Flush the recorder and copy what is new into the mapped files."""
        with self._lock:
            self._tick(prof, monitor, rank, extra_meta)

    def _tick(
        self, prof: CommProfiler, monitor: Any, rank: int, extra_meta: dict[str, Any] | None
    ) -> None:
        if self._closed or self.error:
            return
        try:
            t0 = time.time_ns()
            prof.flush()
            if self._cursor is None or rank != self._rank:
                self._open(prof, monitor, rank)
            cur = self._cursor
            assert cur is not None
            self._copy_events(prof)
            if monitor is not None:
                self._copy_spans(monitor)
            self._write_meta(prof, monitor, rank, extra_meta or {})
            self.ticks += 1
            cur[CUR_TICKS] = self.ticks
            cur[CUR_TICK_NS] = t0  # last: the data above is complete up to t0
        except Exception as e:
            self.error = f"{type(e).__name__}: {e}"

    def note_step(self, step: int) -> None:
        """The rank entered ``step`` (a profiler step listener: once per step)."""
        cur = self._cursor
        if cur is not None:
            try:  # (zero-cost try: this runs once per step)
                cur[CUR_STEP] = step
                cur[CUR_STEP_NS] = time.time_ns()
            except Exception:
                pass

    def discard(self) -> None:
        """The final rank file is written: stop, and remove this rank's mapped files."""
        with self._lock:
            self._discard()

    def _discard(self) -> None:
        self._closed = True
        if self._prof is not None:
            with contextlib.suppress(ValueError):
                self._prof.step_listeners.remove(self.note_step)
        self._cursor = self._events = self._spans = self._memory = None
        if self._rank is not None:
            remove_crashsafe(self.run_dir, self._rank)

    def _open(self, prof: CommProfiler, monitor: Any, rank: int) -> None:
        if self._rank is not None and rank != self._rank:
            remove_crashsafe(self.run_dir, self._rank)
        d = crashsafe_dir(self.run_dir)
        d.mkdir(parents=True, exist_ok=True)
        cap = int(prof.log.capacity)
        rows = getattr(monitor, "span_rows", None)
        span_cap = min(int(getattr(rows, "maxlen", 0) or SPAN_CAPACITY), SPAN_CAPACITY)
        self._events = _mapped(self.run_dir, rank, "events.npy", EVENT_DTYPE, cap)
        self._spans = _mapped(self.run_dir, rank, "spans.npy", SPAN_DTYPE, span_cap)
        self._memory = _mapped(self.run_dir, rank, "memory.npy", MEMORY_DTYPE, span_cap)
        cur = _mapped(self.run_dir, rank, "cursor.npy", np.dtype(np.int64), CURSOR_LEN)
        cur[:] = 0
        cur[CUR_VERSION] = 1
        cur[CUR_PID] = os.getpid()
        cur[CUR_RANK] = rank
        cur[CUR_STEP] = prof.step
        cur[CUR_STEP_NS] = time.time_ns()
        self._rank = rank
        self._cursor = cur
        self._log = None
        self._meta_sig = None
        if self._prof is None:
            self._prof = prof
            prof.step_listeners.append(self.note_step)

    def _copy_events(self, prof: CommProfiler) -> None:
        log, ring, cur = prof.log, self._events, self._cursor
        assert ring is not None and cur is not None
        if log is not self._log or log.total < self._next_id:
            # the first tick, a resized log (renumbered from 0) or a cleared one (ids restart
            # at 0): copy from its oldest retained event into a ring of its capacity
            if len(ring) != log.capacity:
                self._events = ring = _mapped(
                    self.run_dir, int(cur[CUR_RANK]), "events.npy", EVENT_DTYPE, log.capacity
                )
            self._log = log
            self._next_id = 0
            cur[CUR_EVENTS] = 0
        rows, first = log.rows_since(self._next_id)
        n = len(rows)
        if n == 0:
            return
        cap = len(ring)
        start = first % cap
        end = start + n
        if end <= cap:
            ring[start:end] = rows
        else:
            k = cap - start
            ring[start:] = rows[:k]
            ring[: n - k] = rows[k:]
        self._next_id = first + n
        cur[CUR_EVENTS] = self._next_id  # after the rows: a reader never sees unwritten slots

    def _copy_spans(self, monitor: Any) -> None:
        for attr, tail, ring, slot, dtype in (
            ("span_rows", self._spans_tail, self._spans, CUR_SPANS, SPAN_DTYPE),
            ("memory_rows", self._memory_tail, self._memory, CUR_MEMORY, MEMORY_DTYPE),
        ):
            dq = getattr(monitor, attr, None)
            if not isinstance(dq, deque) or ring is None or self._cursor is None:
                continue
            new = tail.new_rows(dq)
            if not new:
                continue
            arr = np.array(new, dtype=dtype)
            cap = len(ring)
            if len(arr) > cap:
                arr = arr[-cap:]
            total = int(self._cursor[slot])
            pos = (total + np.arange(len(arr))) % cap
            ring[pos] = arr
            self._cursor[slot] = total + len(arr)

    def _write_meta(
        self, prof: CommProfiler, monitor: Any, rank: int, extra: dict[str, Any]
    ) -> None:
        log = prof.log
        names = getattr(monitor, "span_names", None) if monitor is not None else None
        sig = (
            rank,
            len(log.groups),
            len(log.dtypes),
            len(log.labels),
            len(names or ()),
            len(log.errors),
            tuple(sorted(extra)),
            prof.world_size,
        )
        if sig == self._meta_sig:
            return
        meta = prof.meta()
        meta.update(
            format=RANK_FORMAT,
            rank=rank,
            dtypes=list(log.dtypes),
            labels=list(log.labels),
            # keyed by event id here; recover_rank re-keys them by row
            errors={str(k): v for k, v in list(log.errors.items())},
        )
        if monitor is not None:
            with contextlib.suppress(Exception):
                meta["monitor"] = monitor.to_meta()
                meta["span_names"] = list(monitor.span_names)
        for k, v in extra.items():
            if k not in ("exit", "writer"):
                meta[k] = v.to_dict() if isinstance(v, ExitStatus) else v
        _write_json(crashsafe_path(self.run_dir, rank, "meta.json"), meta)
        self._meta_sig = sig


# -- reading (the loader, the launcher) ---------------------------------------------------------
def crashsafe_ranks(run_dir: str | Path) -> list[int]:
    """Ranks with crash-safe files left in ``run_dir`` (ranks that did not end normally)."""
    d = crashsafe_dir(run_dir)
    try:
        names = [p.name for p in d.iterdir()]
    except OSError:
        return []
    return sorted(int(m.group(1)) for n in names if (m := _NAME_RE.match(n)) is not None)


def remove_crashsafe(run_dir: str | Path, rank: int) -> None:
    """Remove rank ``rank``'s mapped files (and the folder once empty). Never raises."""
    for part in _PARTS:
        with contextlib.suppress(OSError):
            crashsafe_path(run_dir, rank, part).unlink()
    with contextlib.suppress(OSError):
        crashsafe_dir(run_dir).rmdir()


def _ring_rows(ring: np.ndarray, total: int) -> np.ndarray:
    """The rows 0 .. total-1 of a ring written at ``i % len(ring)``, oldest first (the newest
    ``len(ring)`` of them)."""
    cap = len(ring)
    if total <= 0 or cap == 0:
        return np.array(ring[:0])
    n = min(total, cap)
    start = (total - n) % cap
    idx = (start + np.arange(n)) % cap
    return np.array(ring[idx])


def crashsafe_tick_ns(run_dir: str | Path, rank: int) -> int:
    """When rank ``rank``'s last tick began (wall clock ns); 0 when it has none."""
    try:
        cur = np.load(crashsafe_path(run_dir, rank, "cursor.npy"), allow_pickle=False)
        return int(cur[CUR_TICK_NS])
    except (OSError, ValueError, IndexError):
        return 0


def recover_rank(run_dir: str | Path, rank: int) -> RankData | None:
    """Rank ``rank``'s data from its crash-safe files: everything up to its last tick, with a
    meta that says so (``recovered``: from, tick_ns, step, step_ns, pid). None when the files are
    missing, damaged or never ticked."""
    try:
        cur = np.load(crashsafe_path(run_dir, rank, "cursor.npy"), allow_pickle=False)
        if len(cur) < CURSOR_LEN or int(cur[CUR_VERSION]) != 1 or int(cur[CUR_TICK_NS]) <= 0:
            return None
        raw = json.loads(crashsafe_path(run_dir, rank, "meta.json").read_text(encoding="utf-8"))
        ev = np.load(crashsafe_path(run_dir, rank, "events.npy"), mmap_mode="r")
        sp = np.load(crashsafe_path(run_dir, rank, "spans.npy"), mmap_mode="r")
        mem = np.load(crashsafe_path(run_dir, rank, "memory.npy"), mmap_mode="r")
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(raw, dict) or ev.dtype != EVENT_DTYPE or sp.dtype != SPAN_DTYPE:
        return None
    if mem.dtype != MEMORY_DTYPE:
        return None
    total = int(cur[CUR_EVENTS])
    events = _ring_rows(ev, total)
    spans = _ring_rows(sp, int(cur[CUR_SPANS]))
    memory = _ring_rows(mem, int(cur[CUR_MEMORY]))
    first_id = max(0, total - len(ev))
    errors = {
        str(int(k) - first_id): v
        for k, v in (raw.get("errors") or {}).items()
        if str(k).lstrip("-").isdigit() and first_id <= int(k) < first_id + len(events)
    }
    meta = RankMeta.from_dict(raw).updated(
        rank=rank,
        pid=int(cur[CUR_PID]),
        exported_ns=int(cur[CUR_TICK_NS]),
        total_events=total,
        retained_events=len(events),
        evicted_events=max(0, total - len(ev)),
        first_event_id=first_id,
        errors=errors,
        metadata={},
        stats=_stats_of(events, raw, rank),
        recovered={
            "from": CRASHSAFE_DIR,
            "tick_ns": int(cur[CUR_TICK_NS]),
            "step": int(cur[CUR_STEP]),
            "step_ns": int(cur[CUR_STEP_NS]),
            "pid": int(cur[CUR_PID]),
            "ticks": int(cur[CUR_TICKS]),
        },
    )
    return RankData(rank=rank, events=events, spans=spans, memory=memory, meta=meta)


def _stats_of(events: np.ndarray, raw: dict[str, Any], rank: int) -> dict[str, Any]:
    """The statistics of the recovered events (exact over them; what was evicted or sampled out
    before the death is not in them)."""
    from meshprof.events import CUSTOM_BASE, OP_NAMES
    from meshprof.stats import Accumulator

    groups = [g for g in (raw.get("groups") or []) if isinstance(g, dict)]
    labels = list(raw.get("labels") or [])
    cfg = raw.get("config") or {}
    acc = Accumulator(float(cfg.get("sketch_relative_error", 0.01) or 0.01))

    def op_name(code: int) -> str:
        if code >= CUSTOM_BASE:
            i = code - CUSTOM_BASE
            return labels[i] if i < len(labels) else f"custom{i}"
        return OP_NAMES[code]

    def group_name(g: int) -> str:
        return str(groups[g].get("name", g)) if g < len(groups) else str(g)

    def group_size(g: int) -> int:
        if g >= len(groups):
            return 1
        return len(groups[g].get("ranks") or []) or 1

    acc.add_chunk(events, max(rank, 0), op_name, group_name, group_size)
    return acc.to_dict()


def is_newer_than(recovered: RankData, rank_file_data: RankData | None) -> bool:
    """Whether recovered crash-safe data should stand in for a rank file: there is none, or it
    has no exit record (the rank never wrote its final file) and was written before the last
    tick."""
    if rank_file_data is None:
        return True
    m = rank_file_data.meta
    if m.exit is not None:
        return False
    rec = recovered.meta.recovered
    return int((rec.tick_ns if rec is not None else None) or 0) > int(m.exported_ns or 0)


def finalize_crashsafe(
    run_dir: str | Path,
    exits: dict[int, ExitStatus] | None = None,
    node_id: str | None = None,
    pids: dict[int, int] | None = None,
) -> list[int]:
    """Turn the crash-safe files of the ranks that died into rank files (the launcher's finish
    step): for each rank whose files are newer than its rank file, write the recovered rank file
    (with ``exits[rank]`` as its exit, when the launcher learnt it); then remove the files.
    Only ranks of the launcher ``node_id`` (by their meta's node id) when given. With ``pids``
    (rank -> the pid the exit belongs to), an exit is applied only to the process it is about
    (the pid its crash-safe cursor holds): a restarted worker is not given its predecessor's
    exit. Returns the
    ranks whose rank file was written from crash-safe data."""
    from meshprof.errors import MeshprofError
    from meshprof.rundir.rankfile import load_rank_file
    from meshprof.rundir.schema import rank_file

    done: list[int] = []
    for r in crashsafe_ranks(run_dir):
        rec = recover_rank(run_dir, r)
        if rec is not None and node_id and rec.meta.node_id and rec.meta.node_id != node_id:
            continue
        if rec is not None:
            try:
                old: RankData | None = load_rank_file(rank_file(run_dir, r))
            except MeshprofError:
                old = None
            if is_newer_than(rec, old):
                ex = (exits or {}).get(r)
                pid = (pids or {}).get(r)
                if pid is not None and rec.meta.pid is not None and pid != rec.meta.pid:
                    ex = None
                if ex is not None:
                    rec.meta = rec.meta.updated(exit=ex)
                try:
                    write_rank_file(run_dir, rec)
                except OSError:
                    continue  # keep the mapped files: load_run still recovers from them
                done.append(r)
        remove_crashsafe(run_dir, r)
    return done


__all__ = [
    "CRASHSAFE_DIR",
    "TICK_S",
    "CrashSafeStore",
    "crashsafe_dir",
    "crashsafe_path",
    "crashsafe_ranks",
    "crashsafe_tick_ns",
    "finalize_crashsafe",
    "is_newer_than",
    "recover_rank",
    "remove_crashsafe",
]

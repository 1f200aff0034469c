"""Reading the crash-safe files of older meshprof versions (``DIR/crashsafe/``).

Before segments (:mod:`meshprof.rundir.segments`), a running rank kept memory-mapped copies of
what it recorded in ``DIR/crashsafe/`` (a page fault on a full disk killed the rank with SIGBUS,
which is why they are gone); a rank that died without its final rank file left them behind. A
run directory of those versions still loads: :func:`recover_rank` turns the files back into
:class:`~meshprof.rundir.rankfile.RankData` (``load_run`` uses it when the rank file is missing or
older), :func:`finalize_crashsafe` writes the recovered rank file.

Files (one set per rank, plain ``.npy`` files)::

    rank00001.events.npy   EVENT_DTYPE ring: event id i is in slot i % capacity
    rank00001.spans.npy    SPAN_DTYPE ring (spans in the order they closed)
    rank00001.memory.npy   MEMORY_DTYPE ring
    rank00001.cursor.npy   int64[16]: see the CUR_* indices
    rank00001.meta.json    the rank meta without statistics
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any

import numpy as np

from meshprof.events import EVENT_DTYPE, MEMORY_DTYPE, SPAN_DTYPE
from meshprof.rundir.json_file import read_json
from meshprof.rundir.rankfile import RankData, write_rank_file
from meshprof.rundir.schema import ExitStatus, RankMeta, launcher_exit

CRASHSAFE_DIR = "crashsafe"
"""Folder of the mapped files inside the run directory."""

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
        raw = read_json(crashsafe_path(run_dir, rank, "meta.json"))
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
                ex = launcher_exit(exits, pids, r, rec.meta.pid)
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
    "crashsafe_dir",
    "crashsafe_path",
    "crashsafe_ranks",
    "crashsafe_tick_ns",
    "finalize_crashsafe",
    "is_newer_than",
    "recover_rank",
    "remove_crashsafe",
]

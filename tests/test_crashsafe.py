"""The crash-safe files of older versions (``DIR/crashsafe/``: memory-mapped rings a rank that
died left behind) still load, and the launcher's finish step still turns them into rank files.
The files are written here as those versions laid them out (plain ``.npy`` rings and a cursor)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from meshprof.events import EVENT_DTYPE, MEMORY_DTYPE, OP_CODES, SPAN_DTYPE
from meshprof.rundir import load_run, write_rank_file
from meshprof.rundir.crashsafe import (
    CUR_EVENTS,
    CUR_PID,
    CUR_STEP,
    CUR_TICK_NS,
    CUR_VERSION,
    CURSOR_LEN,
    crashsafe_path,
    crashsafe_ranks,
    finalize_crashsafe,
)
from meshprof.rundir.rankfile import RankData
from meshprof.rundir.schema import ExitStatus, RankMeta


def _events(seqs: range) -> np.ndarray:
    ev = np.zeros(len(seqs), EVENT_DTYPE)
    ev["op"] = OP_CODES["all_reduce"]
    ev["seq"] = list(seqs)
    ev["start_ns"] = [1000 * s for s in seqs]
    ev["duration_ns"] = 10
    ev["in_bytes"] = ev["out_bytes"] = 64
    return ev


def _leave_crashsafe(run_dir: Path, rank: int, total: int, capacity: int = 16) -> None:
    """What an older version's rank left after its last tick: ``total`` events (ids 0 ..
    total-1) in a ring of ``capacity`` slots, tick at 5_000 ns, step 3."""
    (run_dir / "crashsafe").mkdir(parents=True, exist_ok=True)
    ring = np.zeros(capacity, EVENT_DTYPE)
    for i, row in zip(range(total), _events(range(total)), strict=True):
        ring[i % capacity] = row
    np.save(crashsafe_path(run_dir, rank, "events.npy"), ring)
    np.save(crashsafe_path(run_dir, rank, "spans.npy"), np.zeros(4, SPAN_DTYPE))
    np.save(crashsafe_path(run_dir, rank, "memory.npy"), np.zeros(4, MEMORY_DTYPE))
    cur = np.zeros(CURSOR_LEN, np.int64)
    cur[CUR_VERSION], cur[CUR_PID], cur[CUR_EVENTS] = 1, os.getpid(), total
    cur[CUR_TICK_NS], cur[CUR_STEP] = 5_000, 3
    np.save(crashsafe_path(run_dir, rank, "cursor.npy"), cur)
    meta = {"rank": rank, "groups": [{"name": "0", "ranks": [0, 1]}], "errors": {}}
    crashsafe_path(run_dir, rank, "meta.json").write_text(json.dumps(meta))


def test_old_crashsafe_files_load_and_finalize(tmp_path: Path) -> None:
    _leave_crashsafe(tmp_path, 0, total=40)  # the ring wrapped: the newest 16 are kept
    rd = RankData(
        0, _events(range(5)), np.zeros(0, SPAN_DTYPE), np.zeros(0, MEMORY_DTYPE), RankMeta(rank=0)
    )
    write_rank_file(tmp_path, rd)  # an earlier periodic write, older than the last tick
    run = load_run(tmp_path)
    got = run.ranks[0]
    assert got.events["seq"].tolist() == list(range(24, 40)) and run.problems == {}
    assert got.meta.recovered is not None and got.meta.recovered["step"] == 3
    assert got.meta.total_events == 40 and got.meta.first_event_id == 24
    ex = ExitStatus("signal", 137, "SIGKILL", 5)
    assert finalize_crashsafe(tmp_path, {0: ex}) == [0]
    assert crashsafe_ranks(tmp_path) == [] and not (tmp_path / "crashsafe").exists()
    got = load_run(tmp_path).ranks[0]
    assert got.meta.exit == ex and got.events["seq"].tolist() == list(range(24, 40))


def test_a_final_old_rank_file_wins_over_leftover_files(tmp_path: Path) -> None:
    _leave_crashsafe(tmp_path, 2, total=9)
    meta = RankMeta(rank=2, exit=ExitStatus("normal", 0, "", 1))
    rd = RankData(2, _events(range(4)), np.zeros(0, SPAN_DTYPE), np.zeros(0, MEMORY_DTYPE), meta)
    write_rank_file(tmp_path, rd)
    got = load_run(tmp_path).ranks[2]
    assert got.meta.recovered is None and len(got.events) == 4

"""Crash-safe rank data without processes: a recorder and step monitor fed synthetic events,
ticked into the mapped files, then recovered as a killed rank's would be (the files are all a
SIGKILL leaves; the store is simply abandoned, never discarded)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from meshprof.api import StepMonitor
from meshprof.comm.recorder import CommProfiler
from meshprof.config import ProfilerConfig
from meshprof.events import OP_CODES, GroupInfo
from meshprof.rundir import load_run, write_rank_file
from meshprof.rundir.crashsafe import (
    CrashSafeStore,
    crashsafe_ranks,
    finalize_crashsafe,
    recover_rank,
)
from meshprof.rundir.schema import ExitStatus, rank_file
from meshprof.rundir.writer import RankWriter, rank_data


def _feed(prof: CommProfiler, seqs: range, step: int) -> None:
    """Append all_reduce events with the given seqs (start = 1000 * seq ns) in ``step``."""
    g = prof.log.group_index(GroupInfo("0", "default_pg", (0, 1, 2), "gloo"))
    dt = prof.log.dtype_code("float32")
    for s in seqs:
        prof.log.append(
            (OP_CODES["all_reduce"], 0, dt, 0, g, -1, s, 64, 64, 1000 * s, 10 + s, step, None, None)
        )


def test_recovery_holds_everything_up_to_the_last_tick(tmp_path: Path) -> None:
    prof = CommProfiler(ProfilerConfig(max_events=100))
    mon = StepMonitor(None, profiler=prof, rank=1)
    store = CrashSafeStore(tmp_path)
    extra = {"node_id": "n1", "world_size": 3}  # the writer's extra meta, passed at every tick
    for step in range(3):
        with mon.step(tokens=8), mon.phase("forward"):
            _feed(prof, range(step * 10, step * 10 + 10), step)
        store.tick(prof, mon, rank=1, extra_meta=extra)
    with mon.step():  # step 3 is in progress at the "death"
        _feed(prof, range(30, 35), 3)
        store.tick(prof, mon, rank=1, extra_meta=extra)
        _feed(prof, range(35, 40), 3)  # after the last tick: lost
        assert crashsafe_ranks(tmp_path) == [1]
        rec = recover_rank(tmp_path, 1)
    assert rec is not None and rec.rank == 1
    assert rec.events["seq"].tolist() == list(range(35))
    assert rec.events["step"].tolist() == [s // 10 for s in range(35)]
    assert (rec.events["duration_ns"] == 10 + rec.events["seq"]).all()
    steps = rec.spans[rec.spans["kind"] == 0]
    assert steps["step"].tolist() == [0, 1, 2] and (steps["tokens"] == 8).all()
    assert len(rec.spans) == 6 and len(rec.memory) == 3
    assert rec.span_names == mon.span_names
    m = rec.meta
    assert m.recovered is not None and m.recovered["step"] == 3 and m.recovered["ticks"] == 4
    assert m.node_id == "n1" and m.world_size == 3 and m.groups[0]["ranks"] == [0, 1, 2]
    assert m.total_events == 35 and m.first_event_id == 0 and m.exit is None
    # statistics recomputed from the recovered events
    rows = [r for r in m.stats["rows"] if r["op"] == "all_reduce"]
    assert sum(r["count"] for r in rows) == 35 and {r["rank"] for r in rows} == {1}


def test_recovery_after_the_ring_wrapped_keeps_the_newest(tmp_path: Path) -> None:
    prof = CommProfiler(ProfilerConfig(max_events=16))
    store = CrashSafeStore(tmp_path)
    _feed(prof, range(10), 0)
    store.tick(prof, None, rank=0)
    _feed(prof, range(10, 45), 0)  # 35 more in one tick: more than the ring holds
    store.tick(prof, None, rank=0)
    rec = recover_rank(tmp_path, 0)
    assert rec is not None
    assert rec.events["seq"].tolist() == list(range(29, 45))  # the recorder's own ring
    assert rec.meta.total_events == 45 and rec.meta.first_event_id == 29
    assert rec.meta.evicted_events == 29
    own, _ = prof.columns()
    assert own.tobytes() == rec.events.tobytes()


def test_load_run_prefers_newer_crashsafe_data_and_discard_removes_it(tmp_path: Path) -> None:
    prof = CommProfiler(ProfilerConfig(max_events=100))
    _feed(prof, range(5), 0)
    write_rank_file(tmp_path, rank_data(prof, None, {"rank": 0}))  # a periodic write
    store = CrashSafeStore(tmp_path)
    _feed(prof, range(5, 12), 1)
    store.tick(prof, None, rank=0)
    run = load_run(tmp_path)
    assert run.ranks[0].events["seq"].tolist() == list(range(12))
    assert run.ranks[0].meta.recovered is not None and run.problems == {}
    # the launcher's finish step writes the rank file from them, with the exit it learnt
    ex = ExitStatus("signal", 137, "SIGKILL", 5)
    assert finalize_crashsafe(tmp_path, {0: ex}) == [0]
    assert crashsafe_ranks(tmp_path) == [] and not (tmp_path / "crashsafe").exists()
    run = load_run(tmp_path)
    assert run.ranks[0].events["seq"].tolist() == list(range(12))
    assert run.ranks[0].meta.exit == ex and run.ranks[0].meta.recovered is not None


def test_a_final_rank_file_wins_and_the_writer_cleans_up(tmp_path: Path) -> None:
    prof = CommProfiler(ProfilerConfig(max_events=100))
    _feed(prof, range(4), 0)
    w = RankWriter(tmp_path, prof, interval_s=0, rank=2, crashsafe_tick_s=0.5)
    w.persist_crashsafe()
    assert crashsafe_ranks(tmp_path) == [2]
    w.set_exit("normal", 0)
    assert w.write() is not None
    assert crashsafe_ranks(tmp_path) == []  # the final file supersedes the mapped ones
    w.persist_crashsafe()  # a late tick does not bring them back
    assert crashsafe_ranks(tmp_path) == []
    assert rank_file(tmp_path, 2).exists()
    # a rank file with an exit record is final even when older than leftover mapped files
    store = CrashSafeStore(tmp_path)
    _feed(prof, range(4, 9), 0)
    store.tick(prof, None, rank=2)
    run = load_run(tmp_path)
    assert run.ranks[2].meta.recovered is None and len(run.ranks[2].events) == 4


def test_the_step_is_noted_at_every_step_change(tmp_path: Path) -> None:
    prof = CommProfiler(ProfilerConfig(max_events=10))
    store = CrashSafeStore(tmp_path)
    store.tick(prof, None, rank=0)
    for s in range(7):
        prof.step = s  # what the step monitor does when a step begins
    rec = recover_rank(tmp_path, 0)
    assert rec is not None and rec.meta.recovered is not None
    assert rec.meta.recovered["step"] == 6
    store.discard()
    assert prof.step_listeners == [] and recover_rank(tmp_path, 0) is None
    assert np.all(prof.columns()[0]["seq"] >= 0)


def test_an_exit_of_another_process_is_not_applied(tmp_path: Path) -> None:
    """torchrun's exit names a pid: a rank file rebuilt from another process' files (a restarted
    worker) does not get it."""
    prof = CommProfiler(ProfilerConfig(max_events=10))
    _feed(prof, range(3), 0)
    CrashSafeStore(tmp_path).tick(prof, None, rank=0)
    ex = ExitStatus("signal", 137, "SIGKILL", 5)
    assert finalize_crashsafe(tmp_path, {0: ex}, pids={0: os.getpid() + 1}) == [0]
    rd = load_run(tmp_path).ranks[0]
    assert rd.meta.exit is None and rd.meta.pid == os.getpid() and len(rd.events) == 3

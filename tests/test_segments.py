"""Append-only segment storage without processes: a recorder and step monitor fed synthetic
events, appended tick by tick by the rank writer, read back as a killed rank's would be (the
files are all a SIGKILL leaves: the writer is simply abandoned, never stopped), rotated by the
retention bounds, and cut off by a failing disk."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from meshprof.api import StepMonitor
from meshprof.comm.recorder import CommProfiler
from meshprof.config import ProfilerConfig
from meshprof.events import OP_CODES, STEP_TOTALS_DTYPE, GroupInfo
from meshprof.rundir import load_run
from meshprof.rundir.schema import ExitStatus, rank_dir
from meshprof.rundir.segment_reader import finalize_rank_dirs
from meshprof.rundir.segment_writer import StorageLimits
from meshprof.rundir.segments import HEAD, read_chunks, scan_rank_dir
from meshprof.rundir.writer import RankWriter


def _feed(prof: CommProfiler, seqs: range, step: int) -> None:
    """Append all_reduce events with the given seqs (start = 1000 * seq ns) in ``step``."""
    g = prof.log.group_index(GroupInfo("0", "default_pg", (0, 1, 2), "gloo"))
    dt = prof.log.dtype_code("float32")
    for s in seqs:
        prof.log.append(
            (OP_CODES["all_reduce"], 0, dt, 0, g, -1, s, 64, 64, 1000 * s, 10 + s, step, None, None)
        )


def _writer(tmp_path: Path, prof: CommProfiler, mon: object = None, **kw: object) -> RankWriter:
    """A writer whose thread is never started: the test ticks it (interval 0: no periodic
    meta refresh beyond the tables' changes)."""
    return RankWriter(tmp_path, prof, mon, interval_s=0, rank=1, **kw)  # type: ignore[arg-type]


def test_a_killed_rank_reads_back_up_to_its_last_tick(tmp_path: Path) -> None:
    prof = CommProfiler(ProfilerConfig(max_events=100))
    mon = StepMonitor(None, profiler=prof, rank=1)
    w = _writer(tmp_path, prof, mon, extra_meta={"node_id": "n1", "world_size": 3})
    for step in range(3):
        with mon.step(tokens=8), mon.phase("forward"):
            _feed(prof, range(step * 10, step * 10 + 10), step)
        w.tick()
    with mon.step():  # step 3 is in progress at the "death"
        _feed(prof, range(30, 35), 3)
        w.tick()
        _feed(prof, range(35, 40), 3)  # after the last tick: lost
        rd = load_run(tmp_path).ranks[1]
    assert rd.events["seq"].tolist() == list(range(35))
    assert rd.events["step"].tolist() == [s // 10 for s in range(35)]
    assert (rd.events["duration_ns"] == 10 + rd.events["seq"]).all()
    steps = rd.spans[rd.spans["kind"] == 0]
    assert steps["step"].tolist() == [0, 1, 2] and (steps["tokens"] == 8).all()
    assert len(rd.spans) == 6 and len(rd.memory) == 3
    assert rd.span_names == mon.span_names
    m = rd.meta
    assert (
        m.recovered is not None and m.recovered["step"] == 3 and m.recovered["from"] == "segments"
    )
    assert m.node_id == "n1" and m.world_size == 3 and m.groups[0]["ranks"] == [0, 1, 2]
    assert m.first_event_id == 0 and m.exit is None and m.retained_events == 35
    # the per-step totals wait for more steps (or 10 s) before they are appended
    assert rd.steps.dtype == STEP_TOTALS_DTYPE and len(rd.steps) == 0
    # what is on disk is exactly what the writer appended: no rewrite
    assert w.store is not None
    on_disk = sum(p.stat().st_size for p in rank_dir(tmp_path, 1).glob("g001-0*.seg"))
    on_disk += (rank_dir(tmp_path, 1) / "g001-steps.seg").stat().st_size if rd.steps.size else 0
    assert w.store.bytes_written == on_disk


def test_the_cursor_holds_the_step_begun_after_the_last_tick(tmp_path: Path) -> None:
    prof = CommProfiler(ProfilerConfig(max_events=10))
    w = _writer(tmp_path, prof)
    w.tick()
    for s in range(7):
        prof.step = s  # what the step monitor does when a step begins
    rd = load_run(tmp_path).ranks[1]
    assert rd.meta.recovered is not None and rd.meta.recovered["step"] == 6
    w.stop(final_write=True)
    assert prof.step_listeners == []
    rd = load_run(tmp_path).ranks[1]
    assert rd.meta.recovered is None  # closed by the process itself: not a death


def test_a_ring_that_overflows_between_ticks_is_counted(tmp_path: Path) -> None:
    prof = CommProfiler(ProfilerConfig(max_events=16))
    w = _writer(tmp_path, prof)
    _feed(prof, range(10), 0)
    w.tick()
    _feed(prof, range(10, 45), 0)  # 35 more in one tick: more than the ring holds
    w.set_exit("normal", 0)
    w.write(final=True)
    run = load_run(tmp_path)
    rd = run.ranks[1]
    assert rd.events["seq"].tolist() == list(range(10)) + list(range(29, 45))
    assert rd.meta.total_events == 45 and rd.meta.evicted_events == 19
    assert rd.meta.storage is not None and rd.meta.storage.ring_overrun == 19
    (note,) = run.storage_notes
    assert note.overrun_events == 19 and "19 events left the in-memory ring" in note.title


def test_errors_and_metadata_are_keyed_by_row(tmp_path: Path) -> None:
    prof = CommProfiler(ProfilerConfig(max_events=100))
    w = _writer(tmp_path, prof)
    _feed(prof, range(3), 0)
    w.tick()
    g = prof.log.group_index(GroupInfo("0", "default_pg", (0, 1, 2), "gloo"))
    prof.log.append((OP_CODES["all_reduce"], 1, 0, 0, g, -1, 3, 8, 8, 1, 1, 0, "boom", {"k": 1}))
    w.write(final=True)
    rd = load_run(tmp_path).ranks[1]
    assert rd.meta.errors == {"3": "boom"} and rd.meta.metadata == {"3": {"k": 1}}


def test_finalize_applies_the_exit_of_that_process_only(tmp_path: Path) -> None:
    prof = CommProfiler(ProfilerConfig(max_events=10))
    _feed(prof, range(3), 0)
    _writer(tmp_path, prof).tick()  # then "killed"
    ex = ExitStatus("signal", 137, "SIGKILL", 5)
    assert finalize_rank_dirs(tmp_path, {1: ex}, pids={1: os.getpid() + 1}) == [1]
    rd = load_run(tmp_path).ranks[1]
    assert rd.meta.exit is None and rd.meta.recovered is not None and len(rd.events) == 3
    assert finalize_rank_dirs(tmp_path, {1: ex}, pids={1: os.getpid()}) == [1]
    rd = load_run(tmp_path).ranks[1]
    assert rd.meta.exit == ex and rd.meta.recovered is not None and len(rd.events) == 3


def test_a_restarted_rank_reads_as_its_newest_generation(tmp_path: Path) -> None:
    first = CommProfiler(ProfilerConfig(max_events=10))
    _feed(first, range(5), 0)
    _writer(tmp_path, first).tick()
    second = CommProfiler(ProfilerConfig(max_events=10))
    _feed(second, range(2), 0)
    w = _writer(tmp_path, second)
    w.write(final=True)
    files = scan_rank_dir(rank_dir(tmp_path, 1))
    assert files is not None and files.generation == 2 and files.older == 1
    assert len(load_run(tmp_path).ranks[1].events) == 2


def test_rotation_keeps_the_rank_under_its_bound_and_the_step_totals(tmp_path: Path) -> None:
    prof = CommProfiler(ProfilerConfig(max_events=10_000))
    mon = StepMonitor(None, profiler=prof, rank=1)
    limits = StorageLimits(max_disk_bytes=60_000, segment_bytes=8_000, fsync_interval_s=0)
    w = _writer(tmp_path, prof, mon, limits=limits)
    for step in range(40):
        with mon.step(tokens=4):
            _feed(prof, range(step * 20, step * 20 + 20), step)
        w.tick()
    w.set_exit("normal", 0)
    w.write(final=True)
    d = rank_dir(tmp_path, 1)
    total = sum(p.stat().st_size for p in d.iterdir())
    assert total <= 60_000 + 8_000 + 2 * HEAD.size + 4096  # one segment over at most
    run = load_run(tmp_path)
    rd = run.ranks[1]
    st = rd.meta.storage
    assert st is not None and st.rotated_segments and st.rotated_events
    kept = rd.events["seq"]
    assert kept.tolist() == list(range(800 - len(kept), 800))  # the newest, contiguous
    assert rd.meta.total_events == 800 and rd.meta.evicted_events == 800 - len(kept)
    assert rd.meta.evicted_events == st.rotated_events
    # the per-step totals cover every step, the rotated ones included
    assert rd.steps["step"].tolist() == list(range(40))
    assert (rd.steps["collectives"] == 20).all() and (rd.steps["tokens"] == 4).all()
    assert (rd.steps["comm_bytes"] == 20 * 64).all()
    (note,) = run.storage_notes
    assert note.rotated_events == st.rotated_events and not note.stopped


def test_a_cut_off_chunk_ends_the_file_for_the_reader(tmp_path: Path) -> None:
    prof = CommProfiler(ProfilerConfig(max_events=100))
    w = _writer(tmp_path, prof)
    _feed(prof, range(5), 0)
    w.tick()
    _feed(prof, range(5, 9), 0)
    w.tick()
    (seg,) = sorted(rank_dir(tmp_path, 1).glob("g001-0*.seg"))
    size = seg.stat().st_size
    os.truncate(seg, size - 7)  # the last batch written halfway (a crash, a full disk)
    got = read_chunks(seg)
    assert got.torn_bytes > 0 and not got.problem
    assert load_run(tmp_path).ranks[1].events["seq"].tolist() == list(range(5))


class _Failing:
    """Replaces os.write in the segment writer: fails with ``code`` after ``after`` calls."""

    def __init__(self, code: int, after: int) -> None:
        self.code, self.after, self.calls = code, after, 0

    def __call__(self, fd: int, data: object) -> int:
        self.calls += 1
        if self.calls > self.after:
            raise OSError(self.code, os.strerror(self.code))
        return os.write(fd, data)  # type: ignore[arg-type]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO])
def test_a_failing_disk_stops_writing_and_says_what_was_lost(
    tmp_path: Path, code: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import meshprof.rundir.segment_writer as sw

    prof = CommProfiler(ProfilerConfig(max_events=1000))
    mon = StepMonitor(None, profiler=prof, rank=1)
    w = _writer(tmp_path, prof, mon)
    with mon.step():
        _feed(prof, range(10), 0)
    w.tick()
    failing = _Failing(code, after=0)
    monkeypatch.setattr(sw.os, "write", failing)
    for step in range(1, 4):
        with mon.step():
            _feed(prof, range(step * 10, step * 10 + 10), step)
        w.tick()  # never raises
    assert failing.calls == 1  # the first failure stopped writing: no retry per tick
    monkeypatch.undo()
    err = capsys.readouterr().err
    name = errno.errorcode[code]
    assert err.count("meshprof: rank 1 stopped writing") == 1 and name in err
    assert w.storage_state.startswith(f"writing stopped: {name}")
    # recording went on in memory
    assert prof.log.total == 40 and len(mon.span_rows) == 4
    w.set_exit("normal", 0)
    w.write(final=True)
    run = load_run(tmp_path)
    rd = run.ranks[1]
    assert rd.events["seq"].tolist() == list(range(10))  # the chunk cut short is not read
    st = rd.meta.storage
    assert st is not None and st.stopped == name and st.stopped_step is not None
    assert rd.meta.exit is not None and rd.meta.total_events == 40
    (note,) = run.storage_notes
    assert note.stopped.startswith(name) and note.missing_events == 30
    assert "30 of its 40 events" in note.title


def test_a_rank_learnt_late_moves_its_data_and_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No $RANK: the writer writes under rank 0 until the process group says the rank is 3;
    then everything the ring holds goes under rank 3 and nothing stays under rank 0."""
    monkeypatch.delenv("RANK", raising=False)
    prof = CommProfiler(ProfilerConfig(max_events=100))
    w = RankWriter(tmp_path, prof, interval_s=0)
    _feed(prof, range(4), 0)
    w.tick()
    assert rank_dir(tmp_path, 0).is_dir()
    prof.rank = 3  # what ensure_rank() learns once the default group exists
    _feed(prof, range(4, 6), 0)
    w.write(final=True)
    assert not rank_dir(tmp_path, 0).exists()
    run = load_run(tmp_path)
    assert sorted(run.ranks) == [3] and run.ranks[3].events["seq"].tolist() == list(range(6))

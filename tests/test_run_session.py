"""The rank writer (meshprof.rundir.writer: rank file content, periodic writes, SIGTERM) and the
recording session (meshprof.session.recording) that builds recorder, monitor, writer and clock sync."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from meshprof.events import OP_NAMES
from meshprof.launch.spawn import run_ranks
from meshprof.records.finding import FindingKind
from meshprof.rundir import load_run
from meshprof.rundir.schema import rank_dir
from meshprof.rundir.segment_reader import load_rank_dir


def _write_rank_with_eviction(rank: int, world_size: int, run_dir: str) -> dict:
    import torch
    import torch.distributed as dist

    import meshprof
    from meshprof.api import StepMonitor
    from meshprof.rundir.writer import RankWriter

    prof = meshprof.enable(meshprof.ProfilerConfig(max_events=4))
    mon = StepMonitor(profiler=prof)
    works = []  # kept alive (see tests/scripts/run_fail.py)
    for i in range(2):
        with mon.step(samples=8):
            for _ in range(3):
                works.append(dist.all_reduce(torch.ones(10 + i), async_op=True))
                works[-1].wait()
    with prof.label("my_op", metadata={"tag": rank}):
        works.append(dist.broadcast(torch.ones(3), 0, async_op=True))
        works[-1].wait()
    writer = RankWriter(run_dir, prof, mon, interval_s=0, extra_meta={"layout": {"dp": 2}})
    path = writer.write()
    events, ids = prof.columns()
    return {
        "path": str(path),
        "ids": ids.tolist(),
        "events": events.tolist(),
        "total": prof.log.total,
    }


@pytest.mark.timeout(120)
def test_rank_file_holds_what_the_recorder_and_monitor_hold(tmp_path: Path) -> None:
    results = run_ranks(_write_rank_with_eviction, 2, args=(str(tmp_path),), timeout=90)
    run = load_run(tmp_path)
    assert sorted(run.ranks) == [0, 1]
    for r, res in enumerate(results):
        rd = run.ranks[r]
        assert res["path"] == str(rank_dir(tmp_path, r) / "g001-meta.json")
        # 6 all_reduces + 1 labelled op; the ring keeps the newest 4 (ids 3..6)
        assert res["total"] == 7 and res["ids"] == [3, 4, 5, 6]
        assert rd.events.tolist() == res["events"]
        assert [rd.op_name(c) for c in rd.events["op"].tolist()] == ["all_reduce"] * 3 + ["my_op"]
        assert rd.labels == ["my_op"]
        # metadata keyed by event id 6 in the recorder -> row 3 of the written array
        assert rd.meta["metadata"]["3"]["tag"] == r and rd.meta["first_event_id"] == 3
        # exact statistics cover all 7 collectives, evicted ones included
        counts = {}
        for row in rd.meta["stats"]["rows"]:
            counts[row["op"]] = counts.get(row["op"], 0) + row["count"]
        assert counts == {"all_reduce": 6, "my_op": 1}
        steps = rd.spans[rd.spans["kind"] == 0]
        assert steps["step"].tolist() == [0, 1] and steps["samples"].tolist() == [8, 8]
        assert rd.span_names[steps["name"][0]] == "step"
        assert len(rd.memory) == 2
        assert (
            rd.meta["rank"] == r and rd.meta["world_size"] == 2 and rd.meta["layout"] == {"dp": 2}
        )
        assert rd.dtypes[rd.events["dtype"][0]] == "float32"


def test_writer_periodic_thread_skips_unchanged_content(tmp_path: Path) -> None:
    import meshprof
    from meshprof.rundir.writer import RankWriter

    prof = meshprof.enable()
    writer = RankWriter(tmp_path, prof, interval_s=0.01, rank=3).start()
    deadline = time.monotonic() + 20
    while writer.writes == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # ten more periods: nothing changed, nothing rewritten
    meta = rank_dir(tmp_path, 3) / "g001-meta.json"
    assert writer.writes == 1 and writer.last_path == meta
    assert writer.ticks == 1  # one batch (an empty one: when the rank was last seen alive)
    writer.stop(final_write=True)  # the final meta (closed) is written once
    assert writer.writes == 2 and writer.failures == 0
    assert writer.write(force=True) is not None and writer.writes == 3
    assert load_rank_dir(rank_dir(tmp_path, 3)).meta["rank"] == 3
    assert not list(tmp_path.rglob(".*.tmp"))  # atomic writes leave no temporary file


def test_writer_failure_is_counted_never_raised(tmp_path: Path) -> None:
    import meshprof
    from meshprof.rundir.writer import RankWriter

    blocker = tmp_path / "file"
    blocker.write_text("x")
    writer = RankWriter(blocker / "run", meshprof.enable(), interval_s=0, rank=0)
    assert writer.write() is None and writer.failures == 1
    assert writer.storage_state == "writing stopped: ENOTDIR (Not a directory)"
    assert writer.write() is None and writer.failures == 1  # stopped: not tried again


_SIGTERM_CHILD = textwrap.dedent(
    """
    import ctypes, sys
    import torch, torch.distributed as dist
    import meshprof
    from meshprof.rundir.writer import RankWriter

    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
    prof = meshprof.enable()
    RankWriter(sys.argv[1], prof, interval_s=3600, rank=0).start()  # no periodic write here
    works = [dist.all_reduce(torch.ones(7), async_op=True) for _ in range(3)]
    for w in works:
        w.wait()
    print("ready", flush=True)
    {block}
    """
)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("block", "how"),
    [
        ("import time; time.sleep(60)", "python handler"),
        # blocked in C (glibc's system() retries waitpid on EINTR): only the wakeup-fd thread runs
        ("ctypes.CDLL(None).system(b'sleep 40')", "thread"),
    ],
)
def test_sigterm_writes_the_rank_file_and_dies_by_the_signal(
    tmp_path: Path, block: str, how: str
) -> None:
    from meshprof.launch.spawn import free_port

    code = _SIGTERM_CHILD.format(port=free_port(), block=block)
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
        assert time.monotonic() - t0 < 20, how  # did not wait for the blocking call to return
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        with contextlib.suppress(OSError):  # the `sleep` that system() started, now orphaned
            os.killpg(proc.pid, signal.SIGKILL)
    assert rc == -signal.SIGTERM  # died by the signal, as without meshprof
    rd = load_rank_dir(rank_dir(tmp_path, 0))
    assert rd.meta["exit"]["how"] == "signal" and rd.meta["exit"]["code"] == 128 + signal.SIGTERM
    assert [OP_NAMES[c] for c in rd.events["op"].tolist()] == ["all_reduce"] * 3
    assert (rd.events["in_bytes"] == 28).all()


# -- RecordingSession ---------------------------------------------------------------------------


def _session_rank(rank: int, world_size: int, run_dir: str) -> dict:
    """The group exists before start(): start() exchanges timestamps and writes a first file;
    automatic step detection ends a step at every optimizer step."""
    import torch
    import torch.distributed as dist

    from meshprof.session.recording import RecordingSession, SessionConfig

    cfg = SessionConfig(
        run_dir=Path(run_dir),
        flush_interval_s=0,
        layout="dp=2,tp=1,pp=1",
        step_detection=True,
        meta={"note": "kept"},
    )
    with RecordingSession(cfg) as session:
        assert session.prof is not None and session.monitor is not None
        assert session.writer is not None and session.failures == {}
        first = (rank_dir(run_dir, rank) / "g001-meta.json").exists()
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            model(torch.ones(2, 4)).sum().backward()
            for p in model.parameters():
                assert p.grad is not None
                dist.all_reduce(p.grad)
            opt.step()
    return {"first": first, "steps": session.steps_detected}


@pytest.mark.timeout(120)
def test_recording_session_end_to_end(tmp_path: Path) -> None:
    res = run_ranks(_session_rank, 2, (str(tmp_path),), timeout=90)
    assert [r["first"] for r in res] == [True, True] and [r["steps"] for r in res] == [3, 3]
    run = load_run(tmp_path)
    for r, rd in run.ranks.items():
        m = rd.meta
        assert (m.rank, m.world_size, m.backend, m.steps_detected) == (r, 2, "gloo", 3)
        assert m.layout == {"dp": 2, "tp": 1, "pp": 1} and m.step_detection == "optimizer"
        assert m.extra == {"note": "kept"} and m.exit is None  # stopped before the process ended
        assert m.clock_sync is not None
        assert int((rd.spans["kind"] == 0).sum()) == 3  # the step after the last one stays open
        assert [OP_NAMES[c] for c in rd.events["op"].tolist()].count("all_reduce") == 6
    assert len(run.ranks[1].meta.clock_sync["samples"]) > 0


def test_recording_session_parts_fail_alone(tmp_path: Path) -> None:
    """A part that cannot start is reported once through on_error; the others run."""
    from meshprof.rundir.schema import Manifest
    from meshprof.session.recording import RecordingSession, SessionConfig

    blocker = tmp_path / "file"
    blocker.write_text("x")
    errors: list[str] = []
    session = RecordingSession(
        SessionConfig(
            run_dir=blocker / "run",  # under a file: the manifest and rank file cannot be written
            rank=0,
            flush_interval_s=0,
            manifest=Manifest(world_size=1, source="test"),
            on_error=lambda part, e: errors.append(part),
        )
    ).start()
    try:
        assert errors == ["manifest"] and set(session.failures) == {"manifest"}
        assert session.prof is not None and session.monitor is not None
        assert session.write() is None and session.writer is not None
        assert session.writer.failures == 1
    finally:
        session.stop(final_write=False)
    ok = RecordingSession(
        SessionConfig(
            run_dir=tmp_path / "ok", rank=0, flush_interval_s=0, manifest=Manifest(world_size=1)
        )
    ).start()
    ok.set_exit("normal", 0)
    ok.stop()
    run = load_run(tmp_path / "ok")
    assert run.manifest.world_size == 1 and run.ranks[0].meta.exit is not None


def test_files_a_session_writes_follow_the_umask(tmp_path: Path) -> None:
    """With umask 0o002 (a group-writable shared run directory) every file meshprof writes in a
    run directory is 0o664, as open() makes it: the other users of the group can read it."""
    from meshprof.api import StepMonitor
    from meshprof.records.live import Alert, RankLive
    from meshprof.rundir.live import append_alert, write_rank_live
    from meshprof.rundir.schema import Manifest
    from meshprof.session.recording import RecordingSession, SessionConfig
    from meshprof.session.watchdog import write_dump

    def modes() -> dict[str, int]:
        return {
            str(p.relative_to(tmp_path)): p.stat().st_mode & 0o777
            for p in tmp_path.rglob("*")
            if p.is_file()
        }

    old = os.umask(0o002)
    try:
        session = RecordingSession(
            SessionConfig(
                run_dir=tmp_path,
                rank=0,
                flush_interval_s=0,
                live_interval_s=0.05,
                clock_sync=False,
                manifest=Manifest(world_size=1),
            ),
            monitor=StepMonitor(),
        ).start()
        assert session.monitor is not None and session.writer is not None
        for _ in range(3):
            with session.monitor.step():
                time.sleep(0.01)
        session.writer.tick()
        assert session.write(force=True) is not None
        write_dump(session.prof, tmp_path / "hang", "signal")
        append_alert(
            tmp_path, Alert(kind=FindingKind("memory"), title="m", t_ns=time.time_ns(), ranks=(0,))
        )
        write_rank_live(tmp_path, RankLive(rank=1, updated_ns=time.time_ns(), interval_s=1.0))
        running = modes()
        session.stop()
        ended = modes()
    finally:
        os.umask(old)
    names = set(running) | set(ended)
    for expected in (
        "manifest.json",
        "live/rank00000.json",
        "live/rank00001.json",
        "live/alerts.jsonl",
        "hang/rank0.json",
        "rank00000/g001-meta.json",
        "rank00000/g001-000001.seg",
        "rank00000/g001-cursor",
    ):
        assert expected in names
    names.discard("rank00000/reserve")  # (removed at the end; its mode is irrelevant)
    assert {n: m for n, m in {**running, **ended}.items() if m != 0o664} == {}

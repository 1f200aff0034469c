"""Live state: each rank's record every interval (RUN_DIR/live/), read back as a snapshot, on a
real gloo job while it runs (known compute per step, one rank slower by a known amount)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from live_helpers import wait_for
from meshprof.analyze.live.snapshot import read_snapshot, snapshot_to_dict
from meshprof.records.finding import FindingKind
from meshprof.records.live import HIST_BOUNDS_S, Alert, RankLive
from meshprof.rundir.live import append_alert, live_file, read_alerts, write_rank_live
from meshprof.session.recording import RecordingSession, SessionConfig

SCRIPTS = Path(__file__).parent / "scripts"


def test_session_publishes_counts_histogram_and_steps(tmp_path: Path) -> None:
    from meshprof.launch.spawn import free_port

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        from meshprof.api import StepMonitor

        session = RecordingSession(
            SessionConfig(run_dir=tmp_path, live_interval_s=60.0, clock_sync=False),
            monitor=StepMonitor(),  # a fresh one: step numbers from 0
        ).start()
        assert session.live is not None and session.monitor is not None
        mon = session.monitor
        t0 = time.time_ns()
        for _ in range(5):
            with mon.step(tokens=100):
                time.sleep(0.02)
                for _ in range(3):
                    dist.all_reduce(torch.ones(16))
        loop_ns = time.time_ns() - t0
        session.live.publish()
        rec = RankLive.from_dict(json.loads(live_file(tmp_path, 0).read_text()))
        assert rec.collectives == 15 and rec.steps_done == 5 and rec.step == 5
        (series,) = [s for s in rec.series if s.op == "all_reduce"]
        assert series.count == 15 and sum(series.buckets) == 15
        assert len(series.buckets) == len(HIST_BOUNDS_S) + 1
        assert 20e6 <= rec.step_ns < 200e6
        assert len(rec.recent_step_ns) == 5
        # 500 tokens over the five steps: the window runs from the first step's start to the
        # last one's end, inside the loop the test timed
        assert 500e9 / loop_ns <= rec.tokens_per_s <= 500e9 / sum(rec.recent_step_ns)
        assert rec.steps_per_s == pytest.approx(rec.tokens_per_s / 100)
        assert rec.memory_bytes > 0 and rec.memory_capacity_bytes >= rec.memory_bytes
        assert rec.inflight is None and rec.status == "running"
        session.stop()
        rec = RankLive.from_dict(json.loads(live_file(tmp_path, 0).read_text()))
        assert rec.status == "ended"
        snap = read_snapshot(tmp_path)
        assert snap.ended and snap.stale == [] and list(snap.ranks) == [0]
    finally:
        dist.destroy_process_group()


def test_snapshot_marks_stale_ranks_and_reads_alerts(tmp_path: Path) -> None:
    now = time.time_ns()
    write_rank_live(
        tmp_path, RankLive(rank=0, updated_ns=now, interval_s=1.0, compute_ns=100_000_000)
    )
    write_rank_live(tmp_path, RankLive(rank=1, updated_ns=now - 10**10, interval_s=1.0))
    write_rank_live(
        tmp_path, RankLive(rank=2, updated_ns=now, interval_s=1.0, compute_ns=160_000_000)
    )
    write_rank_live(
        tmp_path, RankLive(rank=3, updated_ns=now, interval_s=1.0, compute_ns=101_000_000)
    )
    (tmp_path / "live" / "rank00009.json").write_text("{not json")  # half a file is skipped
    append_alert(
        tmp_path, Alert(kind=FindingKind("straggler"), title="rank 2 is slow", t_ns=now, ranks=(2,))
    )
    snap = read_snapshot(tmp_path, now_ns=now)
    assert snap.stale == [1] and not snap.ended and sorted(snap.ranks) == [0, 1, 2, 3]
    assert [s.rank for s in snap.stragglers] == [2]
    assert snap.stragglers[0].excess_ns == 160_000_000 - 100_500_000  # the others: 100, 101 ms
    d = snapshot_to_dict(snap)
    assert {"taken_ns", "ranks", "stragglers", "alerts"} <= set(d)
    assert {
        "rank",
        "step",
        "step_ns",
        "tokens_per_s",
        "comm_share",
        "memory_bytes",
        "inflight",
        "updated_ns",
    } <= set(d["ranks"][0])
    assert [a.message for a in read_alerts(tmp_path)] == ["rank 2 is slow"]
    with pytest.raises(FileNotFoundError):
        read_snapshot(tmp_path / "missing")


def test_live_state_of_a_running_job(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out, stop = tmp_path / "run", tmp_path / "stop"
    proc = cli.start(
        "run",
        "--nproc-per-node",
        "2",
        "-o",
        out,
        "--live-interval",
        "0.5",
        "--no-summary",
        SCRIPTS / "live_job.py",
        "400",
        "0.04",
        "0.03",
        "1",
        stop,
    )
    try:

        def ready():  # type: ignore[no-untyped-def]
            s = read_snapshot(out) if out.is_dir() else None
            return (
                s
                if s and len(s.ranks) == 2 and min(x.steps_done for x in s.ranks.values()) >= 12
                else None
            )

        first = wait_for(ready)
        seen = max(x.steps_done for x in first.ranks.values())

        def later():  # type: ignore[no-untyped-def]
            s = read_snapshot(out)
            return s if min(x.steps_done for x in s.ranks.values()) > seen + 2 else None

        second = wait_for(later)
        assert all(second.ranks[r].updated_ns > first.ranks[r].updated_ns for r in (0, 1))
        r0, r1 = second.ranks[0], second.ranks[1]
        # both ranks step together: ~base + extra per step (the slept work and the all_reduce)
        for r in (r0, r1):
            assert 60e6 <= r.step_ns <= 250e6, r.step_ns
            # a rate over the recent steps: their mean, not the median step_ns (a few steps
            # stretched by a loaded machine pull it below 1 / median: 7.1/s against 11.5 once)
            mean_ns = sum(r.recent_step_ns) / len(r.recent_step_ns)
            assert r.steps_per_s == pytest.approx(1e9 / mean_ns, rel=0.35)
        # rank 0 waits for rank 1 in the all_reduce: its exposed share is about extra / step
        assert r0.exposed_share > r1.exposed_share
        # (at least: a loaded machine makes the all_reduces themselves longer)
        assert r0.exposed_share >= 0.03e9 / r0.step_ns - 0.12
        # rank 1 computes 30 ms more per step: the live straggler, with about that excess
        assert [s.rank for s in second.stragglers] == [1]
        assert second.stragglers[0].excess_ns == pytest.approx(30e6, abs=15e6)
        assert not second.ended and second.stale == []
    finally:
        stop.write_text("")
        outs = proc.communicate(timeout=120)
    assert proc.returncode == 0, outs[1][-2000:]
    done = read_snapshot(out)
    assert done.ended and all(x.status == "ended" for x in done.ranks.values())


def test_live_stragglers_are_looked_for_within_a_pipeline_stage(tmp_path: Path) -> None:
    """dp=2 × pp=2: the last stage (ranks 1, 3) computes the loss and takes longer than the
    first; that is no straggler. Rank 3 slower than rank 1, its own stage's peer, is one."""
    from meshprof.session.live_publish import LivePublisher

    pub = LivePublisher(tmp_path, prof=None, layout={"dp": 2, "tp": 1, "pp": 2})
    assert [pub._stage(r) for r in range(4)] == [0, 1, 0, 1]
    now = time.time_ns()

    def ranks(c3: int) -> dict[int, RankLive]:
        compute = {0: 67_000_000, 1: 110_000_000, 2: 68_000_000, 3: c3}
        return {
            r: RankLive(rank=r, updated_ns=now, interval_s=1.0, compute_ns=c, stage=r % 2)
            for r, c in compute.items()
        }

    from meshprof.analyze.live.snapshot import find_stragglers

    assert find_stragglers(ranks(111_000_000), []) == []
    (s,) = find_stragglers(ranks(150_000_000), [])
    assert s.rank == 3 and s.median_compute_ns == 110_000_000 and s.excess_ns == 40_000_000


def test_live_figures_are_the_reports_on_the_same_steps(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """An unmodified DDP job whose gradient buckets overlap the backward (async all_reduces in
    flight together): the live record's step time, compute, communication and exposed shares
    are what the post-mortem report says about the same steps (within 5 %); the communication
    share is the union of the intervals (the sum of the durations, counted before, is larger:
    it capped at 100 %); peak memory is never below current memory; an in-flight age is the
    collective's own (a healthy job's collectives are young), not the record's."""
    import numpy as np

    from meshprof.analyze.compute.intervals import clipped_total
    from meshprof.rundir import load_run
    from meshprof.rundir.live import read_rank_lives

    out = tmp_path / "run"
    proc = cli.start(
        "run",
        "--nproc-per-node",
        "2",
        "-o",
        out,
        "--live-interval",
        "0.2",
        "--no-summary",
        SCRIPTS / "live_ddp_overlap.py",
        "60",
    )
    ages: list[tuple[int, int, int]] = []  # (age, issued, updated) of every in-flight op seen
    try:
        while proc.poll() is None:
            if (out / "live").is_dir():
                for x in read_rank_lives(out).values():
                    if x.inflight is not None and x.status == "running":
                        ages.append((x.inflight.age_ns, x.inflight.issued_ns, x.updated_ns))
            time.sleep(0.05)
    finally:
        outs = proc.communicate(timeout=120)
    assert proc.returncode == 0, outs[1][-2000:]
    recs = read_rank_lives(out)
    rep = json.loads(cli("report", out, "--json", "--steps", "all").stdout)
    run = load_run(out)
    for a in rep["rank_analyses"]:
        x = recs[a["rank"]]
        assert x.status == "ended"
        rows = a["per_step"][-len(x.recent_step_ns) :]
        assert [q["duration_ns"] for q in rows] == x.recent_step_ns  # the same steps
        wall = sum(q["duration_ns"] for q in rows)
        comm = sum(q["comm_ns"] for q in rows) / wall
        exposed = sum(q["exposed_comm_ns"] for q in rows) / wall
        assert x.comm_share == pytest.approx(comm, rel=0.05), (x.comm_share, comm)
        assert x.exposed_share == pytest.approx(exposed, rel=0.05, abs=0.005)
        med = float(np.median([q["duration_ns"] for q in rows]))
        assert x.step_ns == pytest.approx(med, rel=0.05)
        assert x.compute_ns == pytest.approx(np.median([q["compute_ns"] for q in rows]), rel=0.05)
        # the old figure, the sum of the collectives' durations, counts overlapping buckets
        # twice: computed here from the rank's events, without meshprof's analysis
        ev = run.ranks[a["rank"]].events
        steps = run.ranks[a["rank"]].spans
        steps = steps[steps["kind"] == 0][-len(rows) :]
        summed = union = 0
        for s in steps:
            lo, hi = int(s["start_ns"]), int(s["start_ns"] + s["duration_ns"])
            e = ev[ev["step"] == s["step"]]
            st = e["start_ns"].astype(np.int64)
            en = st + e["duration_ns"].astype(np.int64)
            summed += int((np.minimum(en, hi) - np.maximum(st, lo)).clip(0).sum())
            union += clipped_total(st, en, lo, hi)
        assert summed > union * 1.05, (summed, union)  # the buckets did overlap
        assert x.comm_share == pytest.approx(union / wall, rel=0.05)
        assert x.comm_share < 0.99
        assert x.memory_peak_bytes >= x.memory_bytes > 0
    # in-flight ages: from the issue to the record's time, milliseconds in a healthy job
    assert ages, "no record caught a collective in flight"
    for age, issued, updated in ages:
        assert issued > 0 and abs(issued + age - updated) < 50_000_000
    assert sorted(a for a, _, _ in ages)[len(ages) // 2] < 200_000_000

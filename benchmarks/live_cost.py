"""Cost of live monitoring.

1. Rank side: one gloo rank runs steps of COLLS all_reduces under a RecordingSession publishing
   its live state every INTERVAL s; prints the publisher's thread CPU time per record and the
   record's size.
2. Reader side, at RANKS synthetic ranks (records written with write_rank_live): one
   read_snapshot, one look of the alert rules, and one ``meshprof top`` frame (table + render),
   each the median of REPEAT runs.

    PYTHONPATH=src python benchmarks/live_cost.py [--ranks 1024] [--seconds 5]
"""

from __future__ import annotations

import argparse
import io
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from rich.console import Console

from meshprof.analyze.live.alerts import AlertRules
from meshprof.analyze.live.snapshot import read_snapshot
from meshprof.analyze.live.top_table import build_top_table
from meshprof.launch.spawn import free_port
from meshprof.records.live import InflightLive, OpSeries, RankLive
from meshprof.render.live_top import render_top
from meshprof.rundir.live import write_rank_live
from meshprof.session.recording import RecordingSession, SessionConfig


def rank_side(seconds: float, interval: float, colls: int) -> None:
    run = Path(tempfile.mkdtemp())
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    session = RecordingSession(
        SessionConfig(run_dir=run, live_interval_s=interval, clock_sync=False)
    ).start()
    assert session.live is not None and session.monitor is not None
    t = torch.ones(256)
    end = time.monotonic() + seconds
    steps = 0
    while time.monotonic() < end:
        with session.monitor.step(tokens=1024):
            for _ in range(colls):
                dist.all_reduce(t)
        steps += 1
    live = session.live
    n, cost = live.publishes, live.cost_ns
    size = (run / "live" / "rank00000.json").stat().st_size
    session.stop()
    dist.destroy_process_group()
    print(
        f"rank side: {steps} steps x {colls} all_reduce in {seconds:g} s, {n} records "
        f"(every {interval:g} s): {cost / max(n, 1) / 1e3:.0f} µs thread CPU per record, "
        f"record {size} B"
    )


def reader_side(ranks: int, repeat: int) -> None:
    run = Path(tempfile.mkdtemp())
    now = time.time_ns()
    for r in range(ranks):
        write_rank_live(
            run,
            RankLive(
                rank=r,
                updated_ns=now,
                interval_s=1.0,
                world_size=ranks,
                step=100,
                steps_done=100,
                recent_step_ns=[100_000_000 + (r % 7) * 1_000_000] * 32,
                step_ns=100_000_000 + (r % 7) * 1_000_000,
                compute_ns=80_000_000 + (20_000_000 if r == 3 else 0),
                steps_per_s=9.5,
                tokens_per_s=9500.0,
                comm_share=0.2,
                exposed_share=0.05,
                memory_bytes=2**33,
                memory_capacity_bytes=2**36,
                inflight=InflightLive("all_reduce", "mesh_dp", "dp", 9, 1_000_000),
                series=[OpSeries(op, "dp", 1000, 10**9) for op in ("all_reduce", "all_gather")],
            ),
        )
    rules = AlertRules()
    snap_s, rules_s, frame_s = [], [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        snap = read_snapshot(run)
        t1 = time.perf_counter()
        rules.evaluate(snap)
        t2 = time.perf_counter()
        console = Console(width=160, height=50, file=io.StringIO())
        console.print(render_top(build_top_table(snap, "step", 37), str(run)))
        t3 = time.perf_counter()
        snap_s.append(t1 - t0)
        rules_s.append(t2 - t1)
        frame_s.append(t3 - t2)
    med = statistics.median
    print(
        f"reader side, {ranks} ranks: read_snapshot {med(snap_s) * 1e3:.0f} ms, alert rules "
        f"{med(rules_s) * 1e3:.1f} ms, top frame (37 rows) {med(frame_s) * 1e3:.0f} ms "
        f"(median of {repeat})"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--colls", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    rank_side(a.seconds, a.interval, a.colls)
    reader_side(a.ranks, a.repeat)


if __name__ == "__main__":
    main()

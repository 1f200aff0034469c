"""``meshprof top`` on synthetic live state with known values: the table model (sort, rows,
summary), one rendered frame (rich Console(record=True)), --once / --json, the refreshing view
without a terminal, and bad input. (A real running and finished job: test_live_alerts.py.)"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from rich.console import Console

from meshprof.analyze.live.snapshot import read_snapshot
from meshprof.analyze.live.top_table import build_top_table
from meshprof.records.finding import FindingKind
from meshprof.records.live import Alert, InflightLive, RankLive
from meshprof.render.live_top import render_top, sparkline
from meshprof.rundir.live import append_alert, write_rank_live

MS = 1_000_000
GIB = 2**30


def make_run(run: Path, now: int, ended: bool = False) -> None:
    """Four ranks: rank 2 stale (10 s old), rank 3 computes 50 % longer (the straggler), rank 1
    has an all_reduce in flight for 4 s, rank 0 has no token counts (steps/s)."""
    for r in range(4):
        write_rank_live(
            run,
            RankLive(
                rank=r,
                updated_ns=now - (10 * 10**9 if r == 2 else 10**9),
                interval_s=1.0,
                world_size=4,
                status="ended" if ended else "running",
                exit_how="normal" if ended else "",
                step=40 + r,
                steps_done=40 + r,
                recent_step_ns=[(100 + 10 * (i % 8)) * MS for i in range(20)]
                if r == 0
                else [110 * MS] * 8,
                step_ns=(100 + 10 * r) * MS,
                compute_ns=150 * MS if r == 3 else 100 * MS,
                steps_per_s=9.0,
                tokens_per_s=0.0 if r == 0 else 9000.0 * (r + 1),
                comm_share=0.1 * (r + 1),
                exposed_share=0.05,
                memory_bytes=(r + 1) * GIB,
                memory_capacity_bytes=8 * GIB,
                inflight=InflightLive("all_reduce", "mesh_dp", "dp", 7, 3 * 10**9)
                if r == 1
                else None,
            ),
        )
    append_alert(
        run,
        Alert(
            kind=FindingKind("straggler"),
            title="rank 3 is a straggler: +50 ms",
            t_ns=now - 10**9,
            ranks=(3,),
        ),
    )


def test_sparkline_scales_min_to_max() -> None:
    assert sparkline([10, 20, 30, 40, 50, 60, 70, 80]) == "▁▂▃▄▅▆▇█"
    assert sparkline([5, 5, 5]) == "▁▁▁" and sparkline([]) == ""
    assert sparkline(list(range(100)), width=4) == "▁▃▆█"  # the last four: 96..99


def test_table_sorts_cuts_and_summarises(tmp_path: Path) -> None:
    now = time.time_ns()
    make_run(tmp_path, now)
    snap = read_snapshot(tmp_path, now_ns=now)
    t = build_top_table(snap, "step")
    # stale first, then the slowest step first
    assert [r.rank for r in t.rows] == [2, 3, 1, 0]
    assert t.ranks == 4 and t.stale == 1 and not t.ended and t.hidden == 0
    assert t.median_step_ns == 110 * MS  # of ranks 0, 1, 3 (not the stale one)
    row1 = next(r for r in t.rows if r.rank == 1)
    # in flight 3 s when written, the record 1 s old: 3 s (the record's age is not added: the
    # collective may have completed since)
    assert row1.inflight_age_ns == 3 * 10**9 and row1.inflight_op == "all_reduce dp"
    assert next(r for r in t.rows if r.rank == 3).straggler
    assert [r.rank for r in build_top_table(snap, "comm", limit=2).rows] == [2, 3]
    t = build_top_table(snap, "throughput", limit=2)
    assert [r.rank for r in t.rows] == [2, 0] and t.hidden == 2  # steps/s 9 < 18k tokens/s
    assert (t.rows[1].rate, t.rows[1].rate_unit) == (9.0, "steps/s")
    assert [r.rank for r in build_top_table(snap, "rank").rows] == [2, 0, 1, 3]
    with pytest.raises(ValueError):
        build_top_table(snap, "nope")


def make_even_run(run: Path, now: int) -> None:
    """Four running ranks of one synchronous job: every step takes about 100 ms (the waiting
    ranks' a little longer than the culprit's), rank 2 computes 150 ms and the others 100 ms."""
    for r in range(4):
        write_rank_live(
            run,
            RankLive(
                rank=r, updated_ns=now - 10**8, interval_s=1.0, world_size=4, step=50,
                steps_done=50, step_ns=(99 if r == 2 else 100 + r) * MS,
                recent_step_ns=[100 * MS] * 8, last_step_end_ns=now - 2 * 10**8,
                compute_ns=(150 if r == 2 else 100) * MS,
            ),
        )  # fmt: skip


def test_cost_order_puts_the_culprit_first(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    now = time.time_ns()
    make_even_run(tmp_path, now)
    snap = read_snapshot(tmp_path, now_ns=now)
    t = build_top_table(snap, limit=2)  # the default order: cost
    assert t.sort == "cost" and [r.rank for r in t.rows] == [2, 3] and t.hidden == 2
    assert t.rows[0].score == pytest.approx(1.5) and t.rows[1].score == pytest.approx(1.0)
    assert [r.rank for r in build_top_table(snap, "step", limit=2).rows] == [3, 1]  # not 2
    r = cli("top", tmp_path, "--once", "--rows", "2")
    assert r.returncode == 0, r.stderr
    (row,) = [x for x in r.stdout.splitlines() if x.split()[:2] == ["2", "50"]]
    assert "1.50×" in row and "vs peers ▼" in r.stdout
    # a rank stuck in its step with no collective in flight (the hang's culprit) before those
    # waiting in one, a dead rank before both
    write_rank_live(
        tmp_path,
        RankLive(
            rank=0, updated_ns=now - 10**8, interval_s=1.0, step_ns=100 * MS,
            recent_step_ns=[100 * MS] * 8, last_step_end_ns=now - 30 * 10**9,
            compute_ns=100 * MS, inflight=InflightLive("all_reduce", "dp", "dp", 9, 29 * 10**9),
        ),
    )  # fmt: skip
    write_rank_live(
        tmp_path,
        RankLive(
            rank=1, updated_ns=now - 10**8, interval_s=1.0, step_ns=100 * MS,
            last_step_end_ns=now - 30 * 10**9, compute_ns=100 * MS,
        ),
    )  # fmt: skip
    t = build_top_table(read_snapshot(tmp_path, now_ns=now))
    assert [(r.rank, r.cost) for r in t.rows] == [(1, 1), (0, 2), (2, 3), (3, 3)]
    write_rank_live(
        tmp_path,
        RankLive(rank=3, updated_ns=now, interval_s=1.0, status="ended", exit_how="signal"),
    )
    assert build_top_table(read_snapshot(tmp_path, now_ns=now)).rows[0].rank == 3


def test_rendered_frame(tmp_path: Path) -> None:
    now = time.time_ns()
    make_run(tmp_path, now)
    t = build_top_table(read_snapshot(tmp_path, now_ns=now), "memory", limit=3)
    console = Console(record=True, width=160, color_system=None)
    console.print(render_top(t, "RUN", interactive=True))
    text = console.export_text()
    lines = text.splitlines()
    assert lines[0].startswith(
        "meshprof top RUN — running — 4 ranks, 1 stale, median step 110.00 ms"
    )
    assert "straggler: rank 3 +50.00 ms compute per step (+50%" in text
    (row0,) = [x for x in lines if x.split()[:2] == ["3", "43"]]  # rank 3, step 43
    assert "130.00 ms" in row0 and "4.0 GiB (50%)" in row0 and "36k tok/s" in row0
    assert "40.0%" in row0 and "5.0%" in row0 and row0.rstrip().endswith("straggler")
    (stale,) = [x for x in lines if x.split()[:2] == ["2", "42"]]
    assert "STALE 10s" in stale
    (r1,) = [x for x in lines if x.split()[:2] == ["1", "41"]]
    assert "all_reduce dp 3.00 s" in r1
    assert "… 1 more ranks (--rows)" in text  # rank 0 (the least memory) is cut
    assert "straggler: rank 3 is a straggler: +50 ms" in text
    assert "memory ▼" in text and "q quit" in text


def test_once_json_and_the_view_without_a_terminal(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    now = time.time_ns()
    make_run(tmp_path, now)
    r = cli("top", tmp_path, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert [x["rank"] for x in d["ranks"]] == [0, 1, 2, 3] and d["stale"] == [2]
    assert [s["rank"] for s in d["stragglers"]] == [3] and d["alerts"][0]["ranks"] == [3]
    assert d["ranks"][1]["inflight"]["op"] == "all_reduce" and not d["ended"]
    r = cli("top", tmp_path, "--once", "--rows", "1")
    assert r.returncode == 0 and "STALE" in r.stdout and "… 3 more ranks" in r.stdout
    # the refreshing view with stdin not a terminal ends with the job: one frame of an ended run
    make_run(tmp_path, now, ended=True)
    r = cli("top", tmp_path, "--interval", "0.1")
    assert r.returncode == 0, r.stderr
    assert "ENDED" in r.stdout and "ended normal" in r.stdout and "STALE" not in r.stdout


def test_bad_input_is_one_line_and_exit_2(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    def err(*args: object) -> str:
        r = cli("top", *args)
        assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1
        return str(r.stderr)

    assert "no such directory" in err(tmp_path / "missing")
    assert "not a meshprof run directory" in err(tmp_path)
    (tmp_path / "manifest.json").write_text("{}")  # an older run, or --live-interval 0
    assert "no live state yet" in err(tmp_path, "--once")
    assert "no live state yet" in err(tmp_path, "--json")
    assert "--interval 0: must be > 0" in err(tmp_path, "--interval", "0")
    assert "--sort 'x'" in err(tmp_path, "--sort", "x")
    assert "--rows 'a'" in err(tmp_path, "--rows", "a")

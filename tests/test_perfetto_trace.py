"""The merged trace follows the Chrome JSON trace format (checked here without perfetto's tools)."""

from __future__ import annotations

import json
import sys
from collections import Counter

from data.meshprof_synth import MS, real_worker, synthetic_run
from meshprof.analyze.run.events.clock import align_clocks
from meshprof.analyze.run.events.match import match_collectives
from meshprof.analyze.run.events.table import build_event_table
from meshprof.launch.spawn import run_ranks
from meshprof.render.perfetto import build_trace
from meshprof.rundir import load_run


def check_chrome_trace(trace: dict) -> list[dict]:
    """Structure rules of the JSON Object Format (Trace Event Format spec)."""
    assert isinstance(trace["traceEvents"], list) and trace["displayTimeUnit"] in ("ms", "ns")
    evs = trace["traceEvents"]
    for e in evs:
        assert e["ph"] in ("X", "M", "s", "f"), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        assert isinstance(e["name"], str)
        if e["ph"] == "X":
            assert (
                isinstance(e["ts"], int | float)
                and isinstance(e["dur"], int | float)
                and e["dur"] >= 0
            )
        if e["ph"] == "M":
            assert e["name"] in (
                "process_name",
                "thread_name",
                "process_sort_index",
                "thread_sort_index",
            )
            assert isinstance(e["args"], dict)
    flows = [e for e in evs if e["ph"] in ("s", "f")]
    per_id = {}
    for e in flows:
        per_id.setdefault(e["id"], []).append(e)
    for fid, pair in per_id.items():
        assert sorted(p["ph"] for p in pair) == ["f", "s"], fid
        f = next(p for p in pair if p["ph"] == "f")
        assert f["bp"] == "e"
    # every flow end binds to an enclosing slice on its own track
    slices = [e for e in evs if e["ph"] == "X"]
    by_track: dict[tuple[int, int], list[dict]] = {}
    for x in slices:
        by_track.setdefault((x["pid"], x["tid"]), []).append(x)
    for e in flows:
        assert any(
            x["ts"] <= e["ts"] <= x["ts"] + x["dur"] for x in by_track[(e["pid"], e["tid"])]
        ), e
    names = {(e["pid"], e["tid"]) for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {(x["pid"], x["tid"]) for x in slices} <= names
    return evs


def test_synthetic_trace_structure_and_alignment(tmp_path):
    synthetic_run(tmp_path, 3, [0, 30 * MS, -40 * MS], slow_rank=1, extra_ns=5 * MS, steps=3)
    run = load_run(tmp_path)
    t = build_event_table(run)
    clock = align_clocks(run, t)
    trace = json.loads(json.dumps(build_trace(run, t, clock, match_collectives(t, clock))))
    evs = check_chrome_trace(trace)
    procs = {e["pid"]: e["args"]["name"] for e in evs if e["name"] == "process_name"}
    assert procs == {0: "rank 0 (node0)", 1: "rank 1 (node0)", 2: "rank 2 (node1)"}
    # one flow per early member per collective: 3 collectives x 2 early ranks, all ending on rank 1
    flows = [e for e in evs if e["ph"] == "f"]
    assert len(flows) == 6 and {f["pid"] for f in flows} == {1}
    # aligned: the same step starts within 0.5 ms on every rank (offsets were tens of ms)
    step0 = [e["ts"] for e in evs if e["ph"] == "X" and e["name"] == "step 0"]
    assert len(step0) == 3 and max(step0) - min(step0) < 500
    assert Counter(e["cat"] for e in evs if e["ph"] == "X") == {"step": 9, "phase": 27, "comm": 9}


def test_cli_trace_of_real_run(tmp_path, cli):
    run_ranks(real_worker, 2, (str(tmp_path), -1, 0.0, 3), timeout=90)
    out = tmp_path / "trace.json"
    p = cli("report", tmp_path, "--trace", out)
    assert p.returncode == 0, p.stderr
    evs = check_chrome_trace(json.loads(out.read_text()))
    threads = {e["args"]["name"] for e in evs if e["name"] == "thread_name"}
    assert "steps" in threads and any("default_pg" in t for t in threads)
    comm = [e for e in evs if e["ph"] == "X" and e["cat"] == "comm"]
    assert {e["name"] for e in comm} >= {"all_reduce", "barrier"}
    assert len([e for e in evs if e["ph"] == "s"]) == len(comm) // 2
    assert "perfetto" not in sys.modules

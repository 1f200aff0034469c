"""``meshprof diff A B``: the deltas against changes injected into synthetic runs (same seed, so
the two runs differ by exactly the injected change), notes for what cannot be compared, bad input,
and two real gloo runs under ``meshprof run`` that differ by a sleep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data.meshprof_synth import MS, US, synthetic_run
from meshprof.rundir import Manifest, write_manifest

OFFSETS = [0, 3 * MS, -2 * MS, 1 * MS]
MIB = 2**20
BASE = ((4096, 1 * MS), (MIB, 2 * MS))  # an all_reduce of 4 KiB (1 ms), then one of 1 MiB (2 ms)
SCRIPTS = Path(__file__).parent / "scripts"


def _diff(cli, a: Path, b: Path, *extra: str) -> dict:
    p = cli("diff", str(a), str(b), "--json", *extra)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _coll(d: dict, size: int) -> dict:
    return next(c for c in d["collectives"] if c["op"] == "all_reduce" and c["size_bytes"] == size)


def test_slower_collective_and_more_memory_are_the_deltas(tmp_path, cli):
    a, b = tmp_path / "a", tmp_path / "b"
    synthetic_run(a, 4, OFFSETS, collectives=BASE, tokens_per_step=8192)
    # B: the 1 MiB all_reduce takes 4 ms instead of 2; rank 2 holds 512 MiB more
    synthetic_run(
        b,
        4,
        OFFSETS,
        collectives=((4096, 1 * MS), (MIB, 4 * MS)),
        mem_rank=2,
        mem_extra_bytes=512 * MIB,
        tokens_per_step=8192,
    )
    d = _diff(cli, a, b)
    assert list(d) == [
        "a", "b", "headline", "notes", "step", "phases", "ranks", "collectives", "comm_share",
        "memory", "throughput", "bottlenecks",
    ]  # fmt: skip
    assert d["notes"] == []
    # every step, the backward phase and the 1 MiB all_reduce take 2 ms more; nothing else moves
    assert d["step"]["delta_ns"] == pytest.approx(2 * MS, abs=1 * US)
    assert d["step"]["rel"] == pytest.approx(2 * MS / d["step"]["a_ns"])
    assert d["phases"][0]["phase"] == "backward"
    assert d["phases"][0]["delta_ns"] == pytest.approx(2 * MS, abs=1 * US)
    assert {p["phase"]: p["delta_ns"] for p in d["phases"][1:]} == {"forward": 0, "optimizer": 0}
    top, small = d["collectives"]
    assert (top["op"], top["size_bytes"]) == ("all_reduce", MIB)
    assert top["delta_ns"] == pytest.approx(2 * MS, abs=1 * US)
    assert top["a_p50_ns"] == pytest.approx(2 * MS, abs=60 * US)  # + arrival skew and jitter
    assert (small["size_bytes"], small["delta_ns"]) == (4096, 0)
    assert top["a_count"] == top["b_count"] == 4 * 6
    # nccl-tests bus bandwidth of a 1 MiB all_reduce on 4 ranks: S / t · 2(n − 1)/n
    for key, t in (("a_busbw_gbps", 2 * MS), ("b_busbw_gbps", 4 * MS)):
        assert top[key] == pytest.approx(MIB / (t / 1e9) * 1.5 / 1e9, rel=0.03)
    # per rank: the step is 2 ms longer on every rank, as communication (no compute, no waiting)
    assert sorted(r["rank"] for r in d["ranks"]) == [0, 1, 2, 3]
    for r in d["ranks"]:
        assert r["step_delta_ns"] == pytest.approx(2 * MS, abs=1 * US)
        assert r["compute_delta_ns"] == pytest.approx(0, abs=1 * US)
        assert r["wait_delta_ns"] == pytest.approx(0, abs=1 * US)
        assert r["memory_delta_bytes"] == (512 * MIB if r["rank"] == 2 else 0)
    m = d["memory"]
    assert (m["a_max_rank"], m["b_max_rank"]) == (3, 2)
    assert m["delta_bytes"] == (102 + 512 - 103) * MIB
    # communication share of the step: (1 + 2) ms of 20 ms → (1 + 4) ms of 22 ms
    (share,) = d["comm_share"]
    assert share["a"] == pytest.approx(3 / 20, abs=0.01)
    assert share["b"] == pytest.approx(5 / 22, abs=0.01)
    # steps/s: each step's wall time grows by exactly 2 ms
    sps = d["throughput"]["steps_per_s"]
    assert 1 / sps["b"] - 1 / sps["a"] == pytest.approx(2e-3, abs=20e-6)
    # tokens/s: 8192 tokens per step of 20 ms, then 22 ms
    tps = d["throughput"]["tokens_per_s"]
    assert tps["a"] == pytest.approx(8192 / (d["step"]["a_ns"] / 1e9), rel=0.005)
    assert tps["b"] == pytest.approx(8192 / (d["step"]["b_ns"] / 1e9), rel=0.005)
    assert tps["rel"] == pytest.approx(20 / 22 - 1, abs=0.005)
    appeared = {(f["source"], f["kind"], f["rank"]) for f in d["bottlenecks"]["appeared"]}
    assert appeared == {
        ("bottleneck", "memory_imbalance", None),
        ("finding", "memory_imbalance", 2),
    }
    assert d["bottlenecks"]["vanished"] == []
    head = {h["what"]: h for h in d["headline"]}
    assert head["all_reduce 1 MiB p50"]["rel"] == pytest.approx(1.0, abs=0.03)
    # a slower transfer, not waiting: the members' median wait did not move
    assert head["all_reduce 1 MiB p50"]["wait_delta_ns"] == pytest.approx(0, abs=60 * US)
    assert head["all_reduce 1 MiB p50"]["mostly_waiting"] is False
    assert top["b_wait_p50_ns"] == pytest.approx(top["a_wait_p50_ns"], abs=60 * US)
    assert head["rank 2 peak memory"]["delta"] == 512 * MIB
    assert "phase forward" not in head and "all_reduce 4 KiB p50" not in head
    rels = [abs(h["rel"]) for h in d["headline"]]
    assert rels == sorted(rels, reverse=True)


def test_a_slower_rank_ranks_first_and_others_wait(tmp_path, cli):
    a, b = tmp_path / "a", tmp_path / "b"
    synthetic_run(a, 4, OFFSETS, collectives=BASE)
    synthetic_run(b, 4, OFFSETS, collectives=BASE, slow_rank=1, extra_ns=6 * MS)
    d = _diff(cli, a, b)
    first, *others = d["ranks"]
    assert first["rank"] == 1
    assert first["compute_delta_ns"] == pytest.approx(6 * MS, abs=1 * US)
    assert first["wait_delta_ns"] == pytest.approx(0, abs=300 * US)
    for r in others:  # the others wait for rank 1 in the first all_reduce of each step
        assert r["compute_delta_ns"] == pytest.approx(0, abs=1 * US)
        assert r["wait_delta_ns"] == pytest.approx(6 * MS, abs=300 * US)
    for r in d["ranks"]:
        assert r["step_delta_ns"] == pytest.approx(6 * MS, abs=300 * US)
    assert d["step"]["delta_ns"] == pytest.approx(6 * MS, abs=300 * US)
    assert "rank 1 compute" in {h["what"] for h in d["headline"]}
    # the 4 KiB all_reduce is 6 ms slower on three of its four members: they wait for rank 1
    head = {h["what"]: h for h in d["headline"]}
    waited = head["all_reduce 4 KiB p50"]
    assert waited["delta"] == pytest.approx(6 * MS, abs=300 * US)
    assert waited["wait_delta_ns"] == pytest.approx(6 * MS, abs=300 * US)
    assert waited["mostly_waiting"] is True
    text = " ".join(cli("diff", str(a), str(b)).stdout.split())  # (lines wrap at 80 columns)
    assert "(+5.97 ms, +582.5%), mostly waiting for late ranks (median wait +5.96 ms)" in text
    assert d["throughput"]["tokens_per_s"] is None  # no run recorded tokens
    appeared = {(f["source"], f["kind"], f["rank"]) for f in d["bottlenecks"]["appeared"]}
    assert {("bottleneck", "load_imbalance", None), ("finding", "straggler", 1)} <= appeared
    # the other way round, the same changes with the opposite sign, and the straggler vanished
    r = _diff(cli, b, a)
    assert r["ranks"][0]["rank"] == 1
    assert r["ranks"][0]["compute_delta_ns"] == pytest.approx(-6 * MS, abs=1 * US)
    assert r["step"]["delta_ns"] == pytest.approx(-d["step"]["delta_ns"])
    vanished = {(f["source"], f["kind"], f["rank"]) for f in r["bottlenecks"]["vanished"]}
    assert vanished == appeared and r["bottlenecks"]["appeared"] == []


def test_same_run_has_no_change(tmp_path, cli):
    synthetic_run(tmp_path, 4, OFFSETS, collectives=BASE, slow_rank=2, extra_ns=3 * MS)
    d = _diff(cli, tmp_path, tmp_path)
    assert d["step"]["delta_ns"] == 0 and d["headline"] == [] and d["notes"] == []
    deltas = [p["delta_ns"] for p in d["phases"]] + [c["delta_ns"] for c in d["collectives"]]
    deltas += [s["delta"] for s in d["comm_share"]] + [d["memory"]["delta_bytes"]]
    for r in d["ranks"]:
        deltas += [r["step_delta_ns"], r["compute_delta_ns"], r["wait_delta_ns"]]
    assert len(deltas) == 3 + 2 + 1 + 1 + 4 * 3 and set(deltas) == {0}
    assert d["bottlenecks"] == {"appeared": [], "vanished": []}
    p = cli("diff", str(tmp_path), str(tmp_path))
    assert p.returncode == 0 and "No change large enough for the headline" in p.stdout


def test_different_world_sizes_and_layouts_compare_what_they_can(tmp_path, cli):
    a, b = tmp_path / "w2", tmp_path / "w4"
    synthetic_run(a, 2, OFFSETS[:2], collectives=BASE)
    synthetic_run(b, 4, OFFSETS, collectives=((4096, 1 * MS), (MIB, 3 * MS)))
    d = _diff(cli, a, b)
    assert d["notes"] == ["per-rank comparison skipped: world sizes 2 vs 4"]
    assert d["ranks"] == [] and (d["a"]["world_size"], d["b"]["world_size"]) == (2, 4)
    top = d["collectives"][0]
    assert (top["size_bytes"], top["a_count"], top["b_count"]) == (MIB, 2 * 6, 4 * 6)
    assert top["delta_ns"] == pytest.approx(1 * MS, abs=60 * US)
    assert d["step"]["delta_ns"] == pytest.approx(1 * MS, abs=100 * US)
    assert d["phases"][0]["phase"] == "backward"
    p = cli("diff", str(a), str(b))
    assert p.returncode == 0 and "note: per-rank comparison skipped: world sizes 2 vs 4" in p.stdout
    # same world size, another layout: rank i is not the same rank
    c = tmp_path / "w4_tp"
    synthetic_run(c, 4, OFFSETS, collectives=BASE)
    write_manifest(
        c, Manifest(world_size=4, command="synthetic", layout={"dp": 2, "tp": 2, "pp": 1})
    )
    d = _diff(cli, b, c)
    assert d["ranks"] == []
    assert d["notes"] == ["per-rank comparison skipped: layouts unknown vs dp=2,tp=2,pp=1"]


def test_run_without_steps_is_compared_by_its_collectives(tmp_path, cli):
    a, b = tmp_path / "a", tmp_path / "b"
    synthetic_run(a, 4, OFFSETS, collectives=BASE, step_spans=False)
    synthetic_run(b, 4, OFFSETS, collectives=((4096, 1 * MS), (MIB, 4 * MS)))
    d = _diff(cli, a, b)
    assert d["step"] is None and d["phases"] == [] and d["comm_share"] == []
    assert d["notes"][0] == f"step and phase comparison skipped: A ({a}) recorded no steps"
    assert _coll(d, MIB)["delta_ns"] == pytest.approx(2 * MS, abs=1 * US)
    assert _coll(d, 4096)["delta_ns"] == 0
    # the ranks correspond: only their memory is compared
    assert [r["rank"] for r in d["ranks"]] == [0, 1, 2, 3]
    for r in d["ranks"]:
        assert r["step_delta_ns"] is None and r["compute_delta_ns"] is None
        assert r["memory_delta_bytes"] == 0


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", "missing: no such directory (expected a meshprof run directory)"),
        ("file", "not a directory"),
        ("empty", "no usable rank file"),
        ("nothing", "no steps and no completed collectives recorded: nothing to compare"),
        ("mismatched", "runs do not match"),
        ("html_dir", "--html"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, cli, case, message):
    good = tmp_path / "good"
    synthetic_run(good, 2, [0, 0], collectives=BASE)
    other = tmp_path / case
    extra: list[str] = []
    if case == "file":
        other.write_text("x")
    elif case == "empty":
        other.mkdir()
    elif case == "nothing":
        synthetic_run(other, 2, [0, 0], collectives=(), step_spans=False)
    elif case == "mismatched":  # A: collectives only; B: steps only
        synthetic_run(other, 2, [0, 0], collectives=())
        synthetic_run(good, 2, [0, 0], collectives=BASE, step_spans=False)
    elif case == "html_dir":
        other = good
        extra = ["--html", str(tmp_path)]
    # one case in a real process (its exit code and stderr), the others in this one (faster)
    run = cli.process if case == "missing" else cli
    p = run("diff", str(good), str(other), *extra)
    assert p.returncode == 2, p.stdout
    assert p.stderr.count("\n") == 1 and message in p.stderr, p.stderr
    assert p.stderr.startswith("meshprof diff: error: ")


def test_html_page_and_text_summary(tmp_path, cli, monkeypatch):
    # a terminal wide enough for the paths (a parallel run's tmp_path is longer): no line wraps
    monkeypatch.setenv("COLUMNS", "240")
    a, b = tmp_path / "a", tmp_path / "run<&>"
    synthetic_run(a, 4, OFFSETS, collectives=BASE)
    synthetic_run(b, 4, OFFSETS, collectives=((4096, 1 * MS), (MIB, 4 * MS)))
    page = tmp_path / "diff.html"
    p = cli("diff", str(a), str(b), "--html", str(page))
    assert p.returncode == 0, p.stderr
    assert "Largest changes" in p.stdout and "all_reduce 1 MiB p50" in p.stdout
    assert "step time (median)" in p.stdout and f"wrote {page}" in p.stdout
    doc = page.read_text()
    assert doc.startswith("<!DOCTYPE html>") and "run&lt;&amp;&gt;" in doc and "run<&>" not in doc
    assert "all_reduce 1 MiB p50: 2.01 ms → 4.01 ms (+2.00 ms" in doc
    assert '<table class="sortable">' in doc and "http" not in doc


SLEEP_S = 0.1


def _sleepy_worker(rank: int, world: int, out: str, sleep_s: float) -> list[int]:
    """Six requests to a tiny tensor-parallel-like model under a recording session (what
    ``meshprof run`` starts in each rank: recorder, step monitor with automatic step detection,
    here one step per forward call, clock sync, rank writer). In each forward the rank computes,
    sleeps 10 ms (rank 0: ``sleep_s`` more), then all_reduces. Returns the duration of each
    forward call as the script timed it (time.perf_counter_ns). No optimizer: creating one
    imports torch._dynamo, tens of seconds on a loaded machine."""
    import time

    import torch
    import torch.distributed as dist

    from meshprof.api import StepMonitor
    from meshprof.session.recording import RecordingSession, SessionConfig

    class Sleepy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.lin(x)
            time.sleep(0.01 + (sleep_s if rank == 0 else 0.0))
            dist.all_reduce(y)
            return y

    cfg = SessionConfig(
        run_dir=Path(out),
        step_detection="forward",
        flush_interval_s=0,
        manifest=Manifest(world_size=world, command="sleepy"),
    )
    # no pipeline hooks: they import torch.distributed.pipelining (seconds, more under load)
    mon = StepMonitor(None, track_pipeline=False)
    session = RecordingSession(cfg, monitor=mon).start()
    model = Sleepy()
    took = []
    with torch.no_grad():
        for _ in range(6):
            t0 = time.perf_counter_ns()
            model(torch.randn(4, 8))
            took.append(time.perf_counter_ns() - t0)
    dist.barrier()
    session.set_exit("normal", 0)
    session.stop()
    return took


def _median(v: list[int]) -> float:
    s = sorted(v)
    return (s[(len(s) - 1) // 2] + s[len(s) // 2]) / 2


@pytest.mark.timeout(180)
def test_real_runs_injected_sleep_is_the_step_delta(tmp_path, cli):
    """Two real 2-rank gloo runs under a recording session; in B rank 0 sleeps 100 ms more
    before its all_reduce in each step. Every rank's step grows by what the script measured
    itself (the sleep, plus whatever the machine's load adds): on rank 0 as compute, on rank 1
    as waiting for rank 0."""
    from meshprof.launch.spawn import run_ranks

    a = run_ranks(_sleepy_worker, 2, (str(tmp_path / "a"), 0.0), timeout=120)
    b = run_ranks(_sleepy_worker, 2, (str(tmp_path / "b"), SLEEP_S), timeout=120)
    d = _diff(cli, tmp_path / "a", tmp_path / "b")
    assert d["notes"] == []
    truth = {r: _median(b[r]) - _median(a[r]) for r in (0, 1)}
    assert min(truth.values()) > 0.5 * SLEEP_S * 1e9  # the sleep dominates the load's noise
    ranks = {r["rank"]: r for r in d["ranks"]}
    assert set(ranks) == {0, 1} and d["ranks"][0]["rank"] == 0  # the rank that changed, first
    for r, row in ranks.items():
        assert row["step_delta_ns"] == pytest.approx(truth[r], abs=3 * MS + 0.1 * truth[r])
    assert ranks[0]["compute_delta_ns"] == pytest.approx(truth[0], rel=0.25)
    assert ranks[1]["wait_delta_ns"] == pytest.approx(truth[1], rel=0.25)
    assert abs(ranks[1]["compute_delta_ns"]) < 0.25 * truth[1]
    assert d["step"]["delta_ns"] == pytest.approx(
        sum(truth.values()) / 2, abs=3 * MS + 0.1 * max(truth.values())
    )
    assert "step time" in {h["what"] for h in d["headline"]}
    # the all_reduce grew because rank 1 waited in it for rank 0's sleep: the headline says so
    (coll,) = [h for h in d["headline"] if h["what"].startswith("all_reduce")]
    assert coll["mostly_waiting"] is True
    assert coll["wait_delta_ns"] == pytest.approx(coll["delta"], rel=0.25)

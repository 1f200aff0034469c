"""The time ledger and the verdict, against the truth of a generator that knows every phase's
time: the synthetic run (tests/data/meshprof_synth.py) computes forward (10 ms, more on a slow
rank), backward (5 ms, then its all-reduces back to back), optimizer (2 ms) per step, and keeps
the true arrival of every rank at every collective. The truth below is computed from those
parameters and arrivals alone — not from meshprof's clock alignment, matching or step analysis."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from data.meshprof_synth import MS, US, synthetic_run
from meshprof.analyze.run.conclusions.verdict import NS_PER_HOUR
from meshprof.records.ledger import TimeCause
from meshprof.report.analysis import analyze_run
from meshprof.report.stages.ledger import LEDGER
from meshprof.report.stages.rank_analyses import RANK_ANALYSES
from meshprof.report.stages.verdict import VERDICT
from meshprof.rundir import load_run

STEPS = 6


def _truth_waits(arrivals: dict[tuple[int, int], int]) -> dict[int, int]:
    """rank -> its total waiting for later ranks over the run (true times)."""
    by_seq: dict[int, dict[int, int]] = defaultdict(dict)
    for (rank, seq), t in arrivals.items():
        by_seq[seq][rank] = t
    waited: dict[int, int] = defaultdict(int)
    for members in by_seq.values():
        last = max(members.values())
        for r, t in members.items():
            waited[r] += last - t
    return dict(waited)


@pytest.mark.parametrize(("world", "slow", "extra"), [(2, 1, 4 * MS), (4, 3, 2 * MS), (3, -1, 0)])
def test_the_ledger_adds_up_to_the_generators_phases(
    tmp_path: Path, world: int, slow: int, extra: int
) -> None:
    colls = ((4096, 1 * MS), (1 << 20, 3 * MS))
    truth = synthetic_run(
        tmp_path, world, [(r * 5 - 7) * MS for r in range(world)], steps=STEPS,
        slow_rank=slow, extra_ns=extra, collectives=colls,
    )  # fmt: skip
    rep = analyze_run(load_run(tmp_path))
    led = rep[LEDGER]
    led.check()  # every part >= 0, each ledger sums to its wall time, the job's to the ranks'
    analyses = {a.rank: a for a in rep[RANK_ANALYSES]}
    waits = _truth_waits(truth["arrivals"])
    latency = sum(c[1] for c in colls)  # after the last arrival, every member waits for it
    jitter = 20 * US * len(colls) * STEPS  # the generator's completion jitter, bounded
    for r in led.ranks:
        steps = analyses[r.rank].steps
        assert steps == STEPS
        p = r.parts
        # forward 10 ms (+ the generator's own 0-50 us draws) and backward's 5 ms of compute
        fwd_extra = extra if r.rank == slow else 0
        assert p[TimeCause.COMPUTE] == pytest.approx(
            steps * (15 * MS + fwd_extra), abs=steps * 60 * US
        )
        assert p[TimeCause.OPTIMIZER] == pytest.approx(steps * 2 * MS, abs=1_000)
        # the waiting for later ranks: the true arrivals' differences, within the clock
        # alignment's error (a few us per collective)
        assert p[TimeCause.STRAGGLER_WAIT] == pytest.approx(
            waits[r.rank], abs=steps * len(colls) * 30 * US
        )
        # the rest of the all-reduces: the transfer after the last arrival
        assert p[TimeCause.EXPOSED_OTHER] == pytest.approx(
            steps * latency, abs=jitter + steps * len(colls) * 30 * US
        )
        for c in (TimeCause.DATA_LOADING, TimeCause.BUBBLE, TimeCause.EXPOSED_DP):
            assert p[c] == 0
        assert p[TimeCause.IDLE] <= steps * 1_000  # the phases cover the steps
    assert led.job.wall_ns == sum(r.wall_ns for r in led.ranks)


def test_the_verdict_names_the_slow_rank_and_prices_it(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    synthetic_run(tmp_path, 4, [0, 2 * MS, -3 * MS, 1 * MS], steps=8, slow_rank=2, extra_ns=4 * MS)
    rep = analyze_run(load_run(tmp_path), gpu_hour_price=2.5)
    items = rep[VERDICT]
    strag = next(v for v in items if v.cause == "straggler")
    assert strag.ranks == (2,) and "rank 2" in strag.title
    # the rank's 4 ms cost the job's step 4 ms (the others wait for it in every all-reduce)
    assert strag.ns_per_step == pytest.approx(4 * MS, rel=0.05)
    # GPU-hours: the cost per step x the steps recorded x the GPUs of the job
    assert strag.gpu_hours == pytest.approx(strag.ns_per_step * 8 * 4 / NS_PER_HOUR)
    assert strag.money == pytest.approx(strag.gpu_hours * 2.5)
    assert [v.ns_per_step for v in items] == sorted((v.ns_per_step for v in items), reverse=True)
    assert all(v.share_of_step >= 0.02 for v in items)
    # the waiting the ledger shows is in the verdict too, attributed to the rank the others
    # waited for (from the arrivals), which the what-if prices above (issue 41: before, it was
    # dropped whenever a straggler was named)
    wait = next(v for v in items if v.cause == TimeCause.STRAGGLER_WAIT)
    assert wait.ranks == (2,) and "rank 2" in wait.title
    assert "priced above" in wait.evidence
    # the verdict never hides what the ledger shows: every part of 2 % of the step or more
    led = rep[LEDGER]
    shown = [k for k, n in led.job.parts.items() if k != "compute" and n >= 0.02 * led.job.wall_ns]
    assert shown and all(any(v.cause == k for v in items) for k in shown), (shown, items)
    brief = cli("report", tmp_path).stdout.split("Verdict")[1]
    assert all(v.title in brief.replace("\n     ", " ") for v in items), brief
    d = json.loads(cli("report", tmp_path, "--json", "--gpu-hour-price", "2.5").stdout)
    assert next(iter(d)) == "verdict" and d["verdict"][0]["cause"] in {
        "straggler",
        "exposed_comm_other",
    }
    assert {
        "cause",
        "ns_per_step",
        "share_of_step",
        "gpu_hours",
        "ranks",
        "since_step",
        "action",
    } <= set(d["verdict"][0])
    job = d["ledger"]["job"]
    assert sum(job["parts"].values()) == job["wall_ns"]
    for r in d["ledger"]["ranks"]:
        assert sum(r["parts"].values()) == r["wall_ns"]


def test_a_balanced_run_names_no_straggler(tmp_path: Path) -> None:
    synthetic_run(tmp_path, 4, [0, 1 * MS, 2 * MS, 3 * MS], steps=8)
    items = analyze_run(load_run(tmp_path))[VERDICT]
    assert not [v for v in items if v.cause == "straggler"]
    all_items = analyze_run(load_run(tmp_path), all_causes=True)[VERDICT]
    assert len(all_items) >= len(items)

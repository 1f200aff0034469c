"""Prometheus metrics: ``meshprof run --metrics-port`` serves /metrics for the node's ranks while
a real 2-rank job runs (counts against what the script says it issued, latency against the
injected delay, step time against the injected compute). A busy port (one warning, the job
runs) is tested in test_live_serve.py, whose job runs with one."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from live_helpers import settled, wait_for
from meshprof.launch.spawn import free_port
from meshprof.live.metrics import LiveCollector, metrics_text
from meshprof.records.live import HIST_BOUNDS_S, InflightLive, OpSeries, RankLive
from meshprof.rundir.live import write_rank_live
from test_grafana_dashboard import dashboard_metrics, served_metrics

prom = pytest.importorskip("prometheus_client.parser")

SCRIPTS = Path(__file__).parent / "scripts"
STEPS, BASE_S, EXTRA_S = 8, 0.04, 0.03


def _parse(text: str) -> dict[str, list[Any]]:
    """Samples by sample name."""
    out: dict[str, list[Any]] = {}
    for fam in prom.text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def _scrape(port: int, raw: list[str] | None = None) -> dict[str, list[Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=20) as r:
        text = r.read().decode("utf-8")
    if raw is not None:
        raw.append(text)
    return _parse(text)


def _head(port: int) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", method="HEAD")
    with urllib.request.urlopen(req, timeout=20) as r:
        return r.status, dict(r.headers), r.read()


def check_ledger_identity(samples: dict[str, list[Any]]) -> dict[int, dict[str, float]]:
    """Per rank, causes + compute = wall (the counters' identity); the ledgers by cause (s)."""
    out: dict[int, dict[str, float]] = {}
    for s in samples["meshprof_badput_seconds_total"]:
        out.setdefault(int(s.labels["rank"]), {})[s.labels["cause"]] = s.value
    good = _by_rank(samples, "meshprof_goodput_seconds_total")
    wall = _by_rank(samples, "meshprof_wall_seconds_total")
    assert set(out) == set(good) == set(wall) and out
    for r, parts in out.items():
        assert len(parts) == 9 and min(parts.values()) >= 0, parts
        assert sum(parts.values()) + good[r] == pytest.approx(wall[r], abs=1e-6), (r, parts)
        parts["compute"], parts["wall"] = good[r], wall[r]
    return out


def _by_rank(samples: dict[str, list[Any]], name: str, **labels: str) -> dict[int, float]:
    """Sum of the samples ``name`` per rank, over those matching ``labels``."""
    out: dict[int, float] = {}
    for s in samples.get(name, []):
        if all(s.labels.get(k) == v for k, v in labels.items()):
            r = int(s.labels["rank"])
            out[r] = out.get(r, 0.0) + s.value
    return out


def test_collector_labels_buckets_node_filter_and_inflight_age(tmp_path: Path) -> None:
    now = time.time_ns()
    buckets = [0] * (len(HIST_BOUNDS_S) + 1)
    buckets[3], buckets[5], buckets[-1] = 2, 3, 1  # 2 ≤ 500 µs, 3 ≤ 5 ms, 1 > 30 s
    write_rank_live(
        tmp_path,
        RankLive(
            rank=0,
            updated_ns=now - 2 * 10**9,
            interval_s=1.0,
            node_id="a-1",
            hostname="hostA",
            step_ns=250_000_000,
            series=[OpSeries("all_reduce", "dp", 6, 40 * 10**9, buckets)],
            inflight=InflightLive("broadcast", "mesh_tp", "tp", 7, 5 * 10**9),
        ),
    )
    write_rank_live(tmp_path, RankLive(rank=1, updated_ns=now, interval_s=1.0, node_id="b-2"))
    write_rank_live(  # stale: 20 s old at a 1 s interval
        tmp_path, RankLive(rank=2, updated_ns=now - 20 * 10**9, interval_s=1.0, node_id="a-1")
    )
    body, ctype = metrics_text(LiveCollector(tmp_path, node_id="a-1"))
    assert ctype.startswith("text/plain")
    m = _parse(body.decode())
    assert _by_rank(m, "meshprof_rank_up") == {0: 1.0, 2: 0.0}  # rank 1 is on node b-2
    assert m["meshprof_rank_up"][0].labels["node"] == "hostA"
    assert _by_rank(m, "meshprof_step_seconds") == {0: 0.25}  # none before a step (rank 2)
    b = {s.labels["le"]: s.value for s in m["meshprof_collective_seconds_bucket"]}
    assert b["0.0001"] == 0 and b["0.0005"] == 2 and b["0.005"] == 5 and b["30.0"] == 5
    assert b["+Inf"] == 6
    assert m["meshprof_collective_seconds_count"][0].value == 6
    assert m["meshprof_collective_seconds_sum"][0].value == 40.0
    assert _by_rank(m, "meshprof_collectives_total", op="all_reduce", dim="dp") == {0: 6.0}
    # 5 s in flight when written, written 2 s ago: 5 s (the collective may have completed since)
    inflight = _by_rank(m, "meshprof_inflight_seconds")
    assert inflight[0] == pytest.approx(5.0) and inflight[2] == 0.0
    assert set(_by_rank(m, "meshprof_rank_up", node="hostA")) == {0}
    everyone = _parse(metrics_text(LiveCollector(tmp_path))[0].decode())
    assert set(_by_rank(everyone, "meshprof_rank_up")) == {0, 1, 2}


def test_metrics_of_a_running_job(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out, ctl = tmp_path / "run", tmp_path / "ctl"
    ctl.mkdir()
    port = free_port()
    launched = time.time()
    raw: list[str] = []
    proc = cli.start(
        "run",
        "--nproc-per-node",
        "2",
        "-o",
        out,
        "--live-interval",
        "0.25",
        "--metrics-port",
        str(port),
        "--no-summary",
        SCRIPTS / "metrics_job.py",
        str(STEPS),
        "2",
        str(BASE_S),
        str(EXTRA_S),
        ctl,
    )
    try:
        issued1 = wait_for(lambda: settled(out, ctl, 0))
        first = _scrape(port)
        (ctl / "go0").write_text("")
        during = _scrape(port)  # phase 2 running
        issued2 = wait_for(lambda: settled(out, ctl, 1))
        second = _scrape(port, raw)
        elapsed = time.time() - launched
        head = _head(port)
    finally:
        for p in range(2):
            (ctl / f"go{p}").write_text("")
        outs = proc.communicate(timeout=120)
    assert proc.returncode == 0, outs[1][-2000:]
    assert "metrics" not in outs[1]
    assert issued1 == {0: STEPS, 1: STEPS} and issued2 == {0: 2 * STEPS, 1: 2 * STEPS}
    for scrape, issued in ((first, issued1), (second, issued2)):
        total = _by_rank(scrape, "meshprof_collectives_total", op="all_reduce")
        assert total == {r: float(n) for r, n in issued.items()}
        hist_count = _by_rank(scrape, "meshprof_collective_seconds_count", op="all_reduce")
        assert hist_count == total
        inf = _by_rank(scrape, "meshprof_collective_seconds_bucket", op="all_reduce", le="+Inf")
        assert inf == total
        assert _by_rank(scrape, "meshprof_rank_up") == {0: 1.0, 1: 1.0}
        assert _by_rank(scrape, "meshprof_inflight_seconds") == {0: 0.0, 1: 0.0}  # paused
        assert all(v > 0 for v in _by_rank(scrape, "meshprof_memory_bytes").values())
        # every step computes BASE_S (rank 1: + EXTRA_S) and the all_reduce syncs the ranks
        for r, v in _by_rank(scrape, "meshprof_step_seconds").items():
            assert 0.95 * (BASE_S + EXTRA_S) <= v <= 0.5, (r, v)
    mid = _by_rank(during, "meshprof_collectives_total", op="all_reduce")
    for r in (0, 1):  # monotone between scrapes
        assert STEPS <= mid[r] <= 2 * STEPS
    # rank 0 waits EXTRA_S (30 ms) in each all_reduce for rank 1: most of its all_reduces take
    # over 10 ms (the histogram's bucket), more than rank 1's. Counted, not summed: on a loaded
    # machine one late step of rank 0 makes rank 1 wait hundreds of ms once, which moved the
    # sums (CI: rank 0 0.50 s, rank 1 0.77 s) but moves a count by one
    total2 = _by_rank(second, "meshprof_collectives_total", op="all_reduce")
    fast = _by_rank(second, "meshprof_collective_seconds_bucket", op="all_reduce", le="0.01")
    slow = {r: total2[r] - fast[r] for r in total2}
    assert slow[0] >= 0.5 * 2 * STEPS and slow[0] > slow[1], slow
    assert _by_rank(second, "meshprof_collective_seconds_sum", op="all_reduce")[0] > 0
    assert _by_rank(second, "meshprof_steps_total") == {0: 2.0 * STEPS, 1: 2.0 * STEPS}
    # the culprit by name: rank 1 computes EXTRA_S longer per step (the injection)
    score = _by_rank(second, "meshprof_straggler_score")
    assert score[1] > 1.3 > 1 / 1.3 > score[0], score
    comp = _by_rank(second, "meshprof_compute_seconds")
    assert comp[1] - comp[0] == pytest.approx(EXTRA_S, rel=0.35), comp
    wait = _by_rank(second, "meshprof_wait_seconds")
    assert wait[0] == pytest.approx(EXTRA_S, rel=0.35) and wait[1] == 0.0, wait
    # the ledger adds up; its wall time lies between the steps' work and the job's age
    before, after = check_ledger_identity(first), check_ledger_identity(second)
    for r in (0, 1):
        assert 2 * STEPS * (BASE_S + EXTRA_S) <= after[r]["wall"] <= elapsed, after
        assert all(after[r][k] >= v for k, v in before[r].items()), (before, after)  # counters
    # rank 0's wait is carved out as straggler_wait: about EXTRA_S per step but the first
    assert after[0]["straggler_wait"] >= 0.5 * (2 * STEPS - 2) * EXTRA_S, after
    assert after[1]["straggler_wait"] <= 0.2 * after[0]["straggler_wait"], after
    assert head[0] == 200 and head[2] == b"" and int(head[1]["Content-Length"]) > 0, head
    # the Grafana dashboard's series (the Serving row's: tests/test_serving_live.py)
    assert dashboard_metrics(serving=False) <= served_metrics(raw[0])
    if shutil.which("promtool"):  # CI installs it (.ci/run)
        check = subprocess.run(
            ["promtool", "check", "metrics"], input=raw[0], capture_output=True, text=True
        )
        assert check.returncode == 0 and not check.stdout + check.stderr, check


@pytest.mark.parametrize(
    "args, message",
    [
        (["--metrics-port", "0"], "--metrics-port 0"),
        (["--metrics-port", "x"], "expected a number"),
        (["--metrics-port", "9100", "--live-interval", "0"], "live-interval"),
    ],
)
def test_bad_metrics_options(cli, args: list[str], message: str) -> None:  # type: ignore[no-untyped-def]
    p = cli("run", *args, SCRIPTS / "metrics_job.py")
    assert p.returncode == 2 and message in p.stderr and len(p.stderr.splitlines()) == 1

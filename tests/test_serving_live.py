"""Serving, live: the figures a serving rank publishes every second (``RankLive.serving``), the
Prometheus families named after vLLM's, the alert rules for SLO attainment and a straggling rank
in decode, ``top``.

Exact on a fake clock (the histograms' buckets with Prometheus' ``le``, the window's
percentiles, goodput, bounded memory); on a real job (the serving demo, rank 1 slow in decode)
against its client's own timestamps and the fault it was given."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import meshprof
from meshprof.analyze.live.alert_config import AlertConfig
from meshprof.analyze.live.alerts import AlertRules
from meshprof.analyze.live.serving_rules import decode_excess
from meshprof.analyze.live.top_table import build_top_table
from meshprof.demo.serving import ServeConfig
from meshprof.demo.serving_client import Load
from meshprof.demo.serving_run import CLIENT_FILE, run_serving
from meshprof.monitor import request_monitor
from meshprof.records.live import LiveSnapshot, RankLive
from meshprof.records.serving import (
    HISTOGRAMS,
    ITL_BOUNDS_S,
    REQUEST_BOUNDS_S,
    TTFT_BOUNDS_S,
    ServiceLevels,
    ServingLive,
    WindowFigures,
)
from meshprof.render.live_top import render_top
from meshprof.rundir.live import read_rank_lives, write_rank_live
from meshprof.session import live_serving
from meshprof.session.live_serving import LiveServing

MS = 1_000_000
T0 = 1_700_000_000_000_000_000
SLOW_MS = 150.0

# OpenTelemetry GenAI's recommended bucket boundaries (semantic conventions, gen-ai metrics)
OTEL_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
             7.5, 10.0)  # fmt: skip
OTEL_TPOT = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
OTEL_DURATION = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                 40.96, 81.92)  # fmt: skip


def test_the_buckets_cover_opentelemetrys_and_the_names_are_vllms() -> None:
    assert set(OTEL_TTFT) <= set(TTFT_BOUNDS_S)
    assert set(OTEL_TPOT) <= set(ITL_BOUNDS_S)
    assert set(OTEL_DURATION) <= set(REQUEST_BOUNDS_S)
    vllm = {"time_to_first_token_seconds", "inter_token_latency_seconds",
            "request_time_per_output_token_seconds", "e2e_request_latency_seconds",
            "request_queue_time_seconds", "request_prefill_time_seconds",
            "request_decode_time_seconds", "request_inference_time_seconds",
            "request_prompt_tokens", "request_generation_tokens"}  # fmt: skip
    assert {name for _, name in HISTOGRAMS.values()} == vllm


class FakeClock:
    def __init__(self) -> None:
        self.now = T0

    def time_ns(self) -> int:
        return self.now

    def at(self, ms: float) -> None:
        self.now = T0 + int(ms * MS)


def test_live_figures_on_a_fake_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(request_monitor, "time", clock)
    rm = meshprof.requests()
    live = LiveServing(ServiceLevels(ttft_s=0.025))
    clock.at(0)
    a, b = rm.begin(10), rm.begin(20)
    rm.scheduled(a)
    clock.at(20)
    rm.token(a)  # A: TTFT 20 ms
    rm.scheduled(b)
    live.fold(rm)  # a fold in the middle: the gaps straddle it
    clock.at(30)
    rm.tokens([a, b])  # B: TTFT 30 ms; A's gap 10 ms
    clock.at(35)
    rm.tokens([a, b])  # gaps 5 ms
    rm.finish(a, "length")
    clock.at(40)
    rm.finish(b, "error")
    live.fold(rm)
    got = live.build(rm, T0 + 41 * MS)
    h = {x.name: x for x in got.histograms}
    # le: 0.02 lands in the 0.02 bucket (TTFT of A; B failed: not observed)
    assert h["ttft"].count == 1 and h["ttft"].buckets[TTFT_BOUNDS_S.index(0.02)] == 1
    assert h["itl"].count == 3 and h["itl"].total == pytest.approx(0.02)
    assert h["itl"].buckets[ITL_BOUNDS_S.index(0.005)] == 2
    assert h["itl"].buckets[ITL_BOUNDS_S.index(0.01)] == 1
    assert h["e2e"].total == pytest.approx(0.035)
    assert h["tpot"].total == pytest.approx((0.035 - 0.02) / 2)
    assert h["output_tokens"].total == 3 and h["prompt_tokens"].total == 10
    assert got.requests_finished == {"stop": 0, "length": 1, "abort": 0, "error": 1}
    assert got.good_requests == 1 and (got.requests_running, got.requests_waiting) == (0, 0)
    w = got.window
    assert w.requests == 2 and w.error_rate == 0.5 and w.slo_attainment == 1.0
    # gaps 5, 5, 10 ms
    assert w.ttft_p50_s == pytest.approx(0.02) and w.itl_p99_s == pytest.approx(0.0099)
    assert w.output_tokens_per_s == pytest.approx(5 / 0.021)  # from the oldest emission
    # out of the window later: nothing recent, the cumulative figures stay
    later = live.build(rm, T0 + 120_000 * MS)
    assert later.window.requests == 0 and later.histograms[0].count == 1


def test_live_memory_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(request_monitor, "time", clock)
    monkeypatch.setattr(live_serving, "MAX_TRACKED", 100)
    rm = meshprof.requests()
    live = LiveServing()
    for k in range(50):
        clock.at(k)
        rids = [rm.begin(1) for _ in range(10)]  # never finished
        rm.tokens(rids)
        live.fold(rm)
    assert len(live._last) <= 100
    assert len(live._recent) <= live_serving.MAX_RECENT


def _rank(r: int, serving: ServingLive, t: int) -> RankLive:
    return RankLive(rank=r, updated_ns=t, interval_s=1.0, step=10, serving=serving)


def test_alert_rules_decode_straggler_and_slo_attainment() -> None:
    rules = AlertRules(AlertConfig(straggler_looks=2, hold_looks=2))
    slo = ServiceLevels(ttft_s=0.2)
    raised = []
    for k in range(4):
        t = T0 + k * 10**9
        ranks = {
            0: _rank(0, ServingLive(decode_steps=8, decode_compute_s=0.010, slo=slo,
                                    window=WindowFigures(requests=10, slo_attainment=0.5)), t),
            1: _rank(1, ServingLive(serves_requests=False, decode_steps=8,
                                    decode_compute_s=0.016), t),
            2: _rank(2, ServingLive(serves_requests=False, decode_steps=8,
                                    decode_compute_s=0.0101), t),
        }  # fmt: skip
        snap = LiveSnapshot(t, ranks, [], [], [], False, 3)
        raised += rules.evaluate(snap)
    kinds = {a.kind: a for a in raised}
    assert set(kinds) == {"decode_straggler", "slo"}
    d = kinds["decode_straggler"]
    assert d.ranks == (1,) and d.value == pytest.approx(0.016 / 0.01005 - 1) and d.unit == "ratio"
    s = kinds["slo"]
    assert s.ranks == (0,) and s.value == 0.5 and s.threshold == pytest.approx(0.1)  # missed
    assert len(raised) == 2  # once per episode


# -- a real job -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def slow_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("live") / "run"
    cfg = ServeConfig(device_ms=10, slow_rank=1, slow_ms=SLOW_MS, slow_from=0, live_interval_s=0.5,
                      slo=ServiceLevels(ttft_s=0.001))  # fmt: skip
    run_serving(out, cfg, Load(requests=16, rate=4.0, output=(4, 12), seed=2), tp=2,
                timeout_s=500)  # fmt: skip
    return out


def _report_latencies(run: Path) -> dict[str, Any]:
    """``meshprof report RUN --json --steps all``'s serving latencies."""
    from meshprof.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["report", str(run), "--json", "--steps", "all"]) == 0
    return dict(json.loads(buf.getvalue())["serving"]["latencies"])


@pytest.mark.slow
def test_live_records_agree_with_the_client(slow_run: Path) -> None:
    recs = read_rank_lives(slow_run)
    s0, s1 = recs[0].serving, recs[1].serving
    assert s0 is not None and s0.serves_requests and s1 is not None and not s1.serves_requests
    client = json.loads((slow_run / CLIENT_FILE).read_text())["requests"]
    h = {x.name: x for x in s0.histograms}
    gaps = [b - a for r in client for a, b in zip(r["token_ns"], r["token_ns"][1:], strict=False)]
    assert h["ttft"].count == len(client) == sum(s0.requests_finished.values())
    assert h["itl"].count == len(gaps)
    assert h["output_tokens"].total == sum(len(r["token_ns"]) for r in client)
    # the client's clock includes the hops client -> frontend -> server and back (0.2-1.5 ms
    # since the sockets send at once: Nagle's algorithm held a request up to 40 ms before): the
    # live window is checked against the client within max(1 ms, 5 %), and against the
    # report's figures over the same requests (which test_serving_truth checks alike) to 1 µs
    ttft = np.percentile([r["token_ns"][0] - r["sent_ns"] for r in client], 50) / 1e9
    assert abs(s0.window.ttft_p50_s - ttft) <= max(1e-3, 0.05 * ttft)
    itl = np.percentile(gaps, 50) / 1e9
    assert abs(s0.window.itl_p50_s - itl) <= max(1e-3, 0.05 * itl)
    rep = _report_latencies(slow_run)
    assert abs(s0.window.ttft_p50_s - rep["ttft"]["p50"] / 1e9) <= 1e-6
    assert abs(s0.window.itl_p50_s - rep["itl"]["p50"] / 1e9) <= 1e-6
    assert s0.window.slo_attainment == 0.0 and s0.good_requests == 0  # ttft <= 1 ms: none
    # rank 1 sleeps SLOW_MS in each decode step: its decode compute stands out (at least half
    # of it: on a loaded machine the ranks' own compute varies by tens of ms)
    assert s1.decode_compute_s - s0.decode_compute_s > 0.5 * SLOW_MS / 1e3
    ex = decode_excess({r: dataclasses.replace(x, status="running") for r, x in recs.items()})
    assert ex[1][0] > 0.2 and ex[0][0] < 0


@pytest.mark.slow
def test_prometheus_top_and_alerts_on_the_real_job(slow_run: Path) -> None:
    pytest.importorskip("prometheus_client")
    from meshprof.live.metrics import LiveCollector, metrics_text

    # the job's last records, as if it were still running (the exporter scores running ranks)
    running = slow_run.parent / "as_running"
    for x in read_rank_lives(slow_run).values():
        write_rank_live(
            running, dataclasses.replace(x, status="running", updated_ns=time.time_ns())
        )
    text = metrics_text(LiveCollector(running))[0].decode()
    assert "meshprof_time_to_first_token_seconds_count{node=" in text
    assert 'meshprof_request_success_total{finished_reason="length"' in text
    line = next(x for x in text.splitlines() if x.startswith("meshprof_decode_straggler_score")
                and 'rank="1"' in x)  # fmt: skip
    assert float(line.split()[-1]) > 1.2
    recs = {
        r: dataclasses.replace(x, status="running") for r, x in read_rank_lives(slow_run).items()
    }
    rules = AlertRules(AlertConfig())
    raised: list[Any] = []
    for k in range(4):
        t = time.time_ns() + k * 10**9
        ranks = {r: dataclasses.replace(x, updated_ns=t) for r, x in recs.items()}
        raised += rules.evaluate(LiveSnapshot(t, ranks, [], [], [], False, 2))
    kinds = {a.kind: a.ranks for a in raised}
    assert kinds.get("decode_straggler") == (1,) and kinds.get("slo") == (0,)
    snap = LiveSnapshot(time.time_ns(), recs, [], [], raised, False, 2)
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(render_top(build_top_table(snap), str(slow_run)))
    out = console.export_text()
    assert "serving (rank 0)" in out and "decode: rank 1 computes" in out

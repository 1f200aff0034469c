"""Serving over OpenTelemetry: a tiny serving loop (``meshprof.requests()``) under
``meshprof run --otlp-endpoint`` sending to an OTLP/HTTP receiver in this process, and
``meshprof export --format otlp`` of the finished run to an OTLP/gRPC one (both decoding the
protocol with ``opentelemetry-proto``).

Truth: the script's own ``time.time_ns()`` when it handed each request over, after its first
token and after it finished, its token counts and its finish reasons
(tests/scripts/otel_serving_job.py), and the W3C ``traceparent`` it made up for some of them
(random trace and span ids; some malformed). The GenAI histograms' counts, sums and buckets are counted
here from those timestamps, with this file's own code; each request's span against them within
max(1 ms, 5 %). The re-bucketing of the live histograms to the GenAI bounds is checked against
counting under the GenAI bounds directly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from meshprof.live.otel import instruments as I
from meshprof.live.otel.genai_buckets import SOURCES, holds, rebucket
from meshprof.records.serving import HISTOGRAMS
from otlp_receiver import GrpcReceiver, HttpReceiver, PointView, SpanView, latest, points, spans

pytest.importorskip("opentelemetry.sdk")

SCRIPTS = Path(__file__).parent / "scripts"
MS = 1_000_000
OK = ("stop", "length")


def _cli(*args: Any, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "meshprof.cli", *(os.fspath(a) for a in args)],
        env={**os.environ, "OTEL_METRIC_EXPORT_INTERVAL": "500"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _close(got: float, want: float) -> bool:
    return abs(got - want) <= max(MS, 0.05 * abs(want))


@dataclass
class Served:
    run: Path
    result: subprocess.CompletedProcess[str]
    spans: list[SpanView]
    points: list[PointView]
    truth: list[dict[str, Any]]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Served:
    out = tmp_path_factory.mktemp("otel-serving")
    with HttpReceiver() as rx:
        res = _cli(
            "run", "--nproc-per-node", "1", "-o", out / "run", "--live-interval", "0.25",
            "--otlp-endpoint", rx.url, "--no-summary", SCRIPTS / "otel_serving_job.py", out,
        )  # fmt: skip
    assert res.returncode == 0, res.stderr
    truth = json.loads((out / "serving_truth.json").read_text())
    return Served(out / "run", res, spans(rx.got), points(rx.got), truth)


def _truth_s(truth: list[dict[str, Any]]) -> dict[str, list[float]]:
    """The GenAI figures of the successful requests, seconds, from the script's clock."""
    ok = [t for t in truth if t["reason"] in OK]
    return {
        I.TIME_TO_FIRST_TOKEN.name: [(t["first_ns"] - t["sent_ns"]) / 1e9 for t in ok],
        I.TIME_PER_OUTPUT_TOKEN.name: [
            (t["end_ns"] - t["first_ns"]) / 1e9 / (t["tokens"] - 1) for t in ok if t["tokens"] > 1
        ],
        I.REQUEST_DURATION.name: [(t["end_ns"] - t["sent_ns"]) / 1e9 for t in ok],
    }


def test_genai_bounds_are_live_bounds_so_rebucketing_is_exact() -> None:
    rng = np.random.default_rng(7)
    for inst in I.GENAI_SERVER:
        src = HISTOGRAMS[SOURCES[inst.name]][0]
        assert holds(src, inst.buckets), inst.name
        # values on, between and beyond the bounds, counted under each set of bounds
        values = np.concatenate(
            [rng.lognormal(-2.5, 1.5, 2000), np.array(src), np.array(inst.buckets), [1e6]]
        )
        counts = np.bincount(np.searchsorted(src, values, "left"), minlength=len(src) + 1)
        want = np.bincount(
            np.searchsorted(inst.buckets, values, "left"), minlength=len(inst.buckets) + 1
        )
        assert rebucket(src, counts.tolist(), inst.buckets) == tuple(want.tolist()), inst.name
    # bounds that are not a subset: a straddling bucket is counted above (stated, not exact)
    assert rebucket((1.0, 3.0), (1, 2, 3), (2.0,)) == (1, 5)


def test_live_genai_histograms_count_the_scripts_requests(served: Served) -> None:
    truth = _truth_s(served.truth)
    got = {name: p for (name, _a), p in latest(served.points).items() if name.startswith("gen_ai.")}
    assert set(got) == set(truth)  # no error.type series: the live histograms count successes
    for name, values in truth.items():
        inst = next(i for i in I.GENAI_SERVER if i.name == name)
        p = got[name]
        assert p.kind == "histogram" and p.unit == "s" and p.bounds == inst.buckets
        assert p.count == len(values), name
        assert abs(p.sum - sum(values)) <= max(len(values) * MS / 1e9, 0.05 * sum(values)), name
        want = np.bincount(
            np.searchsorted(inst.buckets, values, "left"), minlength=len(inst.buckets) + 1
        )
        near = any(min(abs(v - b) for b in inst.buckets) < 1e-3 for v in values)
        if not near:  # (a value within the clocks' 1 ms of a bound may fall either side)
            assert p.bucket_counts == tuple(want.tolist()), name
        a = p.attributes
        assert a["gen_ai.operation.name"] == "text_completion" and a["meshprof.rank"] == 0
        assert a["gen_ai.provider.name"] == "meshprof" and "gen_ai.request.model" not in a


def _check_spans(got: list[SpanView], truth: list[dict[str, Any]], offset_ns: int) -> None:
    reqs = {
        s.attributes["gen_ai.response.id"]: s for s in got if "gen_ai.response.id" in s.attributes
    }
    assert sorted(reqs) == sorted(str(t["id"]) for t in truth)
    callers = {t["trace_id"] for t in truth if t["trace_id"]}
    assert len(callers) == 4  # (the script's requests 0, 2, 4 and 6)
    for t in truth:
        s = reqs[str(t["id"])]
        a = s.attributes
        assert s.name == "text_completion"
        if t["trace_id"]:  # the caller's trace, under the caller's span (a remote parent)
            assert (s.trace_id, s.parent_id) == (t["trace_id"], t["parent_id"]), (t, s)
            assert s.flags & 0x300 == 0x300  # OTLP: has-is-remote, is-remote
        else:  # none, or a malformed one (ignored): a trace of its own, as before
            assert s.parent_id == "" and s.trace_id not in callers, (t, s)
            assert len(s.trace_id) == 32 and int(s.trace_id, 16) != 0
            assert s.flags & 0x300 == 0x100  # has-is-remote, not remote (no parent)
        assert _close(s.end_ns - s.start_ns, t["end_ns"] - t["sent_ns"]), (t, s)
        assert abs(s.start_ns - offset_ns - t["sent_ns"]) <= MS
        assert _close(a["meshprof.request.time_to_first_token"] * 1e9, t["first_ns"] - t["sent_ns"])
        if t["tokens"] > 1:
            tpot = (t["end_ns"] - t["first_ns"]) / (t["tokens"] - 1)
            assert _close(a["meshprof.request.time_per_output_token"] * 1e9, tpot)
        assert a["gen_ai.usage.output_tokens"] == t["tokens"]
        assert a["gen_ai.usage.input_tokens"] == t["prompt"]
        assert a["gen_ai.response.finish_reasons"] == (t["reason"],)
        if t["reason"] == "error":
            assert s.status == 2 and a["error.type"] == "_OTHER"
        else:
            assert s.status == 0 and "error.type" not in a


def test_live_request_spans_match_the_scripts_clock(served: Served) -> None:
    _check_spans(served.spans, served.truth, _offset(served.run))
    lines = [x for x in served.result.stderr.splitlines() if "OTLP" in x]
    assert len(lines) == 1 and "dropped" not in lines[0], lines


def _offset(run: Path) -> int:
    from meshprof.analyze.run.events.clock import exchange_estimate
    from meshprof.rundir import load_run

    est = exchange_estimate(load_run(run).ranks[0].meta.clock_sync)
    return est[0] if est is not None else 0


def test_post_mortem_sends_the_same_request_spans(served: Served) -> None:
    with GrpcReceiver() as rx:
        res = _cli(
            "export",
            served.run,
            "--format",
            "otlp",
            "--endpoint",
            rx.url,
            "--protocol",
            "grpc",
            "--json",
        )
        assert res.returncode == 0, res.stderr
        got = spans(rx.got)
    assert json.loads(res.stdout)["requests"] == len(served.truth)
    post = [s for s in got if "gen_ai.response.id" in s.attributes]
    live = {s.span_id: s for s in served.spans if "gen_ai.response.id" in s.attributes}
    # the same ids as the live exporter's (a backend keeps one of each)
    assert {s.span_id for s in post} == set(live)
    for s in post:
        assert (s.end_ns - s.start_ns) == (live[s.span_id].end_ns - live[s.span_id].start_ns)
        # the same trace and parent: the caller's, read back from the run directory
        assert (s.trace_id, s.parent_id) == (live[s.span_id].trace_id, live[s.span_id].parent_id)
    _check_spans(got, served.truth, _offset(served.run))


def test_request_spans_are_bounded_by_the_span_queue(tmp_path: Path) -> None:
    """More finished requests than the span queue holds: the rest are dropped and counted
    (meshprof.otel.dropped, queue_full), and no span is built for them."""
    from meshprof.live.otel.agent import OtlpAgent
    from meshprof.live.otel.export_worker import ExportWorker
    from meshprof.live.otel.exporters import JobIdentity
    from meshprof.live.otel.request_spans import RequestRecord
    from meshprof.live.otel.settings import resolve_settings

    settings = resolve_settings("http://127.0.0.1:9", "http/protobuf", {})
    assert settings is not None
    agent = OtlpAgent(tmp_path, settings, JobIdentity(run_id="r"))
    # a worker whose thread is not started: nothing leaves its queue of 3
    agent.spans = ExportWorker(
        "traces", lambda _batch: True, capacity=3, batch=100, period_s=1.0, on_count=agent._on_count
    )
    agent._send_requests([RequestRecord(str(i), 0, 10 * i, 10 * i + 5) for i in range(10)])
    assert agent.requests_sent == 3 and agent.spans.queued() == 3
    assert agent.counts.dropped == {("traces", "queue_full"): 7}


def test_a_tail_keeps_a_bounded_number_of_request_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from meshprof.events import REQUEST_DTYPE
    from meshprof.rundir import segment_tail

    monkeypatch.setattr(segment_tail, "MAX_PENDING_REQUESTS", 5)
    tail = segment_tail.RankTail(tmp_path, requests=True)
    for k in range(3):
        rows = np.zeros(3, REQUEST_DTYPE)
        rows["id"] = [3 * k, 3 * k + 1, 3 * k + 2]
        tail._keep_requests(rows)
    assert tail.take_requests()["id"].tolist() == [6, 7, 8]  # the newest
    assert tail.counters.requests_dropped == 6 and len(tail.take_requests()) == 0

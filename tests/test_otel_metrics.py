"""OTLP metrics against the protocol: the live figures of a run directory sent through the SDK's
real OTLP exporters to a receiver that decodes them with ``opentelemetry-proto``, compared
with what Prometheus's ``/metrics`` serves for the same directory (the same set: every family
and label set, every value, histogram buckets), and with the records themselves (times,
units); the GenAI conventions' histograms over gRPC."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from meshprof.live.metrics import LiveCollector, metrics_text
from meshprof.live.otel import instruments as I
from meshprof.live.otel.exporters import JobIdentity, job_resource, metric_exporter, scope
from meshprof.live.otel.figures import (
    ExportSnapshot,
    FigureReader,
    HistogramFigure,
    ServingFigures,
)
from meshprof.live.otel.metric_points import metrics_data
from meshprof.live.otel.settings import SignalTarget
from meshprof.records.ledger import TimeCause
from meshprof.records.live import HIST_BOUNDS_S, DimLive, InflightLive, OpSeries, RankLive
from meshprof.rundir.live import write_rank_live
from otlp_receiver import GrpcReceiver, HttpReceiver, points

prom = pytest.importorskip("prometheus_client.parser")
S = 10**9


def _records(tmp: Path) -> dict[int, RankLive]:
    now = time.time_ns()
    buckets = [0] * (len(HIST_BOUNDS_S) + 1)
    buckets[3], buckets[5], buckets[-1] = 2, 3, 1
    ledger = {c.value: 0 for c in TimeCause}
    recs = {}
    for r, (compute, host, node) in enumerate(
        [(20_000_000, "hostA", "a"), (31_000_000, "hostA", "a"), (19_000_000, "hostB", "b")]
    ):
        lg = dict(ledger, compute=5 * S, exposed_comm_dp=2 * S + r, idle=S)
        recs[r] = RankLive(
            rank=r,
            updated_ns=now - r * 1000,
            interval_s=1.0,
            world_size=3,
            hostname=host,
            node_id=node,
            stage=0,
            started_ns=now - 60 * S,
            steps_done=40 + r,
            recent_step_ns=[40_000_000] * 8,
            step_ns=40_000_000,
            compute_ns=compute,
            steps_per_s=25.0,
            tokens_per_s=1600.0,
            dims=[DimLive("dp", 10_000_000 * 8, 8_000_000 * 8, 0.25, 0.2)],
            memory_bytes=1 << 30,
            memory_peak_bytes=3 << 29,
            memory_capacity_bytes=16 << 30,
            series=[
                OpSeries("all_reduce", "dp", 6, 40 * S, list(buckets)),
                OpSeries("broadcast", "world", 1, S // 100, [0] * 6 + [1] + [0] * 7),
            ],
            inflight=InflightLive("all_reduce", "mesh_dp", "dp", 9, 3 * S) if r == 1 else None,
            storage="writing stopped: ENOSPC" if r == 2 else "",
            ledger_ns=lg,
            ledger_wall_ns=sum(lg.values()),
        )
        write_rank_live(tmp, recs[r])
    return recs


def _prometheus(
    tmp: Path, node: str | None
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    body, _ = metrics_text(LiveCollector(tmp, node))
    out = {}
    for fam in prom.text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


_LABEL = {I.RANK: "rank", I.NODE: "node", I.OP: "op", I.DIM: "dim", I.CAUSE: "cause"}


def _as_prometheus(
    p: Any, inst: I.Instrument
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A received OTLP point as the Prometheus samples it stands for."""
    labels = tuple(sorted((_LABEL[k], str(v)) for k, v in p.attributes.items()))
    if inst.kind is I.Kind.GAUGE:
        return {(inst.prometheus, labels): p.value}
    if inst.kind is I.Kind.COUNTER:
        return {(inst.prometheus + "_total", labels): p.value}
    out = {
        (inst.prometheus + "_count", labels): float(p.count),
        (inst.prometheus + "_sum", labels): p.sum,
    }
    cum = np.cumsum(p.bucket_counts).tolist()
    for bound, c in zip([*p.bounds, float("inf")], cum, strict=True):
        le = "+Inf" if bound == float("inf") else repr(float(bound))
        out[(inst.prometheus + "_bucket", tuple(sorted((*labels, ("le", le)))))] = float(c)
    return out


@pytest.mark.parametrize("node", ["a", None])
def test_otlp_metrics_are_the_prometheus_set_with_otel_names(
    tmp_path: Path, node: str | None
) -> None:
    recs = _records(tmp_path)
    reader = FigureReader(tmp_path, node, started_ns=time.time_ns())
    snap = reader.read()
    job = JobIdentity(run_id="r1", world_size=3, layout="dp=3,tp=1,pp=1", node_id="a")
    with HttpReceiver() as rx:
        exp = metric_exporter(SignalTarget("metrics", "http/protobuf", rx.url + "/v1/metrics"))
        assert exp.export(metrics_data(snap, job_resource(job), scope())).name == "SUCCESS"
        exp.shutdown()
    got = points(rx.got)
    by_name = {i.name: i for i in I.ALL}
    sent: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for p in got:
        inst = by_name[p.name]
        assert p.unit == inst.unit and set(p.attributes) <= set(inst.attributes), p.name
        assert p.kind == {"gauge": "gauge", "counter": "sum", "histogram": "histogram"}[inst.kind]
        rec = recs[p.attributes[I.RANK]]
        assert p.time_ns == rec.updated_ns  # the figure's own time
        if p.kind in ("sum", "histogram"):
            assert p.start_ns == rec.started_ns and p.temporality == 2  # cumulative
            assert p.kind == "histogram" or p.monotonic
        sent.update(_as_prometheus(p, inst))
    expected = _prometheus(tmp_path, node)
    assert set(sent) == set(expected)
    for k, v in expected.items():
        assert sent[k] == pytest.approx(v, rel=1e-12, abs=1e-12), k
    # and against the records (independent of either exporter's arithmetic)
    ranks = {0, 1} if node == "a" else {0, 1, 2}
    assert {p.attributes[I.RANK] for p in got} == ranks
    step = {p.attributes[I.RANK]: p.value for p in got if p.name == "meshprof.step.duration"}
    assert step == {r: 0.04 for r in ranks}
    inflight = {p.attributes[I.RANK]: p.value for p in got if p.name == I.INFLIGHT_AGE.name}
    assert inflight[1] == 3.0 and inflight[0] == 0.0
    hist = [
        p for p in got if p.name == "meshprof.collective.duration" and p.attributes[I.RANK] == 0
    ]
    ar = next(p for p in hist if p.attributes[I.OP] == "all_reduce")
    assert ar.bounds == HIST_BOUNDS_S and ar.bucket_counts[3] == 2 and ar.count == 6
    assert ar.sum == 40.0
    # the resource names the job
    res = got[0].resource
    assert res["meshprof.run.id"] == "r1" and res["meshprof.run.world_size"] == 3
    assert res["meshprof.run.layout"] == "dp=3,tp=1,pp=1" and res["host.name"]
    assert res["service.name"] == "meshprof"


def test_resource_takes_the_users_variables_over_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "team=ml,meshprof.run.id=mine")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "trainer")
    attrs = dict(job_resource(JobIdentity(run_id="r1")).attributes)
    assert attrs["service.name"] == "trainer" and attrs["team"] == "ml"
    assert attrs["meshprof.run.id"] == "mine"


def _hist(inst: I.Instrument, values: list[float]) -> HistogramFigure:
    """A histogram of ``values`` with the instrument's bounds, counted here with numpy (an
    upper bound is inclusive, as OpenTelemetry's explicit buckets are)."""
    idx = np.searchsorted(np.array(inst.buckets), values, side="left")
    counts = np.bincount(idx, minlength=len(inst.buckets) + 1)
    return HistogramFigure(inst.buckets, tuple(int(c) for c in counts), float(sum(values)))


def test_genai_server_histograms_over_grpc() -> None:
    ttft = [0.004, 0.03, 0.03, 0.2, 12.0]
    tpot = [0.02, 0.02, 0.09]
    e2e_ok, e2e_err = [0.5, 1.5, 3.0], [0.05]
    now = time.time_ns()
    sv = ServingFigures(
        rank=0,
        operation="text_completion",
        provider="meshprof",
        model="tiny-llama",
        started_ns=now - 10 * S,
        updated_ns=now,
        time_to_first_token=_hist(I.TIME_TO_FIRST_TOKEN, ttft),
        time_per_output_token=_hist(I.TIME_PER_OUTPUT_TOKEN, tpot),
        request_duration={
            "": _hist(I.REQUEST_DURATION, e2e_ok),
            "timeout": _hist(I.REQUEST_DURATION, e2e_err),
        },
    )
    snap = ExportSnapshot(now, (), {}, now, serving=(sv,))
    with GrpcReceiver() as rx:
        exp = metric_exporter(SignalTarget("metrics", "grpc", rx.url))
        assert (
            exp.export(metrics_data(snap, job_resource(JobIdentity(run_id="r")), scope())).name
            == "SUCCESS"
        )
        exp.shutdown()
    got = {(p.name, p.attributes.get("error.type", "")): p for p in points(rx.got)}
    assert set(got) == {
        ("gen_ai.server.time_to_first_token", ""),
        ("gen_ai.server.time_per_output_token", ""),
        ("gen_ai.server.request.duration", ""),
        ("gen_ai.server.request.duration", "timeout"),
    }
    for (name, err), p in got.items():
        inst = next(i for i in I.GENAI_SERVER if i.name == name)
        values = {
            "gen_ai.server.time_to_first_token": ttft,
            "gen_ai.server.time_per_output_token": tpot,
            "gen_ai.server.request.duration": e2e_err if err else e2e_ok,
        }[name]
        assert p.unit == "s" and p.bounds == inst.buckets and p.count == len(values)
        assert p.sum == pytest.approx(sum(values))
        assert len(p.bucket_counts) == len(inst.buckets) + 1
        assert (p.start_ns, p.time_ns) == (now - 10 * S, now)
        assert p.attributes["gen_ai.operation.name"] == "text_completion"
        assert p.attributes["gen_ai.request.model"] == "tiny-llama"
    # 12 s is past the last TTFT bound (10 s): the overflow bucket
    assert got[("gen_ai.server.time_to_first_token", "")].bucket_counts[-1] == 1


def test_a_request_span_under_the_genai_conventions_and_its_callers_trace() -> None:
    from meshprof.live.otel.exporters import span_exporter
    from meshprof.live.otel.request_spans import RequestRecord, parse_traceparent, request_span
    from meshprof.live.otel.spans import SpanContextInfo
    from otlp_receiver import spans

    caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert parse_traceparent(caller) == (0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, 1)
    for bad in ("", "00-" + "0" * 32 + "-00f067aa0ba902b7-01", "ff-" + caller[3:], "garbage"):
        assert parse_traceparent(bad) is None
    t0 = time.time_ns()
    # arrival t0; scheduled +5 ms; first token +40 ms; 11 tokens, last at +540 ms
    ok = RequestRecord(
        request_id="req-1", rank=0, arrival_ns=t0, scheduled_ns=t0 + 5_000_000,
        first_token_ns=t0 + 40_000_000, end_ns=t0 + 540_000_000, prompt_tokens=128,
        output_tokens=11, finish_reason="length", model="tiny-llama", traceparent=caller,
    )  # fmt: skip
    failed = RequestRecord(
        request_id="req-2", rank=1, arrival_ns=t0, end_ns=t0 + 9_000_000, finish_reason="error",
        error_type="timeout", model="tiny-llama",
    )  # fmt: skip
    info = SpanContextInfo("run-r", job_resource(JobIdentity(run_id="run-r")), scope())
    with HttpReceiver() as rx:
        exp = span_exporter(SignalTarget("traces", "http/protobuf", rx.url + "/v1/traces"))
        assert exp.export([request_span(ok, info), request_span(failed, info)]).name == "SUCCESS"
        exp.shutdown()
    a, b = spans(rx.got)
    # the caller's trace, under its span
    assert a.trace_id == caller[3:35] and a.parent_id == caller[36:52]
    assert a.name == "text_completion tiny-llama" and (a.start_ns, a.end_ns) == (
        t0,
        t0 + 540_000_000,
    )
    at = a.attributes
    assert (
        at["gen_ai.operation.name"] == "text_completion"
        and at["gen_ai.request.model"] == "tiny-llama"
    )
    assert at["gen_ai.usage.input_tokens"] == 128 and at["gen_ai.usage.output_tokens"] == 11
    assert (
        at["gen_ai.response.finish_reasons"] == ("length",) and at["gen_ai.response.id"] == "req-1"
    )
    assert at["meshprof.request.time_to_first_token"] == pytest.approx(0.040)
    assert at["meshprof.request.time_per_output_token"] == pytest.approx((0.540 - 0.040) / 10)
    assert at["meshprof.request.queue_time"] == pytest.approx(0.005)
    # no caller: a trace of its own; a failure is an error with its type
    assert b.parent_id == "" and b.status == 2 and b.attributes["error.type"] == "timeout"
    assert "meshprof.request.time_to_first_token" not in b.attributes

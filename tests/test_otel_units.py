"""The OpenTelemetry exporter's parts without processes: the instruments' definitions (the
GenAI conventions' names, units and buckets; OpenTelemetry naming), the settings as the SDK
reads the environment, the bounded sending queue, the segment tail, the step model against
hand-built timelines, and the step sampling."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from meshprof.errors import MeshprofError
from meshprof.events import EVENT_DTYPE, MEMORY_DTYPE, OP_CODES, SPAN_DTYPE
from meshprof.live.otel import instruments as I
from meshprof.live.otel.export_worker import EXPORT_FAILED, NOT_SENT, QUEUE_FULL, ExportWorker
from meshprof.live.otel.settings import resolve_settings
from meshprof.live.otel.steps import (
    CollectiveSummary,
    RankStep,
    RankTables,
    join_arrivals,
    rank_step,
)
from meshprof.live.otel.trace_sampling import StepBook, TraceSampling
from meshprof.records.rank_meta import GroupRecord
from meshprof.rundir.segment_tail import RankTail, read_json_lines
from meshprof.rundir.segments import (
    BATCH_DTYPE,
    KIND_BATCH,
    batch_payload,
    chunk,
    header_chunk,
    new_header,
    segment_name,
)

# -- instruments ---------------------------------------------------------------------------------


def test_genai_instruments_are_the_conventions() -> None:
    """Names, units, bucket bounds and attributes of the GenAI server metrics, as the
    OpenTelemetry GenAI semantic conventions define them (gen-ai-metrics.md)."""
    by = {i.name: i for i in I.GENAI_SERVER}
    assert set(by) == {
        "gen_ai.server.time_to_first_token",
        "gen_ai.server.time_per_output_token",
        "gen_ai.server.request.duration",
    }
    assert all(i.kind is I.Kind.HISTOGRAM and i.unit == "s" for i in by.values())
    assert by["gen_ai.server.time_to_first_token"].buckets == (
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    )  # fmt: skip
    assert by["gen_ai.server.time_per_output_token"].buckets == (
        0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
    )  # fmt: skip
    assert by["gen_ai.server.request.duration"].buckets == (
        0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
    )  # fmt: skip
    for i in by.values():
        assert {"gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model"} <= set(
            i.attributes
        )
    assert "error.type" in by["gen_ai.server.request.duration"].attributes


def test_instruments_follow_opentelemetry_naming() -> None:
    names = [i.name for i in I.ALL]
    assert len(names) == len(set(names))
    for i in I.ALL:
        # dotted lower-case namespaces, no unit in the name, no _total
        assert re.fullmatch(r"[a-z_]+(\.[a-z_]+)+", i.name), i.name
        assert not i.name.endswith(("_total", ".total", "_seconds", "_bytes", "_ratio")), i.name
        assert i.unit in {"s", "By", "1"} or re.fullmatch(r"\{[a-z]+\}(/s)?", i.unit), i.unit
        assert list(i.buckets) == sorted(i.buckets) and (i.kind is I.Kind.HISTOGRAM) == bool(
            i.buckets
        )
        # bounded attributes only: never a group's name, a step or a request id
        assert set(i.attributes) <= {
            I.RANK, I.NODE, I.OP, I.DIM, I.CAUSE, I.ALERT_KIND, I.ALERT_SEVERITY, I.SIGNAL,
            I.DROP_REASON, I.GENAI_OPERATION, I.GENAI_PROVIDER, I.GENAI_MODEL, I.ERROR_TYPE,
        }  # fmt: skip
    # the Prometheus families they carry are all distinct
    prom = [i.prometheus for i in I.TRAINING if i.prometheus]
    assert len(prom) == len(set(prom)) == len(I.TRAINING) - 1  # (alerts: no family)


# -- settings ------------------------------------------------------------------------------------


def test_settings_off_unless_configured_and_as_the_sdk_reads_the_environment() -> None:
    assert resolve_settings(None, None, {}) is None
    assert resolve_settings(None, None, {"OTEL_EXPORTER_OTLP_HEADERS": "a=b"}) is None
    s = resolve_settings(None, None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"})
    assert s is not None and s.traces is not None and s.metrics is not None
    assert (s.traces.endpoint, s.traces.protocol) == ("http://c:4318/v1/traces", "http/protobuf")
    assert s.metrics.endpoint == "http://c:4318/v1/metrics" and s.metric_interval_s == 60.0
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://t:443/custom/path",
        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpc",
        "OTEL_METRIC_EXPORT_INTERVAL": "2500",
    }
    s = resolve_settings(None, None, env)
    assert s is not None and s.traces is not None and s.metrics is not None
    assert s.traces.endpoint == "https://t:443/custom/path"  # a signal's own URL, as it is
    assert (s.metrics.protocol, s.metrics.endpoint) == ("grpc", "http://c:4318")
    assert s.metric_interval_s == 2.5
    # the command line wins over every variable
    s = resolve_settings("http://cli:4317", "grpc", env)
    assert s is not None and s.traces is not None and s.metrics is not None
    assert s.traces.endpoint == s.metrics.endpoint == "http://cli:4317"
    assert s.traces.protocol == s.metrics.protocol == "grpc"
    # a signal off; everything off
    s = resolve_settings("http://c:4318", None, {"OTEL_METRICS_EXPORTER": "none"})
    assert s is not None and s.metrics is None and s.traces is not None
    assert resolve_settings("http://c:4318", None, {"OTEL_SDK_DISABLED": "true"}) is None
    for bad_env, flag in (
        ({}, "ftp://c"),
        ({}, "c:4318"),
        ({}, "http://c:port"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "http://c:4318"),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "http://c:4318"),
        ({"OTEL_METRIC_EXPORT_INTERVAL": "soon"}, "http://c:4318"),
    ):
        with pytest.raises(MeshprofError):
            resolve_settings(flag, None, bad_env)
    with pytest.raises(MeshprofError, match="--otlp-protocol 'udp'"):
        resolve_settings("http://c:4318", "udp", {})


def test_bad_otlp_options_are_one_line_and_exit_code_2(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "s.py"
    script.write_text("pass\n")
    for args, says in (
        (("--otlp-endpoint", "collector:4318"), "--otlp-endpoint 'collector:4318'"),
        (("--otlp-endpoint", "http://c:1", "--otlp-protocol", "thrift"), "--otlp-protocol"),
        (("--otlp-endpoint", "http://c:1", "--otlp-every", "x"), "--otlp-every 'x'"),
        (("--otlp-endpoint", "http://c:1", "--otlp-slow", "0.5"), "--otlp-slow 0.5"),
        (("--otlp-endpoint", "http://c:1", "--live-interval", "0"), "live state"),
    ):
        r = cli("run", "-o", tmp_path / "r", *args, script)
        assert r.returncode == 2, (args, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0] and "Traceback" not in r.stderr, r.stderr
    r = cli("export", tmp_path, "--format", "otlp")
    assert r.returncode == 2 and "needs an endpoint" in r.stderr
    r = cli("export", tmp_path, "--endpoint", "http://c:1")
    assert r.returncode == 2 and "--endpoint is for --format otlp" in r.stderr


def test_without_the_sdk_the_environment_alone_is_a_warning_the_option_an_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from meshprof.commands.run_otlp_options import otlp_settings_from_args
    from meshprof.live.otel import settings as st

    monkeypatch.setattr(st.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")
    args = argparse.Namespace(
        otlp_endpoint=None, otlp_protocol=None, otlp_every="100", otlp_slow="1.5"
    )
    assert otlp_settings_from_args(args) is None
    assert "runs without OTLP export" in capsys.readouterr().err
    args.otlp_endpoint = "http://c:4318"
    s = otlp_settings_from_args(args)
    assert s is not None
    with pytest.raises(MeshprofError, match=r"meshprof\[otel\]"):
        st.check_installed(s)


# -- the sending queue ---------------------------------------------------------------------------


def _wait(pred: object, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_worker_never_blocks_the_offer_drops_and_counts() -> None:
    release = threading.Event()
    entered = threading.Event()
    sent: list[list[int]] = []
    counted: dict[str, int] = {}
    closed = []

    def send(batch: list[int]) -> bool:
        entered.set()
        release.wait(30)
        sent.append(batch)
        return batch[0] != 99

    def count(signal: str, outcome: str, n: int) -> None:
        counted[outcome] = counted.get(outcome, 0) + n

    w = ExportWorker(
        "traces",
        send,
        capacity=4,
        batch=2,
        period_s=0.01,
        on_count=count,
        close=lambda: closed.append(1),
    ).start()
    w.offer([1, 2])
    assert entered.wait(30)  # the worker is inside send(), held there: a backend that hangs
    w.offer([3, 4, 5, 6, 7, 8])  # returns at once; 4 fit, 2 dropped
    assert not release.is_set() and w.queued() == 4 and counted == {QUEUE_FULL: 2}
    release.set()

    def drained() -> bool:
        return w.queued() == 0 and not w.sending

    _wait(drained)
    w.offer([99])  # (a batch the backend refuses)
    _wait(drained)
    w.stop(5.0)
    assert [x for b in sent for x in b] == [1, 2, 3, 4, 5, 6, 99]
    assert counted == {QUEUE_FULL: 2, "exported": 6, EXPORT_FAILED: 1} and closed == [1]
    w.offer([1])  # after stop: dropped, counted
    assert counted[QUEUE_FULL] == 3


def test_worker_stop_gives_up_on_a_send_that_never_returns() -> None:
    hold = threading.Event()
    counted: dict[str, int] = {}
    w = ExportWorker(
        "metrics",
        lambda b: hold.wait(60),
        capacity=2,
        batch=1,
        period_s=0.01,
        keep_newest=True,
        size=lambda x: 10,
        on_count=lambda s, o, n: counted.__setitem__(o, counted.get(o, 0) + n),
        close=hold.set,  # closing the exporter ends its retries
    ).start()
    w.offer(["a"])
    _wait(lambda: w.sending)
    w.offer(["b", "c", "d"])  # keep_newest: b goes for d
    w.stop(0.0)  # no time left: "c", "d" are not sent; the blocked send is closed
    assert counted.get(QUEUE_FULL) == 10 and counted.get(NOT_SENT) == 20


# -- the segment tail ----------------------------------------------------------------------------


def _batch(step: int, events: np.ndarray, spans: np.ndarray) -> bytes:
    b = np.zeros(1, BATCH_DTYPE)
    b[0] = (0, 0, 0, step, len(events), len(spans), 0, 0, 0, 0)
    return chunk(KIND_BATCH, batch_payload(b, events, spans, np.zeros(0, MEMORY_DTYPE), b""))


def test_tail_reads_what_is_appended_whole_chunks_only_and_follows_a_restart(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "rank00001"
    folder.mkdir()
    ev = np.zeros(3, EVENT_DTYPE)
    ev["seq"] = [0, 1, 2]
    sp = np.zeros(1, SPAN_DTYPE)
    sp["step"] = 0
    head = header_chunk(new_header(1, 1, 1, 123, "run", 0))
    one, two = _batch(0, ev[:2], sp), _batch(1, ev[2:], sp[:0])
    seg = folder / segment_name(1, 1)
    tail = RankTail(folder)
    assert tail.poll() == []  # no file yet
    seg.write_bytes(head + one[:20])  # a batch still being written
    assert tail.poll() == []
    with open(seg, "ab") as f:
        f.write(one[20:] + two[:7])
    got = tail.poll()
    assert len(got) == 1 and got[0].events["seq"].tolist() == [0, 1] and len(got[0].spans) == 1
    with open(seg, "ab") as f:
        f.write(two[7:])
    got = tail.poll()
    assert len(got) == 1 and got[0].events["seq"].tolist() == [2]
    assert tail.poll() == [] and not tail.counters.problems
    # a second segment; then a restart of the rank (generation 2) is followed from its start
    (folder / segment_name(1, 2)).write_bytes(
        header_chunk(new_header(1, 1, 2, 123, "run", 0)) + one
    )
    assert [b.events["seq"].tolist() for b in tail.poll()] == [[0, 1]]
    (folder / segment_name(2, 1)).write_bytes(
        header_chunk(new_header(1, 2, 1, 124, "run", 0)) + two
    )
    assert [b.events["seq"].tolist() for b in tail.poll()] == [[2]] and tail.generation == 2
    # a damaged file ends its reading, named
    (folder / segment_name(2, 2)).write_bytes(b"XX" + head[2:])
    assert tail.poll() == [] and "damaged" in tail.counters.problems[-1]


def test_json_lines_are_read_as_they_are_appended(tmp_path: Path) -> None:
    p = tmp_path / "alerts.jsonl"
    p.write_text('{"a": 1}\n{"b": 2')
    lines, off = read_json_lines(p, 0)
    assert lines == [{"a": 1}]
    with open(p, "a") as f:
        f.write("}\nnot json\n[1]\n")
    lines, off = read_json_lines(p, off)
    assert lines == [{"b": 2}] and read_json_lines(p, off) == ([], off)


# -- the step model ------------------------------------------------------------------------------


def _tables(rank: int) -> RankTables:
    return RankTables(
        rank=rank,
        host=f"h{rank}",
        span_names=("step", "forward", "backward", "allreduce"),
        groups=(GroupRecord(name="7", desc="mesh_dp", ranks=[0, 1]),),
        offset_ns=1_000_000 * rank,
        layout="dp=2,tp=1,pp=1",
    )


def _span(kind: int, depth: int, name: int, start: int, dur: int, cpu: int = -1) -> tuple:
    return (kind, 0, depth, name, 4, start, dur, 16, 2, cpu)


def _ev(seq: int, start: int, dur: int, peer: int = -1) -> tuple:
    return (OP_CODES["all_reduce"], 0, 0, 0, 0, peer, seq, 64, 64, start, dur, 4)


def test_a_rank_step_from_its_rows_against_a_hand_built_timeline() -> None:
    """Step [1000, 2000) with 600 ns of CPU; all_reduces [1100, 1400) and [1300, 1500):
    communication is their union, 400 ns; the thread was blocked 400 ns, so 400 exposed;
    allreduce (depth 2) lies in backward."""
    t = _tables(0)
    step = np.array([_span(0, 0, 0, 1000, 1000, 600)], SPAN_DTYPE)[0]
    phases = np.array(
        [_span(1, 1, 2, 1300, 600), _span(1, 2, 3, 1400, 100), _span(1, 1, 1, 1000, 300)],
        SPAN_DTYPE,
    )
    events = np.array([_ev(5, 1100, 300), _ev(6, 1300, 200), _ev(7, 1950, -1)], EVENT_DTYPE)
    rs = rank_step(step, phases, events, t)
    assert (rs.start_ns, rs.duration_ns, rs.tokens, rs.samples) == (1000, 1000, 16, 2)
    assert [(p.name, p.depth, p.parent) for p in rs.phases] == [
        ("forward", 1, -1),
        ("backward", 1, -1),
        ("allreduce", 2, 1),
    ]
    c = rs.collectives
    assert (c.count, c.comm_ns, c.exposed_ns) == (2, 400, 400)  # (the pending one left out)
    s = c.slowest
    assert s is not None and (s.op, s.group, s.dim, s.seq, s.duration_ns) == (
        "all_reduce", "mesh_dp", "dp", 5, 300,
    )  # fmt: skip
    step_busy = np.array([_span(0, 0, 0, 1000, 1000, 900)], SPAN_DTYPE)[0]
    assert rank_step(step_busy, phases, events, t).collectives.exposed_ns == 100
    # rank 1 (its clock 1 ms behind: offset +1 ms) issued seq 5 250 ns after rank 0 did
    t1 = _tables(1)
    step1 = np.array([_span(0, 0, 0, 1000 - 1_000_000, 1000, 900)], SPAN_DTYPE)[0]
    ev1 = np.array([_ev(5, 1350 - 1_000_000, 50)], EVENT_DTYPE)
    r1 = rank_step(step1, phases[:0], ev1, t1)
    assert r1.start_ns == 1000 and r1.collectives.slowest.start_ns == 1350  # type: ignore[union-attr]
    joined = join_arrivals([rs, r1])
    s0 = joined[0].collectives.slowest
    assert s0 is not None and (s0.last_arrival_rank, s0.arrival_skew_ns, s0.members_seen) == (
        1, 250, 2,
    )  # fmt: skip
    s1 = joined[1].collectives.slowest
    assert s1 is not None and s1.last_arrival_rank == 1 and s1.arrival_skew_ns == 250


# -- sampling ------------------------------------------------------------------------------------


def _rs(rank: int, step: int, dur: int) -> RankStep:
    return RankStep(rank, step, "h", step * 10_000, dur, collectives=CollectiveSummary())


def test_sampling_every_slow_alert_and_late_ranks() -> None:
    book = StepBook(TraceSampling(every=5, slow=1.5, around_alert=1, hold_s=10, min_history=8))
    for s in range(12):
        for r in (0, 1):
            book.add(_rs(r, s, 3000 if (s == 9 and r == 1) else 1000), now=float(s))
    assert book.due(now=5.0) == []  # held: nothing older than 10 s
    book.force(2, 2, "capture")
    assert book.step_at(7 * 10_000 + 500) == 7 and book.step_at(7 * 10_000 + 5000) == 7
    assert book.step_at(10**9) is None and book.step_at(10**9, final=True) == 12
    k = 1
    book.force(7 - k, 7 + k, "alert")
    out = book.due(now=100.0)
    sent = {j.step: j.reasons for j, first in out}
    assert sent == {
        0: ("every",),
        2: ("capture",),
        5: ("every",),
        6: ("alert",),
        7: ("alert",),
        8: ("alert",),
        9: ("slow",),  # rank 1: 3× its median
        10: ("every",),
    }
    assert all(first and len(j.ranks) == 2 for j, first in out)
    assert book.decided(3) == () and book.decided(9) == ("slow",)
    # a rank that reports step 9 late follows the decision at once (not its root again)
    book.add(_rs(2, 9, 1000), now=101.0)
    book.add(_rs(2, 3, 1000), now=101.0)
    late = book.due(now=101.0)
    assert [(j.step, [r.rank for r in j.ranks], first) for j, first in late] == [(9, [2], False)]
    # the hold is bounded: beyond max_held_steps the oldest are decided at once
    small = StepBook(TraceSampling(every=1, max_held_steps=3))
    for s in range(5):
        small.add(_rs(0, s, 1000), now=0.0)
    assert [j.step for j, _ in small.due(now=0.0)] == [0, 1]

"""A request's W3C ``traceparent`` (``RequestMonitor.begin(..., traceparent=...)``): parsed as
OpenTelemetry's own propagator parses it, stored in the serving chunks next to its request's
row, read back by the loader and the live tail, and older run directories still load.

Truth: OpenTelemetry's ``TraceContextTextMapPropagator.extract`` for what is a valid header; the
headers this file makes up (their ids, read here with ``int(..., 16)``) for what is stored; a
serving chunk written byte by byte here in the layout of earlier versions for the old format."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import meshprof
from meshprof.events import REQUEST_DTYPE, REQUEST_TRACE_DTYPE, TOKEN_DTYPE
from meshprof.monitor.request_monitor import RequestMonitor
from meshprof.records.trace_context import parse_traceparent
from meshprof.rundir import load_run, segments
from meshprof.rundir.segment_tail import RankTail
from meshprof.rundir.serving_rows import ServingRows
from meshprof.rundir.writer import RankWriter

CALLER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _otel(header: str) -> tuple[int, int, int] | None:
    """What OpenTelemetry's W3C propagator extracts from ``header`` (None: no parent)."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    ctx = TraceContextTextMapPropagator().extract({"traceparent": header})
    sc = trace.get_current_span(ctx).get_span_context()
    return (sc.trace_id, sc.span_id, int(sc.trace_flags)) if sc.is_valid else None


VALID = CALLER[3:]
HEADERS = [
    CALLER,
    "00-" + VALID[:-2] + "00",  # not sampled
    "01-" + VALID + "-future-field",  # a later version may append fields
    " \t" + CALLER + " ",  # (whitespace around it)
    "00-" + VALID + "-more",  # version 00 has exactly four fields
    "ff-" + VALID,  # version ff is invalid
    "00-" + "0" * 32 + "-00f067aa0ba902b7-01",  # all-zero trace id
    "00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01",  # all-zero span id
    CALLER.upper(),  # upper-case hex is invalid
    "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  # a digit short
    "0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
    "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
    "",
    "garbage",
    CALLER + "\n",
    "01-" + VALID + "-" + "x" * 600,  # too long
]


def test_the_parse_agrees_with_opentelemetrys_propagator() -> None:
    pytest.importorskip("opentelemetry.trace")
    for h in HEADERS:
        assert parse_traceparent(h) == _otel(h), h
    assert parse_traceparent(CALLER) == (0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, 1)


@settings(max_examples=300, deadline=None)
@given(
    st.tuples(
        st.sampled_from(["00", "01", "ff", "0a", "zz"]),
        st.text("0123456789abcdefABCDEF", min_size=31, max_size=33),
        st.text("0123456789abcdef0", min_size=15, max_size=17),
        st.sampled_from(["00", "01", "ff", "1"]),
        st.sampled_from(["", "-x", " ", "\t-"]),
    )
)
def test_the_parse_agrees_with_opentelemetry_on_near_misses(
    parts: tuple[str, str, str, str, str],
) -> None:
    pytest.importorskip("opentelemetry.trace")
    v, t, s, f, tail = parts
    h = f"{v}-{t}-{s}-{f}{tail}"
    assert parse_traceparent(h) == _otel(h), h


def test_a_bad_traceparent_never_raises_and_sets_nothing() -> None:
    rm = RequestMonitor()
    sr = ServingRows()
    sr.monitor = rm
    bad = ["garbage", b"00-" + VALID.encode(), 42, CALLER.upper(), "x" * 10_000, object()]
    for k, header in enumerate(bad):
        rid = rm.begin(1, traceparent=header)  # type: ignore[arg-type]
        rm.token(rid)
        if k < 5:
            rm.finish(rid)  # (the last one still running at the final write)
    assert rm.traceparents == 6 and rm.finished == 5 and len(rm.trace_rows) == 5
    got = sr.payload(True)
    assert got is not None and got[1] == 6
    assert len(segments.decode_serving(memoryview(got[0])).traces) == 0
    assert sr.invalid_traceparents == 6
    from meshprof.records.rank_meta import RankMeta

    sv = sr.counted(RankMeta()).serving
    assert sv is not None and (sv.traceparents, sv.invalid_traceparents) == (6, 6)


def _made_up(k: int) -> tuple[str, int, int, int]:
    """A header with ids made from ``k`` (trace id above 2**127: both halves used)."""
    tid = (0xF0 + k) << 120 | (k + 1)
    sid = 0x8000_0000_0000_0000 | k
    flags = k % 2
    return f"00-{tid:032x}-{sid:016x}-{flags:02x}", tid, sid, flags


def test_traceparents_are_stored_with_their_requests_and_loaded(tmp_path: Path) -> None:
    prof = meshprof.enable()
    rm = meshprof.requests()
    want: dict[tuple[int, int], tuple[int, int, int]] = {}
    for k in range(6):
        header, tid, sid, flags = _made_up(k)
        rid = rm.begin(3, traceparent=header if k != 2 else None, arrival_ns=1000 + k)
        if k != 2:
            want[(rid, 1000 + k)] = (tid, sid, flags)
        if k < 5:  # the last one is still running at the write
            rm.token(rid)
            rm.finish(rid)
    # an id used again (after the first finished) with another caller
    header, tid, sid, flags = _made_up(9)
    again = rm.begin(2, request_id=0, traceparent=header, arrival_ns=2000)
    rm.finish(again)
    want[(0, 2000)] = (tid, sid, flags)
    w = RankWriter(tmp_path, prof, None, rank=0, tick_s=0)
    w.write(final=True)
    rd = load_run(tmp_path).ranks[0]
    assert len(rd.requests) == 7 and rd.request_traces.dtype == REQUEST_TRACE_DTYPE
    got = {
        (rid, arrival): ((hi << 64) | lo, span, flags)
        for rid, arrival, hi, lo, span, flags in rd.request_traces.tolist()
    }
    assert got == want
    sv = rd.meta.serving
    assert sv is not None and (sv.traceparents, sv.invalid_traceparents) == (6, 0)
    # every trace row has its request in the rows
    keys = set(zip(rd.requests["id"].tolist(), rd.requests["arrival_ns"].tolist(), strict=True))
    assert set(got) <= keys


def test_a_trace_row_read_a_tick_early_is_written_with_its_request() -> None:
    """The monitor appends a trace row just before its request row and a tick reads request
    rows first: a finish between the two reads leaves the trace row a tick ahead."""
    rm = RequestMonitor()
    sr = ServingRows()
    sr.monitor = rm
    rid = rm.begin(1, traceparent=CALLER, arrival_ns=5)
    rm.token(rid)
    # the serving thread appended the trace row; the request row follows after this tick
    rm._trace_rows.append((rid, 5, CALLER))
    trace_row = (rid, 5, 0x4BF92F3577B34DA6, 0xA3CE929D0E0E4736, 0x00F067AA0BA902B7, 1)
    first = sr.payload(False)
    assert first is not None and segments.decode_serving(memoryview(first[0])).traces.size == 0
    rm._finished_rows.append((rid, 5, 5, -1, 6, 6, 7, 1, 1, 0))
    second = sr.payload(False)
    assert second is not None
    got = segments.decode_serving(memoryview(second[0]))
    assert got.requests["id"].tolist() == [rid] and got.traces.tolist() == [trace_row]


def _old_serving_chunk(requests: np.ndarray, tokens: np.ndarray) -> bytes:
    """A serving chunk as earlier versions wrote it: head "<II", request rows, token rows."""
    return (
        struct.pack("<II", len(requests), len(tokens))
        + requests.astype(REQUEST_DTYPE).tobytes()
        + tokens.astype(TOKEN_DTYPE).tobytes()
    )


def test_a_serving_chunk_of_an_earlier_version_decodes_unchanged() -> None:
    reqs = np.zeros(3, REQUEST_DTYPE)
    reqs["id"] = [4, 5, 6]
    toks = np.zeros(2, TOKEN_DTYPE)
    toks["n"] = [1, 2]
    got = segments.decode_serving(memoryview(_old_serving_chunk(reqs, toks)))
    assert got.requests.tolist() == reqs.tolist() and got.tokens.tolist() == toks.tolist()
    assert got.traces.dtype == REQUEST_TRACE_DTYPE and len(got.traces) == 0
    # without traces, today's chunk is byte for byte the old one
    assert segments.serving_payload(reqs, toks) == _old_serving_chunk(reqs, toks)
    # a traces table cut short is a damaged chunk
    tr = np.zeros(2, REQUEST_TRACE_DTYPE)
    full = segments.serving_payload(reqs, toks, tr)
    for cut in (1, 4, REQUEST_TRACE_DTYPE.itemsize):
        with pytest.raises(ValueError, match="do not add up"):
            segments.decode_serving(memoryview(full[:-cut]))


def test_a_run_written_before_request_traces_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Headers without ``request_traces`` (an earlier version's) are read, their serving chunks
    too; the live tail reads them as well."""
    monkeypatch.setattr(
        segments, "SERVING_DTYPES", {"requests": REQUEST_DTYPE, "tokens": TOKEN_DTYPE}
    )
    prof = meshprof.enable()
    rm = meshprof.requests()
    for k in range(3):
        rid = rm.begin(2, arrival_ns=100 + k)
        rm.token(rid)
        rm.finish(rid, "stop")
    RankWriter(tmp_path, prof, None, rank=0, tick_s=0).write(final=True)
    monkeypatch.undo()
    seg = next(tmp_path.glob("rank*/g*-0*.seg"))
    head = segments.read_chunks(seg).header
    assert head is not None and head.dtypes is not None and "request_traces" not in head.dtypes
    rd = load_run(tmp_path).ranks[0]
    assert rd.requests["arrival_ns"].tolist() == [100, 101, 102] and len(rd.request_traces) == 0
    tail = RankTail(next(tmp_path.glob("rank*")), requests=True)
    tail.poll()
    rows, traces = tail.take_traced_requests()
    assert len(rows) == 3 and len(traces) == 0 and not tail.counters.problems


def test_the_live_tail_hands_the_traces_with_their_requests(tmp_path: Path) -> None:
    prof = meshprof.enable()
    rm = meshprof.requests()
    rid = rm.begin(2, traceparent=CALLER, arrival_ns=50)
    rm.finish(rid)
    other = rm.begin(2, arrival_ns=60)
    rm.finish(other)
    RankWriter(tmp_path, prof, None, rank=0, tick_s=0).write(final=True)
    tail = RankTail(next(tmp_path.glob("rank*")), requests=True)
    tail.poll()
    rows, traces = tail.take_traced_requests()
    assert rows["id"].tolist() == [rid, other]
    assert traces[["id", "arrival_ns", "parent_span", "flags"]].tolist() == [
        (rid, 50, 0x00F067AA0BA902B7, 1)
    ]
    from meshprof.live.otel.request_spans import request_records

    recs = request_records(rows, 0, 0, traces)
    assert [r.traceparent for r in recs] == [CALLER, ""]


def test_the_trace_state_is_bounded_with_the_requests() -> None:
    rm = RequestMonitor(max_inflight=4, max_finished=8)
    for k in range(10):
        rm.begin(1, traceparent=_made_up(k)[0])
    assert rm.forgotten == 6 and len(rm.inflight_traces()) == 4
    for rid in range(6, 10):
        rm.finish(rid)
    for k in range(20):
        rm.finish(rm.begin(1, traceparent=_made_up(k)[0]))
    assert len(rm.trace_rows) == 8 and len(rm.inflight_traces()) == 0

"""The launcher's OTLP agent over a run directory written tick by tick by the real rank writer
(two ranks recorded in this process, no torch.distributed), sent through the SDK's OTLP/HTTP
exporter to a receiver decoding the protocol: which steps are sent and why, the span tree and
its times against the rows the ranks wrote, alerts and captures as events of the step they
happened in (held, or late), the alerts counted as metrics; a dead backend costs a warning and
counted drops, never a wait."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest

from meshprof.api import StepMonitor
from meshprof.comm.recorder import CommProfiler
from meshprof.config import ProfilerConfig
from meshprof.events import OP_CODES, GroupInfo
from meshprof.launch.spawn import free_port
from meshprof.live.otel.agent import OtlpAgent
from meshprof.live.otel.exporters import JobIdentity
from meshprof.live.otel.settings import resolve_settings
from meshprof.live.otel.spans import span_id, trace_id
from meshprof.live.otel.trace_sampling import TraceSampling
from meshprof.records.captures import (
    CapturedStep,
    CaptureRankStatus,
    CaptureRequest,
    CaptureState,
)
from meshprof.records.finding import FindingKind, Severity
from meshprof.records.live import Alert
from meshprof.rundir.captures import capture_dir, trace_name, write_request_copy, write_status
from meshprof.rundir.live import append_alert
from meshprof.rundir.writer import RankWriter
from otlp_receiver import HttpReceiver, points, spans, wait_until

STEPS = 12
RUN_ID = "run-agent"


class Rank:
    """A rank recorded in this process: recorder, step monitor, rank writer ticked by hand."""

    def __init__(self, run_dir: Path, rank: int) -> None:
        self.rank = rank
        self.prof = CommProfiler(ProfilerConfig(max_events=10_000))
        self.mon = StepMonitor(None, profiler=self.prof, rank=rank)
        self.writer = RankWriter(
            run_dir,
            self.prof,
            self.mon,
            interval_s=0,
            rank=rank,
            extra_meta={"node_id": "n0", "world_size": 2},
        )  # type: ignore[arg-type]
        self.g = self.prof.log.group_index(GroupInfo("0", "default_pg", (0, 1), "gloo"))
        self.seq = 0
        self.issued: dict[int, list[tuple[int, int, int]]] = {}
        """step -> (seq, start, duration) of the all_reduces it issued."""

    def step(self, i: int, dur_ns: int) -> None:
        with self.mon.step(tokens=32), self.mon.phase("forward"):
            start = time.time_ns()
            dt = self.prof.log.dtype_code("float32")
            self.prof.log.append(
                (
                    OP_CODES["all_reduce"],
                    0,
                    dt,
                    0,
                    self.g,
                    -1,
                    self.seq,
                    64,
                    64,
                    start,
                    dur_ns,
                    i,
                    None,
                    None,
                )
            )
            self.issued.setdefault(i, []).append((self.seq, start, dur_ns))
            self.seq += 1


@pytest.fixture
def job(tmp_path: Path) -> tuple[Path, list[Rank]]:
    ranks = [Rank(tmp_path, r) for r in (0, 1)]
    for i in range(STEPS):
        for rk in ranks:
            rk.step(i, 1000 + 10 * i + 5 * rk.rank)
    for rk in ranks:
        rk.writer.tick()
    return tmp_path, ranks


def _agent(run_dir: Path, url: str, shutdown_s: float = 5.0, **kw: Any) -> OtlpAgent:
    env = {"OTEL_METRIC_EXPORT_INTERVAL": "100000"}
    sampling = TraceSampling(every=5, slow=0, around_alert=1, hold_s=10)
    settings = resolve_settings(url, "http/protobuf", env, sampling)
    assert settings is not None
    return OtlpAgent(
        run_dir,
        settings,
        JobIdentity(run_id=RUN_ID, world_size=2, node_id="n0"),
        node_id="n0",
        **kw,
    )


def replace_settings(agent: OtlpAgent, **kw: Any) -> None:
    agent.settings = dataclasses.replace(agent.settings, **kw)


def _alert(t_ns: int, kind: FindingKind = FindingKind.STRAGGLER) -> Alert:
    return Alert(
        kind=kind,
        severity=Severity.WARNING,
        title="rank 1 is a straggler",
        ranks=(1,),
        t_ns=t_ns,
        value=0.5,
        threshold=0.2,
        unit="ratio",
        since_step=5,
    )


def _capture(run_dir: Path, span: tuple[int, int]) -> str:
    req = CaptureRequest(
        id="cap1", ranks=(1, 0), steps=1, trigger="straggler", requested_ns=span[0] - 10
    )
    write_request_copy(run_dir, req)
    for r in (1, 0):
        (capture_dir(run_dir, "cap1") / trace_name(r)).write_bytes(b"{}")
        write_status(
            run_dir,
            CaptureRankStatus(
                id="cap1",
                rank=r,
                state=CaptureState.DONE,
                updated_ns=span[1],
                start_step=2,
                steps=(CapturedStep(2, span[0], span[1]),),
                trace=trace_name(r),
            ),
        )
    return "cap1"


def test_steps_alerts_and_captures_as_traces(job: tuple[Path, list[Rank]]) -> None:
    run_dir, ranks = job
    lines: list[str] = []

    class Lines:
        def write(self, s: str) -> None:
            lines.extend(x for x in s.splitlines() if x)

        def flush(self) -> None:
            pass

    with HttpReceiver() as rx:
        agent = _agent(run_dir, rx.url, stream=Lines())  # type: ignore[arg-type]
        agent.start(thread=False)  # (the test polls by hand)
        agent.poll(now=0.0)
        assert agent.book.steps_seen == 0  # a closed step waits 1 s for late completions
        agent.poll(now=2.0)
        assert spans(rx.got) == [] and agent.book.steps_seen == 2 * STEPS  # held for hold_s
        # an alert raised while step 7 ran (rank 0's step 7 window), and a capture of step 2
        rows = {
            r: {int(s[4]): (int(s[5]), int(s[6])) for s in rk.mon.span_rows if s[0] == 0}
            for r, rk in enumerate(ranks)
        }
        t7 = rows[0][7][0] + rows[0][7][1] // 2
        append_alert(run_dir, _alert(t7))
        s2 = rows[1][2]
        _capture(run_dir, (s2[0], s2[0] + s2[1]))
        agent.poll(now=3.0)  # reads both (the captures at its scan)
        agent.poll(now=30.0)  # decided: hold_s passed
        got = wait_until(lambda: len(spans(rx.got)) >= 21 and spans(rx.got))
        # a late alert during step 5 (sent: its root has gone) and one during step 3 (not sent)
        t5 = rows[0][5][0] + 10
        t3 = rows[0][3][0] + 10
        append_alert(run_dir, _alert(t5, FindingKind.STEP_REGRESSION))
        append_alert(run_dir, _alert(t3, FindingKind.STEP_REGRESSION))
        agent.poll(now=31.0)
        agent.stop()
    got = spans(rx.got)
    roots = {s.attributes["meshprof.step"]: s for s in got if s.name == "step"}
    # every 5th step, the capture's step, the alert's step and one on each side
    assert {s: r.attributes["meshprof.sampled"] for s, r in roots.items()} == {
        0: ("every",),
        2: ("capture",),
        5: ("every",),
        6: ("alert",),
        7: ("alert",),
        8: ("alert",),
        10: ("every",),
    }
    by_id = {s.span_id: s for s in got}
    for step, root in roots.items():
        assert root.trace_id == f"{trace_id(RUN_ID, step):032x}" and root.parent_id == ""
        kids = [s for s in got if s.parent_id == root.span_id and s.name == "rank step"]
        assert sorted(k.attributes["meshprof.rank"] for k in kids) == [0, 1]
        for k in kids:
            r = k.attributes["meshprof.rank"]
            start, dur = rows[r][step]  # the row the rank wrote (same host: offset 0)
            assert (k.start_ns, k.end_ns) == (start, start + dur)
            assert k.span_id == f"{span_id(RUN_ID, step, r):016x}"
            assert k.attributes["meshprof.collectives.count"] == 1
            seq, _t, d = ranks[r].issued[step][0]
            assert k.attributes["meshprof.collectives.slowest.seq"] == seq
            assert k.attributes["meshprof.collectives.slowest.duration"] == d / 1e9
            phases = [s for s in got if s.parent_id == k.span_id]
            assert [p.name for p in phases] == ["forward"]
            assert k.start_ns <= phases[0].start_ns <= phases[0].end_ns <= k.end_ns
        assert root.start_ns == min(k.start_ns for k in kids)
        assert root.end_ns == max(k.end_ns for k in kids)
    # the alert is an event of step 7's root at its time; the capture of step 2's
    ((name, t, a),) = roots[7].events
    assert name == "meshprof.alert" and t == t7
    assert a["meshprof.alert.kind"] == "straggler" and a["meshprof.alert.ranks"] == (1,)
    assert a["meshprof.alert.value"] == 0.5 and a["meshprof.alert.unit"] == "ratio"
    ((name, t, c),) = roots[2].events
    assert name == "meshprof.capture" and t == s2[0] and c["meshprof.capture.state"] == "complete"
    assert c["meshprof.capture.ranks"] == (1, 0) and c["meshprof.capture.trigger"] == "straggler"
    assert set(c["meshprof.capture.traces"]) == {trace_name(0), trace_name(1)}
    # late alerts: a span of their own in their step's trace (under the root when it was sent)
    late = {s.attributes["meshprof.step"]: s for s in got if s.name == "alert"}
    assert set(late) == {5, 3}
    assert late[5].parent_id == roots[5].span_id and late[5].trace_id == roots[5].trace_id
    assert late[5].events[0][1] == t5 and late[3].trace_id == f"{trace_id(RUN_ID, 3):032x}"
    assert late[3].parent_id == ""  # (step 3 was not sent: no root to hang under)
    assert all(by_id.get(s.parent_id) is not None for s in got if s.parent_id and s.name != "alert")
    # the alerts counted (the final metrics export), and what was sent
    pts = points(rx.got)
    alerts = {
        (p.attributes["meshprof.alert.kind"]): p.value for p in pts if p.name == "meshprof.alerts"
    }
    assert alerts == {"straggler": 1, "step_regression": 2}
    assert lines == [f"meshprof run: OTLP: {agent.summary()}"] and "dropped" not in lines[0]
    assert agent.counts.exported["traces"] == len(got)


def test_a_dead_backend_is_one_warning_and_counted_drops(job: tuple[Path, list[Rank]]) -> None:
    run_dir, _ = job
    lines: list[str] = []

    class Lines:
        def write(self, s: str) -> None:
            lines.extend(x for x in s.splitlines() if x)

        def flush(self) -> None:
            pass

    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    agent = _agent(run_dir, dead, stream=Lines())  # type: ignore[arg-type]
    replace_settings(agent, shutdown_s=0.5)
    agent.start(thread=False)
    agent.poll(now=0.0)
    agent.poll(now=2.0)
    agent.poll(now=30.0)  # spans handed to the worker: the poll never waits for their sending
    assert agent.spans is not None and (agent.spans.queued() or agent.spans.sending)
    agent.stop()
    failed = {k: v for k, v in agent.counts.dropped.items()}
    assert sum(failed.values()) > 0 and not agent.counts.exported.get("traces")
    warnings = [x for x in lines if "warning" in x]
    assert len(warnings) <= 2 and all("the job goes on" in w for w in warnings)
    assert lines[-1].startswith("meshprof run: OTLP: sent 0 spans") and "dropped" in lines[-1]

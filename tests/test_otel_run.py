"""OpenTelemetry end to end: real 2-rank jobs under ``meshprof run --otlp-endpoint`` sending to
OTLP receivers in this process (HTTP and gRPC, decoded with ``opentelemetry-proto``), and
``meshprof export --format otlp`` of the finished run.

Truths: the script's own ``time.time_ns()`` brackets of every step and phase and its count of
collectives (tests/scripts/otel_job.py); a sleep injected on rank 1 before one all_reduce (the
rank that arrives last, and by how much); the report's own cross-rank matching (the last
arrival, computed by other code than the exporter's); an injected straggler for the alert; the
variables an OpenTelemetry user sets (service name, resource attributes, headers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from meshprof.analyze.run.events.clock import exchange_estimate
from meshprof.launch.spawn import free_port
from meshprof.live.otel.spans import trace_id
from meshprof.rundir import load_run
from meshprof.rundir.live import read_alerts
from otlp_receiver import GrpcReceiver, HttpReceiver, SpanView, latest, points, spans, wait_until

SCRIPTS = Path(__file__).parent / "scripts"
STEPS, BASE_S, DELAY_STEP, DELAY_S = 16, 0.01, 11, 0.25
PHASES = ["forward", "backward", "allreduce", "optimizer"]
MS = 1_000_000


def _cli(
    *args: Any, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "meshprof.cli",
            *(os.fspath(a) if isinstance(a, Path) else str(a) for a in args),
        ],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@dataclass
class LiveRun:
    run: Path
    out: Path
    result: subprocess.CompletedProcess[str]
    spans: list[SpanView]
    points: list[Any]
    headers: list[dict[str, str]]
    truth: dict[int, dict[str, Any]]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> LiveRun:
    out = tmp_path_factory.mktemp("otel")
    env = {
        "OTEL_METRIC_EXPORT_INTERVAL": "500",
        "OTEL_SERVICE_NAME": "trainer",
        "OTEL_RESOURCE_ATTRIBUTES": "team=ml,deployment.environment=test",
        "OTEL_EXPORTER_OTLP_HEADERS": "x-api-key=secret",
    }
    with HttpReceiver() as rx:
        res = _cli(
            "run", "--nproc-per-node", "2", "-o", out / "run", "--live-interval", "0.25",
            "--otlp-endpoint", rx.url, "--otlp-every", "4", "--no-summary",
            SCRIPTS / "otel_job.py", STEPS, BASE_S, DELAY_STEP, 1, DELAY_S, out,
            env=env,
        )  # fmt: skip
    assert res.returncode == 0, res.stderr
    truth = {r: json.loads((out / f"truth{r}.json").read_text()) for r in (0, 1)}
    return LiveRun(out / "run", out, res, spans(rx.got), points(rx.got), rx.got.headers, truth)


def _offset(run: Path, rank: int) -> int:
    meta = load_run(run).ranks[rank].meta
    est = exchange_estimate(meta.clock_sync)
    return est[0] if est is not None else 0


def _check_against_script(
    got: list[SpanView], truth: dict[int, dict[str, Any]], offsets: dict[int, int], steps: set[int]
) -> None:
    """Each rank's step and phase spans lie in the script's own brackets (their starts up to
    the clock offset meshprof applied, their lengths exactly inside)."""
    for k in (s for s in got if s.name == "rank step"):
        r, step = k.attributes["meshprof.rank"], k.attributes["meshprof.step"]
        if step not in steps:
            continue
        t0, t1 = truth[r]["steps"][str(step)]
        off = offsets[r]
        assert t0 - MS <= k.start_ns - off and k.end_ns - off <= t1 + MS, (r, step)
        assert 0 < k.end_ns - k.start_ns <= t1 - t0
        phases = {p.name: p for p in got if p.parent_id == k.span_id}
        nested = [p for p in got if p.parent_id in {x.span_id for x in phases.values()}]
        assert sorted(phases) == ["backward", "forward", "optimizer"]
        assert [p.name for p in nested] == ["allreduce"]
        assert nested[0].parent_id == phases["backward"].span_id
        for name, key, p0, p1 in truth[r]["phases"][str(step)]:
            p = phases.get(name) or nested[0]
            assert p.name == key
            assert p0 - MS <= p.start_ns - off and p.end_ns - off <= p1 + MS, (r, step, name)
            assert p.end_ns - p.start_ns <= p1 - p0
        assert k.attributes["meshprof.collectives.count"] == 2  # the script's two all_reduces
        assert (
            0
            <= k.attributes["meshprof.collectives.exposed_time"]
            <= k.attributes["meshprof.collectives.time"]
        )
        assert k.attributes["meshprof.collectives.time"] * 1e9 <= k.end_ns - k.start_ns


def test_live_steps_are_sent_as_trees_with_the_scripts_times(live: LiveRun) -> None:
    got = live.spans
    roots = {s.attributes["meshprof.step"]: s for s in got if s.name == "step"}
    # every 4th step, and the step slowed by the injected sleep (and maybe noise: slow ones)
    assert {0, 4, 8, 12} <= set(roots) and "every" in roots[8].attributes["meshprof.sampled"]
    assert "slow" in roots[DELAY_STEP].attributes["meshprof.sampled"]
    for s, root in roots.items():
        assert s % 4 == 0 or "slow" in root.attributes["meshprof.sampled"], s
        kids = [k for k in got if k.parent_id == root.span_id and k.name == "rank step"]
        assert sorted(k.attributes["meshprof.rank"] for k in kids) == [0, 1]
        assert root.trace_id == kids[0].trace_id == kids[1].trace_id
        assert (root.start_ns, root.end_ns) == (
            min(k.start_ns for k in kids),
            max(k.end_ns for k in kids),
        )
    offsets = {r: _offset(live.run, r) for r in (0, 1)}
    _check_against_script(got, live.truth, offsets, set(roots))
    # the injected sleep: rank 0 waited in the all_reduce for rank 1, 0.25 s late
    k0 = next(
        k for k in got
        if k.name == "rank step" and k.attributes["meshprof.step"] == DELAY_STEP and k.attributes["meshprof.rank"] == 0
    )  # fmt: skip
    a = k0.attributes
    assert a["meshprof.collectives.slowest.op"] == "all_reduce"
    assert a["meshprof.collectives.slowest.last_arrival.rank"] == 1
    assert 0.8 * DELAY_S <= a["meshprof.collectives.slowest.arrival_skew"] <= DELAY_S + 0.2
    assert a["meshprof.collectives.slowest.duration"] >= 0.8 * DELAY_S
    assert roots[DELAY_STEP].attributes["meshprof.collectives.slowest.last_arrival.rank"] == 1
    # the resource and headers an OpenTelemetry user sets
    manifest = json.loads((live.run / "manifest.json").read_text())
    res = got[0].resource
    assert res["service.name"] == "trainer" and res["team"] == "ml"
    assert res["meshprof.run.id"] == manifest["run_id"] and res["meshprof.run.world_size"] == 2
    assert all(h.get("x-api-key") == "secret" for h in live.headers)
    assert roots[12].trace_id == f"{trace_id(manifest['run_id'], 12):032x}"
    lines = [x for x in live.result.stderr.splitlines() if "OTLP" in x]
    assert (
        len(lines) == 1
        and lines[0].startswith("meshprof run: OTLP: sent ")
        and "dropped" not in lines[0]
    )


def test_live_metrics_end_at_the_scripts_counts(live: LiveRun) -> None:
    last = latest(live.points)
    by = {}
    for (name, attrs), p in last.items():
        by.setdefault(name, {})[attrs] = p
    steps = {dict(a)["meshprof.rank"]: p.value for a, p in by["meshprof.steps"].items()}
    assert steps == {0: STEPS, 1: STEPS}
    ar = {
        dict(a)["meshprof.rank"]: p.value
        for a, p in by["meshprof.collectives"].items()
        if dict(a)["meshprof.op"] == "all_reduce"
    }
    assert ar == {r: live.truth[r]["all_reduce"] for r in (0, 1)}
    assert all(p.unit == "{step}" and p.monotonic for p in by["meshprof.steps"].values())
    hist = [
        p
        for a, p in by["meshprof.collective.duration"].items()
        if dict(a)["meshprof.op"] == "all_reduce"
    ]
    assert sorted(p.count for p in hist) == sorted(ar.values()) and all(p.unit == "s" for p in hist)
    assert all(p.value == 0 for p in by["meshprof.collective.inflight.age"].values())
    sent = {
        dict(a)["meshprof.otel.signal"]: p.value for a, p in by["meshprof.otel.exported"].items()
    }
    assert sent["metrics"] > 0  # (what it had sent when it read the last figures)


def test_post_mortem_export_over_grpc(live: LiveRun) -> None:
    with GrpcReceiver() as rx:
        res = _cli(
            "export",
            live.run,
            "--format",
            "otlp",
            "--endpoint",
            rx.url,
            "--protocol",
            "grpc",
            "--json",
        )
        assert res.returncode == 0, res.stderr
        info = json.loads(res.stdout)
    got = spans(rx.got)
    assert info["steps"] == STEPS and info["rank_steps"] == 2 * STEPS and info["failed_spans"] == 0
    assert len(got) == info["spans"] == 1 + STEPS * (1 + 2 * (1 + len(PHASES)))
    roots = {s.attributes["meshprof.step"]: s for s in got if s.name == "step"}
    assert set(roots) == set(range(STEPS)) and all(
        r.attributes["meshprof.sampled"] == ("all",) for r in roots.values()
    )
    # the same trace ids as the live export: one trace per step wherever it was sent from
    live_roots = {s.attributes["meshprof.step"]: s for s in live.spans if s.name == "step"}
    for s, r in live_roots.items():
        assert roots[s].trace_id == r.trace_id and roots[s].span_id == r.span_id
    # times: the run's own rows on the report's aligned clock, exactly; and the script's brackets
    from meshprof.report.executor import run_stages
    from meshprof.report.stages import REPORT_STAGES
    from meshprof.report.stages.matching import CLOCK, MATCH, TABLE

    run = load_run(live.run)
    st = run_stages(run, REPORT_STAGES, only=(TABLE.name, CLOCK.name, MATCH.name))
    offsets = st[CLOCK.name].offsets()
    for k in (s for s in got if s.name == "rank step"):
        r, step = k.attributes["meshprof.rank"], k.attributes["meshprof.step"]
        sp = run.ranks[r].spans
        row = sp[(sp["kind"] == 0) & (sp["step"] == step)][0]
        assert k.start_ns == int(row["start_ns"]) + offsets[r]
        assert k.end_ns - k.start_ns == int(row["duration_ns"])
    _check_against_script(got, live.truth, offsets, set(range(STEPS)))
    # the last arrival of the delayed all_reduce, as the report's matching has it
    k0 = next(
        k for k in got
        if k.name == "rank step" and k.attributes["meshprof.step"] == DELAY_STEP and k.attributes["meshprof.rank"] == 0
    )  # fmt: skip
    a = k0.attributes
    table, match = st[TABLE.name], st[MATCH.name]
    gid = next(
        i
        for i, g in enumerate(table.groups)
        if (g.desc or g.name) == a["meshprof.collectives.slowest.group"]
    )
    i = next(
        i
        for i in range(len(match))
        if match.gid[i] == gid and match.seq[i] == a["meshprof.collectives.slowest.seq"]
    )
    assert a["meshprof.collectives.slowest.last_arrival.rank"] == int(match.last_rank[i]) == 1
    skew = (int(match.last_arrival_ns[i]) - int(match.first_arrival_ns[i])) / 1e9
    assert a["meshprof.collectives.slowest.arrival_skew"] == pytest.approx(skew, abs=1e-6)
    # the findings ride on the run span
    (run_span,) = [s for s in got if s.name == "run"]
    assert len(run_span.events) == info["findings"] > 0
    assert run_span.start_ns == min(r.start_ns for r in roots.values())
    assert all(e[0] in ("meshprof.finding", "meshprof.verdict") for e in run_span.events)


def test_a_dead_endpoint_costs_the_job_nothing_but_a_warning(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    res = _cli(
        "run", "--nproc-per-node", "2", "-o", tmp_path / "run", "--otlp-endpoint", dead,
        "--otlp-every", "1", "--no-summary", SCRIPTS / "otel_job.py", 4, BASE_S, -1, 1, 0, tmp_path,
        env={"OTEL_METRIC_EXPORT_INTERVAL": "500"},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert all((tmp_path / f"truth{r}.json").exists() for r in (0, 1))  # the job ran to its end
    otlp = [x for x in res.stderr.splitlines() if "OTLP" in x]
    warnings = [x for x in otlp if "warning" in x]
    assert 1 <= len(warnings) <= 2 and all("the job goes on" in w for w in warnings), otlp
    assert otlp[-1].startswith("meshprof run: OTLP: sent 0 spans") and "dropped" in otlp[-1]
    assert "Traceback" not in res.stderr
    assert len(load_run(tmp_path / "run").ranks) == 2


@pytest.mark.slow
def test_a_straggler_alert_is_an_event_of_its_step_over_grpc(tmp_path: Path) -> None:
    out, stop = tmp_path / "run", tmp_path / "stop"
    with GrpcReceiver() as rx:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "meshprof.cli", "run", "--nproc-per-node", "2", "-o", out,
                "--live-interval", "0.5", "--alert-straggler-looks", "3", "--otlp-endpoint", rx.url,
                "--otlp-protocol", "grpc", "--otlp-every", "0", "--otlp-slow", "0", "--no-summary",
                str(SCRIPTS / "live_slowdown_job.py"), "2000", "0.03", "0.06", "1", "40", str(stop),
            ],
            env={**os.environ, "OTEL_METRIC_EXPORT_INTERVAL": "1000"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            alert = wait_until(
                lambda: next((a for a in read_alerts(out) if a.kind == "straggler"), None), 240
            )
        finally:
            stop.write_text("")
            _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        got = spans(rx.got)
        pts = points(rx.got)
    slow_ns = int(Path(f"{stop}.slow").read_text())
    assert alert.ranks == (1,) and alert.t_ns > slow_ns
    roots = {s.attributes["meshprof.step"]: s for s in got if s.name == "step"}
    carrying = [
        (s, e)
        for s in got
        for e in s.events
        if e[0] == "meshprof.alert" and e[2]["meshprof.alert.kind"] == "straggler"
    ]
    assert len(carrying) == 1
    span, (_, t, attrs) = carrying[0]
    assert t == alert.t_ns and attrs["meshprof.alert.ranks"] == (1,)
    assert (
        attrs["meshprof.alert.message"] == alert.message
        and attrs["meshprof.alert.since_step"] == alert.since_step
    )
    step = span.attributes["meshprof.step"]
    # the step it fired in: the alert's time lies in it (on the rank clock meshprof aligned to)
    if span.name == "step":
        assert span.start_ns <= t <= span.end_ns
    # only the steps around alerts were sent (--otlp-every 0 --otlp-slow 0)
    assert all(r.attributes["meshprof.sampled"] == ("alert",) for r in roots.values())
    assert {step - 2, step - 1, step} <= set(roots)
    alerts = {p.attributes["meshprof.alert.kind"] for p in pts if p.name == "meshprof.alerts"}
    assert "straggler" in alerts

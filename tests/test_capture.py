"""Captures and stacks without a job: the comparison on hand-written traces (known self times,
phases, kernels), the rank-side agent in this process (agreed start step, timeout with the
stack, busy, disk budget, a failing profiler, the script ending mid-capture), the choice of
culprit and peer, the launcher's limits, stack clustering, and the commands' bad input."""

from __future__ import annotations

import gzip
import io
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from meshprof.analyze.hang.stacks import cluster_stacks, rank_ranges, snapshot_of
from meshprof.analyze.live.capture_targets import (
    CaptureConfig,
    choose_culprit,
    choose_targets,
    peer_of,
)
from meshprof.analyze.traces.capture_diff import compare_capture, rank_ops
from meshprof.errors import MeshprofError
from meshprof.layout import Layout
from meshprof.records.captures import (
    AlertCapture,
    CapturedPhase,
    CapturedStep,
    CaptureRankStatus,
    CaptureRequest,
    CaptureState,
)
from meshprof.records.finding import FindingKind
from meshprof.records.live import Alert, InflightLive, LiveSnapshot, LiveStraggler, RankLive
from meshprof.records.stacks import RankStacks, StackFrame, StacksRequest, ThreadStack
from meshprof.rundir.captures import (
    capture_dir,
    load_capture,
    read_statuses,
    trace_name,
    write_request_copy,
    write_status,
)
from meshprof.rundir.live import write_rank_live
from meshprof.rundir.requests import read_requests, write_request
from meshprof.rundir.stacks import read_rank_stacks

BASE_NS = 1_700_000_000_000_000_000


# -- hand-written traces ---------------------------------------------------------------------------
def _x(cat: str, name: str, ts: float, dur: float, tid: int = 1, **args: Any) -> dict[str, Any]:
    e: dict[str, Any] = {
        "ph": "X",
        "cat": cat,
        "name": name,
        "ts": ts,
        "dur": dur,
        "pid": 7,
        "tid": tid,
    }
    if args:
        e["args"] = args
    return e


def _step(t0: float, extra_mm: bool, gloo_us: float, gemm_us: float) -> list[dict[str, Any]]:
    """One 10 ms step (µs from t0): zero_grad, forward (linear; the extra matmul on the slow
    rank), backward (an mm and a kernel it launches), an op after backward, the optimizer, a
    collective on gloo's thread and an NCCL kernel."""
    ev = [
        _x("user_annotation", "Optimizer.zero_grad#SGD.zero_grad", t0 + 10, 20),
        _x("cpu_op", "aten::zero_", t0 + 12, 10),
        _x("cpu_op", "aten::linear", t0 + 100, 500),
        _x("cpu_op", "aten::addmm", t0 + 150, 400),
        _x("cpu_op", "autograd::engine::evaluate_function: MmBackward0", t0 + 4000, 1000),
        _x("cpu_op", "MmBackward0", t0 + 4010, 980),
        _x("cpu_op", "aten::mm", t0 + 4020, 900),
        _x("cuda_runtime", "cudaLaunchKernel", t0 + 4030, 5, correlation=int(t0) + 1),
        _x(
            "kernel",
            "void gemm_kernel<float>",
            t0 + 4100,
            gemm_us,
            stream=7,
            correlation=int(t0) + 1,
        ),
        _x("kernel", "ncclDevKernel_AllReduce_Sum_f32", t0 + 5000, 800, stream=9),
        _x("cpu_op", "gloo:all_reduce", t0 + 5000, gloo_us, tid=2),
        _x("cpu_op", "aten::mul_", t0 + 5500, 100),
        _x("user_annotation", "Optimizer.step#SGD.step", t0 + 6000, 300),
        _x("cpu_op", "aten::add_", t0 + 6050, 100),
    ]
    if extra_mm:
        ev += [
            _x("cpu_op", "aten::matmul", t0 + 700, 3000),
            _x("cpu_op", "aten::mm", t0 + 710, 2900),
        ]
    return ev


def _trace(rank: int, slow: bool, steps: int = 2) -> dict[str, Any]:
    events: list[dict[str, Any]] = []
    for s in range(steps):
        t0 = 1000.0 + s * 10_000
        events.append(_x("user_annotation", f"ProfilerStep#{50 + s}", t0, 10_000))
        events += _step(t0, slow, 200 if slow else 3000, 500 if slow else 100)
    return {
        "distributedInfo": {"rank": rank},
        "baseTimeNanoseconds": BASE_NS,
        "traceEvents": events,
    }


def _ns(us: float) -> int:
    return round(us * 1000)


def test_rank_ops_self_time_phases_and_kernels() -> None:
    ro = rank_ops(_trace(0, slow=True), 0)
    assert ro.steps == 2 and ro.step_ns == _ns(10_000)
    got = {(o.kind, o.phase, o.name): (o.ns, o.calls) for o in ro.ops}
    # self time = duration − the events nested in it; per step (two steps, identical)
    assert got[("op", "forward", "aten::mm")] == (_ns(2900), 1.0)
    assert got[("op", "forward", "aten::matmul")] == (_ns(100), 1.0)
    assert got[("op", "forward", "aten::linear")] == (_ns(100), 1.0)
    assert got[("op", "backward", "aten::mm")] == (_ns(895), 1.0)  # less the launch in it
    assert got[("op", "backward", "MmBackward0")] == (_ns(80), 1.0)
    assert got[("op", "optimizer", "aten::zero_")] == (_ns(10), 1.0)
    assert got[("op", "optimizer", "aten::add_")] == (_ns(100), 1.0)
    assert got[("op", "after backward", "aten::mul_")] == (_ns(100), 1.0)
    # a kernel has the phase of the call that launched it; NCCL and gloo are communication
    assert got[("kernel", "backward", "void gemm_kernel<float>")] == (_ns(500), 1.0)
    assert not any("nccl" in k[2] or "gloo" in k[2] for k in got)
    assert ro.comm_ns == _ns(200 + 800)


def test_the_script_s_own_phases_win() -> None:
    t0 = BASE_NS + _ns(1000)
    phases = [
        CapturedPhase("model", 50 + s, t0 + _ns(s * 10_000 + 90), t0 + _ns(s * 10_000 + 3800))
        for s in range(2)
    ]
    ro = rank_ops(_trace(0, slow=True), 0, monitor_phases=phases)
    got = {(o.phase, o.name) for o in ro.ops}
    assert ("model", "aten::mm") in got and ("model", "aten::linear") in got
    assert ("backward", "aten::mm") in got  # outside the marked phases: the trace decides


def _capture(
    tmp_path: Path, traces: dict[int, dict[str, Any]], states: dict[int, CaptureState]
) -> Path:
    req = CaptureRequest(
        id="c1",
        ranks=tuple(states),
        steps=2,
        requested_ns=BASE_NS,
        trigger="straggler",
        reason="why",
    )
    write_request_copy(tmp_path, req)
    for r, state in states.items():
        trace = ""
        if r in traces:
            trace = trace_name(r)
            with gzip.open(capture_dir(tmp_path, "c1") / trace, "wt") as f:
                json.dump(traces[r], f)
        steps = tuple(CapturedStep(50 + s, 0, 0) for s in range(2)) if r in traces else ()
        write_status(
            tmp_path,
            CaptureRankStatus(
                id="c1",
                rank=r,
                state=state,
                updated_ns=BASE_NS,
                trace=trace,
                steps=steps,
                steps_asked=2,
            ),
        )
    return capture_dir(tmp_path, "c1")


def test_compare_names_the_extra_op_on_the_culprit_first(tmp_path: Path) -> None:
    folder = _capture(
        tmp_path,
        {3: _trace(3, True), 1: _trace(1, False)},
        {3: CaptureState.DONE, 1: CaptureState.DONE},
    )
    comp = compare_capture(load_capture(folder))
    assert comp.state == "complete" and comp.ranks == (3, 1) and comp.trigger == "straggler"
    top = comp.differences[0]
    assert (top.name, top.phase, top.a_rank, top.b_rank) == ("aten::mm", "forward", 3, 1)
    assert (top.a_ns, top.b_ns, top.delta_ns) == (_ns(2900), 0, _ns(2900))
    assert (top.a_calls, top.b_calls) == (1.0, 0.0)
    # largest |delta| first; the peer's longer wait in gloo is not a difference
    deltas = [abs(d.delta_ns) for d in comp.differences]
    assert deltas == sorted(deltas, reverse=True)
    assert not any("gloo" in d.name for d in comp.differences)
    kernel = next(d for d in comp.differences if d.kind == "kernel")
    assert (kernel.phase, kernel.delta_ns) == ("backward", _ns(400))
    forward = next(p for p in comp.phases if p.phase == "forward")
    assert forward.delta_ns == _ns(3000)
    assert {b.rank for b in comp.breakdown} == {1, 3}
    assert "aten::mm (forward) +2.90 ms per step" in comp.message


def test_compare_with_a_rank_that_answered_nothing(tmp_path: Path) -> None:
    folder = _capture(tmp_path, {0: _trace(0, False)}, {0: CaptureState.DONE})
    req = CaptureRequest(id="c1", ranks=(1, 0), steps=2, requested_ns=BASE_NS)
    write_request_copy(tmp_path, req)
    comp = compare_capture(load_capture(folder))
    assert comp.state == "partial" and comp.differences == ()
    r1, r0 = comp.rank_results
    assert r1.rank == 1 and r1.state is CaptureState.TIMED_OUT and "no answer" in r1.message
    assert r0.trace and (r0.top[0].name, r0.top[0].phase) == ("aten::mm", "backward")


# -- the agent in this process --------------------------------------------------------------------
class _Host:
    def __init__(self, rank: int = 0) -> None:
        from meshprof.api import StepMonitor

        self.monitor = StepMonitor(track_pipeline=False)
        self._rank = rank

    def rank(self) -> int:
        return self._rank


def _wait(pred: Any, timeout: float = 60.0) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError("timed out")


def _train(host: _Host, until: Any, limit: int = 5000) -> int:
    """Steps of a tiny model until ``until()`` is true; the steps done."""
    import torch

    m = torch.nn.Linear(16, 16)
    x = torch.randn(4, 16)
    n = 0
    while not until() and n < limit:
        with host.monitor.step():
            m(x).sum().backward()
            time.sleep(0.002)
        n += 1
    return n


def _req(tmp_path: Path, **kw: Any) -> CaptureRequest:
    args: dict[str, Any] = {
        "id": f"c{time.monotonic_ns()}",
        "ranks": (0,),
        "steps": 3,
        "requested_ns": time.time_ns(),
        "timeout_s": 60.0,
    }
    args.update(kw)
    return CaptureRequest(**args)


@pytest.fixture
def agent(tmp_path: Path) -> Any:
    from meshprof.session.capture_agent import CaptureAgent

    host = _Host()
    a = CaptureAgent(tmp_path, host, poll_s=0.05).start()
    a.test_host = host  # type: ignore[attr-defined]
    yield a
    a.stop()


def _final(tmp_path: Path, req: CaptureRequest, rank: int = 0) -> Any:
    return lambda: (
        (st := read_statuses(tmp_path, req.id).get(rank)) is not None and st.state.final and st
    )


def test_agent_traces_k_steps_from_the_agreed_step(tmp_path: Path, agent: Any) -> None:
    host = agent.test_host
    assert host.monitor.boundary_hook is None  # idle: nothing per step
    # rank 1 (not in this process) armed at step 30 with 50 ms steps: every agent starts at the
    # highest armed step + 1 + the steps of 1 s at the slowest pace (50 ms: 20 steps)
    req = _req(tmp_path, ranks=(0, 1))
    write_status(
        tmp_path,
        CaptureRankStatus(
            id=req.id,
            rank=1,
            state=CaptureState.ARMED,
            updated_ns=time.time_ns(),
            armed_step=30,
            step_ns=50_000_000,
        ),
    )
    write_request_copy(tmp_path, req)
    write_request(tmp_path, req)
    done = _final(tmp_path, req)
    _train(host, done)
    st = done()
    assert st.state is CaptureState.DONE, st.message
    start = max(30, st.armed_step) + 1 + 20
    assert st.start_step == start and [s.step for s in st.steps] == [start, start + 1, start + 2]
    assert st.cost.start_ns > 0 and st.cost.stop_ns > 0 and st.trace_bytes > 0
    assert host.monitor.boundary_hook is None
    trace = json.loads(gzip.decompress((capture_dir(tmp_path, req.id) / st.trace).read_bytes()))
    marks = sorted(
        e["name"]
        for e in trace["traceEvents"]
        if str(e.get("name", "")).startswith("ProfilerStep#")
    )
    assert marks == [f"ProfilerStep#{s}" for s in (start, start + 1, start + 2)]
    assert any(e.get("name") == "aten::addmm" for e in trace["traceEvents"])


def test_agent_times_out_with_the_stack_of_a_rank_that_does_not_step(
    tmp_path: Path, agent: Any
) -> None:
    req = _req(tmp_path, timeout_s=0.5)
    write_request(tmp_path, req)

    def a_step_that_never_ends() -> Any:
        return _wait(_final(tmp_path, req), 30.0)

    st = a_step_that_never_ends()
    assert st.state is CaptureState.TIMED_OUT and "within 0.5 s" in st.message
    main = st.where.main
    assert main is not None and any(f.function == "a_step_that_never_ends" for f in main.frames)
    assert agent.test_host.monitor.boundary_hook is None
    assert agent._active is None  # the next request is served


def test_agent_busy_disk_budget_and_a_failing_profiler(
    tmp_path: Path, agent: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = agent.test_host
    first = _req(tmp_path, timeout_s=30.0)
    write_request(tmp_path, first)
    _wait(lambda: read_statuses(tmp_path, first.id).get(0))
    second = _req(tmp_path)
    write_request(tmp_path, second)
    st = _wait(_final(tmp_path, second))
    assert st.state is CaptureState.SKIPPED and first.id in st.message
    _train(host, _final(tmp_path, first))
    # the disk budget: spent before, or the trace would pass it
    spent = _req(tmp_path, max_bytes=1)
    write_request(tmp_path, spent)
    st = _wait(_final(tmp_path, spent))
    assert st.state is CaptureState.SKIPPED and "spent" in st.message
    tight = _req(
        tmp_path, max_bytes=sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file()) + 3000
    )
    write_request(tmp_path, tight)
    _train(host, _final(tmp_path, tight))
    st = _final(tmp_path, tight)()
    assert st.state is CaptureState.SKIPPED and "not kept" in st.message and not st.trace
    assert not list(capture_dir(tmp_path, tight.id).glob("*.gz"))
    # torch.profiler failing at the boundary never reaches training
    import torch.autograd.profiler

    def broken(*a: Any, **k: Any) -> Any:
        raise RuntimeError("no profiler today")

    monkeypatch.setattr(torch.autograd.profiler, "profile", broken)
    bad = _req(tmp_path)
    write_request(tmp_path, bad)
    steps = _train(host, _final(tmp_path, bad))
    st = _final(tmp_path, bad)()
    assert st.state is CaptureState.FAILED and "no profiler today" in st.message
    assert host.monitor.boundary_hook is None and steps > 0
    assert _train(host, lambda: False, limit=3) == 3  # training goes on


def test_a_rank_already_profiling_answers_failed_and_its_profiler_is_untouched(
    tmp_path: Path, agent: Any
) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    host = agent.test_host
    mine = profile(activities=[ProfilerActivity.CPU])
    mine.start()
    try:
        req = _req(tmp_path)
        write_request(tmp_path, req)
        _train(host, _final(tmp_path, req))
        st = _final(tmp_path, req)()
        assert st.state is CaptureState.FAILED and "already running" in st.message
        torch.mm(torch.randn(8, 8), torch.randn(8, 8))
    finally:
        mine.stop()
    assert any(e.key == "aten::mm" for e in mine.key_averages())  # the script's session is whole


def test_the_script_ending_mid_capture_writes_what_was_traced(tmp_path: Path) -> None:
    from meshprof.session.capture_agent import CaptureAgent

    host = _Host()
    agent = CaptureAgent(tmp_path, host, poll_s=0.05).start()
    req = _req(tmp_path, steps=20)
    write_request(tmp_path, req)
    _train(
        host,
        lambda: (
            (st := read_statuses(tmp_path, req.id).get(0))
            and len(st.steps) >= 0
            and st.state is CaptureState.TRACING
        ),
    )
    _train(host, lambda: False, limit=2)
    agent.stop()  # the script ends (atexit, on the training thread)
    st = read_statuses(tmp_path, req.id)[0]
    assert st.state is CaptureState.DONE and 1 <= len(st.steps) < 20
    assert "the script ended first" in st.message and st.trace


def test_agent_answers_stacks(tmp_path: Path, agent: Any) -> None:
    req = StacksRequest(id="s1", requested_ns=time.time_ns())
    write_request(tmp_path, req)
    got = _wait(lambda: read_rank_stacks(tmp_path, "s1"))
    st = got[0]
    assert st.rank == 0 and st.main is not None and st.threads[0].main
    assert any(t.name == "meshprof-capture" for t in st.threads)
    assert read_requests(tmp_path)  # the asker removes it, not the rank


# -- culprit and peer -------------------------------------------------------------------------------
def _rec(r: int, **kw: Any) -> RankLive:
    return RankLive(rank=r, updated_ns=time.time_ns(), interval_s=1.0, **kw)


def _snap(
    recs: list[RankLive], stragglers: list[LiveStraggler] = (), stale: list[int] = ()
) -> LiveSnapshot:  # type: ignore[assignment]
    return LiveSnapshot(
        time.time_ns(),
        {x.rank: x for x in recs},
        list(stale),
        list(stragglers),
        [],
        False,
        len(recs),
    )


def test_peer_has_the_same_role_in_another_replica() -> None:
    lay = Layout(dp=2, tp=2, pp=2)  # rank = dp·4 + tp·2 + pp
    assert peer_of(7, lay, 8)[0] == 3  # (1, 1, 1) -> (0, 1, 1)
    peer, why = peer_of(7, lay, 8, avoid=[3])
    assert peer == 5 and "tensor-parallel neighbour" in why  # no healthy replica: (1, 0, 1)
    assert "rank 3 is named by the alert or is a live straggler" in why  # which, and why
    peer, why = peer_of(7, lay, 8, avoid=[3, 5])
    assert peer == 6 and "pipeline neighbour" in why and "rank 3 is named" in why
    assert peer_of(2, Layout(dp=4), 4)[0] == 1  # nearest replica, lower first
    assert peer_of(0, None, 1) == (None, "no other rank")
    snap = _snap([_rec(r) for r in range(8)], stale=[3])
    peer, why = peer_of(7, lay, 8, snap=snap)
    assert peer == 5 and "rank 3 stopped publishing" in why  # a stale replica is not healthy


def test_culprits_per_trigger() -> None:
    recs = [_rec(0, compute_ns=10), _rec(1, compute_ns=30), _rec(2, compute_ns=20)]
    strag = [LiveStraggler(1, 30, 15, 15, 1.0)]
    assert choose_culprit("straggler", (1,), _snap(recs, strag))[0] == 1
    assert choose_culprit("step_regression", (0, 1, 2), _snap(recs, strag))[0] == 1
    assert choose_culprit("step_regression", (0, 1, 2), _snap(recs))[0] == 1  # longest compute
    waiting = InflightLive("all_reduce", "g", "dp", 5, 10**9)
    hang = [_rec(0, inflight=waiting), _rec(1), _rec(2, inflight=waiting)]
    r, why = choose_culprit("stall", (0, 1, 2), _snap(hang))
    assert r == 1 and "outside any collective" in why
    r, why = choose_culprit("inflight", (0, 2), _snap(hang))
    assert r == 1 and "not in the collective" in why
    t = choose_targets("stall", (0, 1, 2), _snap(hang), None, 3)
    assert t is not None and t.ranks == (1, 0)  # compared with a rank that waits


def test_capture_config_validates() -> None:
    assert CaptureConfig(on=("straggler", "slow-step", "hang")).kinds == {
        "straggler",
        "step_regression",
        "throughput_drop",
        "stall",
        "inflight",
        "stale",
    }
    for bad in (
        {"on": ("slow",)},
        {"steps": 0},
        {"steps": 51},
        {"max_per_hour": 0},
        {"max_bytes": 0},
        {"timeout_s": 0},
    ):
        with pytest.raises(MeshprofError):
            CaptureConfig(**bad)


def test_trigger_rate_disk_and_one_at_a_time(tmp_path: Path) -> None:
    from meshprof.live.capture_trigger import CaptureTrigger

    alert = Alert(kind=FindingKind.STRAGGLER, title="rank 1 is a straggler", t_ns=1, ranks=(1,))
    snap = _snap([_rec(0), _rec(1)])
    trig = CaptureTrigger(
        tmp_path, CaptureConfig(on=("straggler",), max_per_hour=2, max_bytes=1000)
    )
    assert trig.wants(alert)
    assert not trig.wants(Alert(kind=FindingKind.MEMORY, title="m", t_ns=1))
    trig.started.extend([100.0, 200.0])
    cap = trig.capture(alert, snap, now=300.0)
    assert cap.status == "skipped" and "rate limit: 2 capture(s)" in cap.message
    # an hour later those two no longer count; the disk budget is then what stops it
    (tmp_path / "captures" / "old").mkdir(parents=True)
    (tmp_path / "captures" / "old" / "big").write_bytes(b"x" * 1000)
    cap = trig.capture(alert, snap, now=3800.0)
    assert (
        cap.status == "skipped"
        and "disk budget spent: the captures take 1,000 bytes" in cap.message
    )
    assert list(trig.started) == []
    (tmp_path / "captures" / "old" / "big").unlink()
    with trig._busy:
        cap = trig.capture(alert, snap, now=3900.0)
    assert cap.status == "skipped" and cap.message == "another capture is running"
    assert trig.skipped == 3


def test_watcher_runs_the_command_after_the_capture_with_it(tmp_path: Path) -> None:
    from meshprof.analyze.live.alert_config import AlertConfig
    from meshprof.live.watch import AlertWatcher

    out = tmp_path / "cmd.jsonl"

    class Stub:
        def wants(self, alert: Alert) -> bool:
            return alert.kind == "straggler"

        def capture(self, alert: Alert, snap: LiveSnapshot) -> AlertCapture:
            return AlertCapture(
                status="complete", message="capture c: rank 1 vs rank 0", id="c", ranks=(1, 0)
            )

    stream = io.StringIO()
    w = AlertWatcher(tmp_path, AlertConfig(command=f"cat >> {out}"), stream=stream, capture=Stub())  # type: ignore[arg-type]
    w.emit(
        Alert(kind=FindingKind.STRAGGLER, title="rank 1 is a straggler", t_ns=1, ranks=(1,)),
        _snap([_rec(0), _rec(1)]),
    )
    w.emit(Alert(kind=FindingKind.MEMORY, title="memory", t_ns=2, ranks=(0,)), _snap([_rec(0)]))
    w.stop()
    sent = {d["kind"]: d for d in map(json.loads, out.read_text().splitlines())}
    assert sent["straggler"]["capture"]["ranks"] == [1, 0]
    assert sent["straggler"]["capture"]["status"] == "complete"
    assert sent["memory"]["capture"] is None
    assert "meshprof capture: capture c: rank 1 vs rank 0" in stream.getvalue()


# -- stacks ---------------------------------------------------------------------------------------
def _frames(*names: str) -> tuple[StackFrame, ...]:
    return tuple(StackFrame(f"/job/{n}.py", i + 1, n) for i, n in enumerate(names))


def test_cluster_stacks_names_the_outliers() -> None:
    waiting = _frames("main", "train_step", "all_reduce")
    c = cluster_stacks(
        {0: waiting, 1: waiting, 2: _frames("main", "next_batch"), 3: waiting, 5: ()}, [4]
    )
    assert [x.ranks for x in c.clusters] == [(0, 1, 3), (2,)]
    assert c.outliers == (2,) and c.missing == (4, 5)
    assert (
        c.lines[0]
        == "ranks 0, 1, 3 in all_reduce (all_reduce.py:3) ← train_step (train_step.py:2) ← main (main.py:1)"
    )
    assert c.lines[1].startswith("rank 2 in next_batch") and c.lines[1].endswith("(outlier)")
    assert c.lines[2] == "ranks 4, 5: no stack"
    even = cluster_stacks({0: waiting, 1: _frames("other")})
    assert even.outliers == ()  # no majority: nobody is the odd one out
    assert rank_ranges([0, 1, 2, 3, 7, 9, 10]) == "ranks 0–3, 7, 9, 10"


def test_stacks_snapshot_and_its_json() -> None:
    from meshprof.records.codec import to_json

    def answer(r: int, frames: tuple[StackFrame, ...]) -> RankStacks:
        return RankStacks(
            id="s", rank=r, taken_ns=1, threads=(ThreadStack(1, "MainThread", True, frames),)
        )

    snap = snapshot_of(
        "s", [0, 1, 2], {0: answer(0, _frames("a")), 1: answer(1, _frames("a"))}, 1.5
    )
    assert snap.clusters.missing == (2,)
    d = json.loads(json.dumps(to_json(snap)))
    assert d["clusters"]["lines"][0].startswith("ranks 0, 1 in a") and d["asked"] == [0, 1, 2]
    assert d["stacks"][0]["threads"][0]["frames"][0]["function"] == "a"


def test_hang_diagnosis_clusters_the_dumps_stacks() -> None:
    from meshprof.analyze.hang.diagnose import diagnose_states
    from meshprof.render.hang import render_hang_text
    from meshprof.rundir.hang_dumps import Collective, Frame, RankState

    inflight = Collective("all_reduce", "g", 3, "float32", 4, 4, "inflight", age_ns=10**9)
    wait = (Frame("/job/train.py", 10, "main"), Frame("/job/train.py", 20, "sync"))
    states = {
        r: RankState(r, "meshprof", "hang", (inflight,), {"g": (0, 1, 2)}, wait, 3) for r in (0, 1)
    }
    states[2] = RankState(
        2,
        "meshprof",
        "peer",
        (),
        {"g": (0, 1, 2)},
        (Frame("/job/train.py", 10, "main"), Frame("/job/data.py", 5, "load")),
        3,
    )
    diag = diagnose_states(states)
    assert diag.stacks is not None and diag.stacks.outliers == (2,)
    text = render_hang_text(diag)
    assert "ranks 0, 1 in sync (train.py:20) ← main (train.py:10)" in text
    assert "rank 2 in load (data.py:5) ← main (train.py:10) (outlier)" in text
    assert diag.to_dict()["stacks"]["outliers"] == [2]


# -- the commands' bad input ------------------------------------------------------------------------
def _live(tmp_path: Path, n: int = 2, status: str = "running") -> Path:
    for r in range(n):
        write_rank_live(
            tmp_path,
            RankLive(
                rank=r, updated_ns=time.time_ns(), interval_s=1.0, world_size=n, status=status
            ),
        )
    return tmp_path


def test_capture_and_stacks_bad_input_is_one_line_and_exit_2(cli: Any, tmp_path: Path) -> None:
    cases = [
        (("capture", tmp_path / "nope"), "no such run directory"),
        (("capture", tmp_path), "no live state"),
        (("stacks", tmp_path), "not a job running under meshprof run"),
        (("capture", tmp_path, "--steps", "0"), "--steps 0: expected 1 to 50"),
        (("capture", tmp_path, "--steps", "x"), "--steps 'x': expected a whole number"),
        (("capture", tmp_path, "--activities", "gpu"), "--activities 'gpu'"),
        (("capture", tmp_path, "--timeout", "-1"), "--timeout '-1'"),
        (("stacks", tmp_path, "--timeout", "0"), "--timeout '0'"),
    ]
    for args, text in cases:
        r = cli(*args)
        assert r.returncode == 2 and text in r.stderr and len(r.stderr.strip().splitlines()) == 1, (
            args,
            r.stderr,
        )
    _live(tmp_path)
    for args, text in [
        (("capture", tmp_path, "--ranks", "2"), "rank 2 is not in the job (ranks 0–1)"),
        (("capture", tmp_path, "--ranks", "0,0"), "a rank is named twice"),
        (("capture", tmp_path, "--ranks", "a"), "--ranks 'a': expected a whole number"),
        (("stacks", tmp_path, "--ranks", "-1"), "rank -1 is not in the job"),
    ]:
        r = cli(*args)
        assert r.returncode == 2 and text in r.stderr, (args, r.stderr)
    _live(tmp_path, status="ended")
    r = cli("capture", tmp_path, "--ranks", "0")
    assert r.returncode == 2 and "the job has ended" in r.stderr


def test_stacks_of_ranks_that_never_answer_exit_2_naming_them(cli: Any, tmp_path: Path) -> None:
    _live(tmp_path)
    t0 = time.monotonic()
    r = cli("stacks", tmp_path, "--timeout", "0.3")
    assert r.returncode == 2 and "no rank answered within 0.3 s" in r.stderr
    assert "ranks 0, 1: no answer within the timeout" in r.stdout
    assert time.monotonic() - t0 < 5
    assert read_requests(tmp_path) == []  # withdrawn


def test_report_stage_reads_every_capture(tmp_path: Path) -> None:
    from meshprof.report.stages.captures import captures

    _capture(
        tmp_path,
        {3: _trace(3, True), 1: _trace(1, False)},
        {3: CaptureState.DONE, 1: CaptureState.DONE},
    )

    class Run:
        path = tmp_path

    (comp,) = captures.compute(Run())
    assert comp.differences[0].name == "aten::mm"
    assert threading.active_count() >= 1

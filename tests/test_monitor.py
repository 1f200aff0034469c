"""Step monitor: known injected costs are measured; rules fire exactly at their thresholds."""

from __future__ import annotations

import time

import numpy as np
import pytest

from meshprof.analyze.compute.pipeline_bubble import pipeline_bubble_theory
from meshprof.analyze.steps import analyze_steps
from meshprof.analyze.steps.rules import (
    BottleneckThresholds,
    rule_data_loading,
    rule_exposed_comm,
    rule_load_imbalance,
    rule_memory,
    rule_memory_imbalance,
    rule_pipeline,
    rule_tp,
)
from meshprof.api import StepMonitor
from meshprof.events import CHUNK_PHASES, EVENT_DTYPE, MEMORY_DTYPE, OP_CODES, SPAN_DTYPE
from meshprof.launch.spawn import run_ranks
from meshprof.layout import Layout, dimension_of


def _busy(seconds: float) -> None:
    t = time.perf_counter()
    while time.perf_counter() - t < seconds:
        pass


def test_phase_with_known_time_is_measured_within_5_percent():
    # the truth is each sleep as the test's own clock saw it around the call (beside other
    # jobs a sleep wakes late: 30 ms once took 32.3 ms), and never under the time asked
    mon = StepMonitor()
    slept: dict[str, list[int]] = {"forward": [], "backward": []}
    for _ in range(3):
        with mon.step(tokens=512, samples=4):
            for name, seconds in (("forward", 0.050), ("backward", 0.030)):
                with mon.phase(name):
                    t0 = time.perf_counter_ns()
                    time.sleep(seconds)
                    slept[name].append(time.perf_counter_ns() - t0)
    a = mon.analysis()
    a.check()
    by = {p.name: p.time.mean_ns for p in a.phases}
    for name, asked in (("forward", 50e6), ("backward", 30e6)):
        assert min(slept[name]) >= asked
        # within 5 % (or 1 ms: the phase's own entry and exit around the test's clock)
        assert by[name] == pytest.approx(sum(slept[name]) / 3, rel=0.05, abs=1e6)
    assert a.steps == 3
    assert a.tokens_per_s == pytest.approx(512 / (a.step_time.mean_ns / 1e9), rel=0.01)
    assert a.memory is not None and a.memory.peak_bytes > 0 and a.memory.capacity_bytes > 0


def test_decorators_and_errors_pass_through():
    mon = StepMonitor()

    @mon.step(tokens=10)
    def train_step(x):
        with mon.phase("forward"):
            if x < 0:
                raise ValueError("boom")
        return x * 2

    assert train_step(3) == 6
    with pytest.raises(ValueError, match="boom"):
        train_step(-1)
    spans, _names = mon.spans_array()
    steps = spans[spans["kind"] == 0]
    assert len(steps) == 2 and list(steps["status"]) == [0, 1]


def test_mark_step_automatic_steps():
    mon = StepMonitor()
    mon.mark_step()
    for _ in range(3):
        time.sleep(0.01)
        mon.mark_step(tokens=5)
    mon.close()
    spans, _ = mon.spans_array()
    steps = spans[spans["kind"] == 0]
    assert len(steps) == 4
    assert all(d >= 9e6 for d in steps["duration_ns"][:3])


def test_dimension_of_group_follows_rank_formula():
    lay = Layout(dp=2, tp=2, pp=2)
    assert lay.coords(3) == (0, 1, 1) and lay.coords(5) == (1, 0, 1) and lay.coords(7) == (1, 1, 1)
    assert dimension_of([0, 1], lay) == "pp"
    assert dimension_of([0, 2], lay) == "tp"
    assert dimension_of([1, 5], lay) == "dp"
    assert dimension_of(list(range(8)), lay) == "world"
    assert dimension_of([0, 3], lay) == "tp+pp"  # a flattened tp × pp group
    assert dimension_of([0, 1], None, "mesh_tp") == "tp"
    # one definition everywhere: the report's and the layout module's agree with the monitor's
    from meshprof.parallel import ParallelConfig, RankMapping

    cfg = ParallelConfig(dp=2, tp=2, pp=2, num_layers=2)
    groups = [[0, 1], [0, 2], [1, 5], list(range(8)), [0, 3], [0, 4, 1, 5], [3], [6, 7]]
    for g in groups:
        want = dimension_of(g, lay)
        assert dimension_of(tuple(g), {"dp": 2, "tp": 2, "pp": 2}) == want
        assert dimension_of(g, RankMapping(cfg, 0)) == want
        assert dimension_of(g, "dp=2,tp=2,pp=2") == want == dimension_of(g, cfg)
    assert dimension_of([0, 4, 1, 5], lay) == "dp+pp"
    assert dimension_of([3], lay) == "other"
    # a layout where one dimension is > 1: the world group is that dimension's
    assert dimension_of([0, 1, 2, 3], Layout(dp=4)) == "dp"
    # no usable layout: the description decides
    assert dimension_of([0, 1], {"dp": "x"}, "dp_shard") == "dp"
    assert dimension_of([0, 9], lay, "default_pg") == "other"


def test_bubble_theory():
    assert pipeline_bubble_theory("gpipe", 4, 8) == pytest.approx(3 / 11)
    assert pipeline_bubble_theory("1F1B", 2, 4) == pytest.approx(1 / 5)
    assert pipeline_bubble_theory("interleaved_1f1b", 4, 8, 2) == pytest.approx(3 / 19)
    assert pipeline_bubble_theory("gpipe", 1, 8) is None


@pytest.mark.parametrize(
    ("rule", "below", "above"),
    [
        (lambda v, th: rule_exposed_comm(v, {"dp": v}, th), 0.30, 0.3001),
        (lambda v, th: rule_memory(v, int(v * 100), 100, th), 0.90, 0.9001),
        (lambda v, th: rule_pipeline(v, 1 - v, 0.2, 2, 4, th), 0.70, 0.6999),
        (lambda v, th: rule_tp(v, th), 0.80, 0.7999),
        (lambda v, th: rule_data_loading(v, th), 0.10, 0.1001),
        (lambda v, th: rule_load_imbalance(v, 1, "forward", th), 0.10, 0.1001),
        (lambda v, th: rule_memory_imbalance(v, 2, th), 0.20, 0.2001),
    ],
)
def test_rules_fire_exactly_past_threshold(rule, below, above):
    th = BottleneckThresholds()
    assert rule(below, th) is None  # at the threshold: not crossed
    b = rule(above, th)
    assert b is not None and b.severity in ("low", "medium", "high", "critical")
    assert b.evidence and b.suggestion


def test_thresholds_are_configurable():
    th = BottleneckThresholds(exposed_comm=0.5)
    assert rule_exposed_comm(0.45, {"tp": 0.45}, th) is None
    assert rule_exposed_comm(0.55, {"tp": 0.55}, th).severity == "low"
    assert rule_exposed_comm(0.9, {"tp": 0.9}, BottleneckThresholds()).severity == "critical"


def _synthetic(step_ns: int, comm_ns: int, cpu_ns: int, data_ns: int = 0):
    """One step [0, step) with a phase 'forward' covering it and one sync all_reduce."""
    spans = np.zeros(2 + (1 if data_ns else 0), dtype=SPAN_DTYPE)
    spans[0] = (0, 0, 0, 0, 0, 1_000, step_ns, 0, 0, cpu_ns)
    spans[1] = (1, 0, 1, 1, 0, 1_000, step_ns - data_ns, 0, 0, cpu_ns)
    if data_ns:
        spans[2] = (1, 0, 1, 2, 0, 1_000 + step_ns - data_ns, data_ns, 0, 0, 0)
    ev = np.zeros(1, dtype=EVENT_DTYPE)
    ev[0]["op"] = OP_CODES["all_reduce"]
    ev[0]["start_ns"] = 2_000
    ev[0]["duration_ns"] = comm_ns
    ev[0]["in_bytes"] = ev[0]["out_bytes"] = 1024
    ev[0]["peer"] = -1
    groups = [{"name": "g", "desc": "", "ranks": [0, 1]}]
    return spans, ["step", "forward", "data"], ev, groups, np.zeros(0, dtype=MEMORY_DTYPE)


def test_exposed_comm_rule_fires_from_analysis_at_threshold():
    lay = Layout(dp=2, tp=1, pp=1)
    # 10 ms step, 4 ms all_reduce during which the thread is blocked (cpu = 6 ms): 40% exposed
    a = analyze_steps(*_synthetic(10_000_000, 4_000_000, 6_000_000), layout=lay)
    a.check()
    assert a.comm_exposed_share == pytest.approx(0.4)
    assert [b.category for b in a.bottlenecks] == ["communication"]
    assert a.dp_efficiency == pytest.approx(0.6)
    # same communication fully hidden behind compute (cpu = wall): nothing exposed, no finding
    a = analyze_steps(*_synthetic(10_000_000, 4_000_000, 10_000_000), layout=lay)
    a.check()
    assert a.comm_exposed_share == 0 and a.comm_total_share == pytest.approx(0.4)
    assert a.comm[0].hidden_ns == pytest.approx(4e6) and a.bottlenecks == []
    # 2.9 ms blocked of 10 ms: just below 30%
    a = analyze_steps(*_synthetic(10_000_000, 4_000_000, 7_100_000), layout=lay)
    a.check()
    assert a.comm_exposed_share == pytest.approx(0.29) and a.bottlenecks == []


def test_data_loading_rule_from_analysis():
    a = analyze_steps(*_synthetic(10_000_000, 0, 10_000_000, data_ns=1_500_000))
    a.check()
    assert a.data_loading_share == pytest.approx(0.15)
    assert [b.category for b in a.bottlenecks] == ["data_loading"]


def test_check_catches_an_inconsistent_analysis():
    import dataclasses

    a = analyze_steps(*_synthetic(10_000_000, 4_000_000, 6_000_000), layout=Layout(dp=2))
    a.check()
    for bad in (
        {"comm_exposed_share": a.comm_total_share + 0.1},
        {"data_loading_share": 1.5},
        {"per_step": []},
        {"bottlenecks": [dataclasses.replace(a.bottlenecks[0], severity="low"), *a.bottlenecks]},
    ):
        with pytest.raises(AssertionError):
            dataclasses.replace(a, **bad).check()


# -- real process groups -----------------------------------------------------------------------


def _exposed_worker(rank, ws):
    import torch
    import torch.distributed as dist

    import meshprof
    from meshprof.api import StepMonitor

    meshprof.enable()
    mon = StepMonitor({"dp": 2})
    t = torch.ones(1024)
    waited = 0  # oracle: wall time this thread spent blocked in collective calls
    desched = 0  # wall − CPU time of the busy compute: the OS ran something else (loaded machine)
    for _ in range(3):
        with mon.step():
            with mon.phase("forward"):
                if rank == 1:
                    time.sleep(0.060)  # rank 0 waits in the sync all_reduce: exposed
                t0 = time.perf_counter_ns()
                dist.all_reduce(t)
                waited += time.perf_counter_ns() - t0
            with mon.phase("backward"):
                if rank == 1:
                    time.sleep(0.040)
                w = dist.all_reduce(t, async_op=True)
                if rank == 0:
                    c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
                    _busy(0.080)  # the all_reduce completes while rank 0 computes: hidden
                    desched += (time.perf_counter_ns() - t0) - (time.thread_time_ns() - c0)
                t0 = time.perf_counter_ns()
                w.wait()
                waited += time.perf_counter_ns() - t0
        dist.barrier()  # start every step together
    a = mon.analysis()
    a.check()
    meshprof.disable()
    return {
        "exposed": a.comm_exposed_share * a.step_time.mean_ns,
        "total": a.comm_total_share * a.step_time.mean_ns,
        "hidden": sum(c.hidden_ns for c in a.comm),
        "waited": waited / 3,
        "desched": max(desched, 0) / 3,
        "dims": [c.dimension for c in a.comm],
        "steps": a.steps,
    }


@pytest.mark.timeout(120)
def test_exposed_vs_hidden_communication_with_injected_waits():
    r0, _ = run_ranks(_exposed_worker, 2, timeout=100)
    assert r0["dims"] == ["dp"]  # the world group of a dp=2 layout
    # rank 0: exposed = the time its thread was blocked in collective calls (measured by the test)
    assert r0["waited"] > 30e6  # rank 1 makes rank 0 wait ~60 ms per step
    # Blocked time is wall − CPU time, so time the OS gave another process during the busy
    # compute (only on a loaded machine) counts as blocked too: it may add up to that much.
    tol = max(0.15 * r0["waited"], 5e6)
    assert r0["waited"] - tol <= r0["exposed"] <= r0["waited"] + r0["desched"] + tol
    # the async all_reduce (~40 ms) ran while rank 0 computed: hidden, not exposed
    assert r0["hidden"] > 25e6 - r0["desched"]
    assert r0["total"] == pytest.approx(r0["exposed"] + r0["hidden"], rel=0.01)


def _pipeline_worker(rank, ws, schedule_name, m):
    import torch
    import torch.distributed as dist
    from torch.distributed import pipelining

    import meshprof
    from meshprof.api import StepMonitor

    busy: list[int] = []  # ns of each chunk's sleep, as this worker's own clock saw it

    def sleep(seconds: float) -> None:
        t = time.perf_counter_ns()
        time.sleep(seconds)
        busy.append(time.perf_counter_ns() - t)

    class Slow(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            # known stage costs: 80 ms forward, 160 ms backward per micro-batch (long enough that
            # the schedule's own ~1 ms per micro-batch stays well inside the tolerance: measured
            # 0.2039-0.2051 in 16 idle runs)
            sleep(0.080)
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            sleep(0.160)
            return g

    class Stage(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            return Slow.apply(self.lin(x))

    torch.manual_seed(0)
    meshprof.enable()
    mod = Stage()
    stage = pipelining.PipelineStage(mod, rank, ws, torch.device("cpu"))
    sched_cls = getattr(pipelining, schedule_name)
    # every rank's schedule needs the loss_fn: without it a stage runs no backward at all
    sched = sched_cls(stage, n_microbatches=m, loss_fn=torch.nn.functional.mse_loss)
    mon = StepMonitor({"dp": 1, "tp": 1, "pp": ws}, schedule=schedule_name, microbatches=m)
    # the truth's busy time: each chunk call of this stage as the test's own clock sees it (a
    # wrapper of the stage object, around meshprof's on its class). The sleeps alone are not
    # it: the stage's own work around them took ~1 ms a chunk on an idle host, 4-12 ms once
    chunk_ns: list[int] = []

    def timed(method):
        def call(*args, **kwargs):
            t = time.perf_counter_ns()
            try:
                return method(*args, **kwargs)
            finally:
                chunk_ns.append(time.perf_counter_ns() - t)

        return call

    for name in CHUNK_PHASES:
        if hasattr(stage, name):
            setattr(stage, name, timed(getattr(stage, name)))
    x = torch.randn(4 * m, 8)
    y = torch.randn(4 * m, 8)
    steps: list[tuple[int, int, int]] = []  # per step: (start, end, busy) ns, the test's clock
    for _ in range(4):
        with mon.step(), mon.phase("forward_backward"):
            busy.clear()
            chunk_ns.clear()
            t0 = time.perf_counter_ns()
            if rank == 0:
                sched.step(x)
            else:
                sched.step(target=y, losses=[])
            steps.append((t0, time.perf_counter_ns(), sum(chunk_ns)))
            # after the first step (which also infers shapes, outside the chunks), every sleep
            # is inside a chunk
            assert len(steps) == 1 or sum(chunk_ns) >= sum(busy), (sum(chunk_ns), sum(busy))
        dist.barrier()
    a = mon.analysis()
    a.check()
    spans, names = mon.spans_array()
    meshprof.disable()
    dims = [c.dimension for c in a.comm]
    return a.pipeline.bubble, a.pipeline.bubble_theory, dims, spans, names, steps


@pytest.mark.timeout(150)
@pytest.mark.parametrize("schedule_name", ["ScheduleGPipe", "Schedule1F1B"])
def test_pipeline_bubble_matches_theory(schedule_name):
    from meshprof.analyze.compute.pipeline_bubble import StageTimeline, measure_pipeline_bubble

    res = run_ranks(_pipeline_worker, 2, args=(schedule_name, 4), timeout=140)
    # the stages' timelines, joined (one machine: one clock), against (p-1)/(m+p-1) = 1/5
    pb = measure_pipeline_bubble(
        [StageTimeline(r, spans, names) for r, (_, _, _, spans, names, _) in enumerate(res)],
        Layout(dp=1, tp=1, pp=2),
        schedule_name,
        4,
        warmup_steps=1,  # the first schedule step also infers shapes
    )
    assert pb is not None and pb.steps == 3
    assert pb.bubble_theory == pytest.approx(1 / 5)
    # the truth, from the workers' own clock (one machine: CLOCK_MONOTONIC): per step after the
    # first, each stage's idle share of the span from the first stage's start to the last
    # one's end, its busy time being its chunk calls as they took (the test's own wrapper)
    truth = []
    for k in range(1, 4):
        lo = min(r[5][k][0] for r in res)
        hi = max(r[5][k][1] for r in res)
        truth += [1 - r[5][k][2] / (hi - lo) for r in res]
    want = sum(truth) / len(truth)
    # 0.015: each chunk call, timed by the test's wrapper around meshprof's, took 0.2-1.8 ms
    # more than meshprof's phase span inside it (an idle 2-vCPU Intel host; the same without the
    # recorder, not explained): ~0.005 more bubble for meshprof idle, 0.0107 once in a loaded CI
    assert pb.bubble == pytest.approx(want, abs=0.015), (pb.bubble, truth)
    # the schedule's bubble is the theory's when the chunks take what they were given: a stall
    # beside other jobs only adds idle time (0.227 seen under the full suite's load)
    assert 0.97 * pb.bubble_theory <= want <= 1.5 * pb.bubble_theory, truth
    for local_bubble, theory, dims, _, _, _ in res:
        assert theory == pytest.approx(1 / 5)
        assert "pp" in dims
        assert (
            0 < local_bubble < 1
        )  # the stage-local view (see meshprof.analyze.compute.pipeline_bubble)


def test_instrumented_steps_are_left_out_of_the_analysis() -> None:
    """Steps meshprof itself slowed (a FLOP counter, a profiler trace) are left out like
    warm-up, unless that would leave none."""
    from meshprof.api import StepMonitor as ApiMonitor

    mon = ApiMonitor()
    for i in range(6):
        if i == 2:
            mon.mark_instrumented(i)
        with mon.step():
            time.sleep(0.05 if i == 2 else 0.005)
    a = mon.analysis()
    assert a.steps == 5 and [r.step for r in a.per_step] == [0, 1, 3, 4, 5]
    assert a.step_time.p95_ns < 30e6
    assert mon.to_meta()["instrumented_steps"] == [2]
    only = ApiMonitor()
    only.mark_instrumented(0)
    with only.step():
        pass
    assert only.analysis().steps == 1  # nothing else to analyse: kept


def test_cuda_memory_samples_read_the_allocator_once_and_never_reset_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On CUDA one read of the allocator's statistics per sample, and the user's peak counter
    (torch.cuda.max_memory_allocated) is never reset."""
    import torch

    from meshprof.monitor import memory_sampler

    reads: list[int] = []

    def stats(dev: int) -> dict:
        reads.append(dev)
        return {
            "allocated_bytes": {"all": {"current": 300, "peak": 900}},
            "reserved_bytes": {"all": {"current": 1024}},
        }

    def forbidden(*a: object, **k: object) -> None:
        raise AssertionError("the user's peak counter was reset")

    class Props:
        total_memory = 80 << 30

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", stats)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: Props())
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", forbidden)
    monkeypatch.setattr(memory_sampler, "_CAPACITY", {})
    row = memory_sampler.sample_memory(7)  # no device given: the current one, CUDA initialized
    assert row[0] == 7 and row[2:5] == (300, 1024, 900) and row[6] == 80 << 30
    assert reads == [3]


def test_pipeline_stages_are_wrapped_when_pipelining_is_imported_later() -> None:
    """A script that imports pipelining after meshprof started (a ``meshprof run`` rank: the
    bootstrap enables meshprof before the script runs) gets its stages wrapped by the import
    hook; the ranks of ``run_ranks`` take the other path (their fork server imported pipelining
    already), so this runs in a fresh interpreter."""
    import json
    import subprocess
    import sys

    code = (
        "import json, sys\n"
        "from meshprof.events import CHUNK_PHASES\n"
        "from meshprof.monitor.pipeline_hooks import install_pipeline_hooks\n"
        "stage = 'torch.distributed.pipelining.stage'\n"
        "print('BEFORE', stage in sys.modules)\n"
        "install_pipeline_hooks(lambda: None)\n"
        "from torch.distributed.pipelining.stage import _PipelineStageBase as B\n"
        "print('WRAPPED', json.dumps([getattr(getattr(B, m), '__meshprof__', False) "
        "for m in CHUNK_PHASES]))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in p.stdout.splitlines())
    assert lines["BEFORE"] == "False"
    wrapped = json.loads(lines["WRAPPED"])
    assert wrapped and all(wrapped), p.stdout

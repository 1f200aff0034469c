"""Advice that fits the job, hours named for its device: gradient advice only where the recording
shows training (``meshprof.analyze.compute.workload``), device-hours as GPU-hours or CPU-hours
(``meshprof.rundir.device_kind``). The end-to-end checks on real jobs are in test_run.py (a TP
inference job under ``meshprof run``); these pin each rule's inputs."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from meshprof.analyze.compute.workload import Workload, job_workload, workload_of
from meshprof.analyze.run.conclusions.verdict import VerdictInputs, verdict
from meshprof.analyze.steps.rules import rule_exposed_comm
from meshprof.config import BottleneckThresholds
from meshprof.records.ledger import LedgerEntry, TimeCause
from meshprof.records.rank_meta import RankMeta
from meshprof.report.analysis import analyze_run
from meshprof.report.stages.ledger import LEDGER
from meshprof.report.stages.stragglers import STRAGGLERS
from meshprof.report.stages.verdict import VERDICT
from meshprof.rundir import device_kind, job_device_kind, load_run

sys.path.insert(0, str(Path(__file__).parent / "data"))
from meshprof_synth import synthetic_run

GOLDEN = Path(__file__).parent / "data" / "ddp_2rank"


@pytest.mark.parametrize(
    ("mode", "phases", "work"),
    [
        ("optimizer", [], Workload.TRAINING),
        ("forward", [], Workload.INFERENCE),
        ("forward", ["backward"], Workload.TRAINING),  # a backward is training, whatever else
        ("user", ["forward", "optimizer"], Workload.TRAINING),
        ("user", ["pp_forward", "pp_backward"], Workload.TRAINING),
        ("user", ["forward", "data"], Workload.UNKNOWN),
        (None, [], Workload.UNKNOWN),
        ("off", [], Workload.UNKNOWN),
    ],
)
def test_what_says_a_rank_trains(mode: str | None, phases: list[str], work: Workload) -> None:
    assert workload_of(mode, phases) is work


def test_a_job_trains_when_any_rank_does() -> None:
    t, i, u = Workload.TRAINING, Workload.INFERENCE, Workload.UNKNOWN
    assert job_workload([i, t, u]) is t
    assert job_workload([i, u]) is i
    assert job_workload([u, u]) is u and job_workload([]) is u


def test_the_exposed_comm_rule_gives_gradient_advice_to_training_only() -> None:
    th = BottleneckThresholds()
    for dim in ("dp", "tp"):
        train = rule_exposed_comm(0.6, {dim: 0.6}, th, Workload.TRAINING)
        infer = rule_exposed_comm(0.6, {dim: 0.6}, th, Workload.INFERENCE)
        unknown = rule_exposed_comm(0.6, {dim: 0.6}, th, Workload.UNKNOWN)
        assert train is not None and infer is not None and unknown is not None
        assert "gradient" not in infer.suggestion and "gradient" not in unknown.suggestion
    assert "gradient" in rule_exposed_comm(0.6, {"dp": 0.6}, th, Workload.TRAINING).suggestion  # type: ignore[union-attr]
    tp = rule_exposed_comm(0.6, {"tp": 0.6}, th, Workload.INFERENCE)
    assert tp is not None and "forward-only" in tp.suggestion


def _with_exposed(led, cause: TimeCause):  # type: ignore[no-untyped-def]
    """The ledger with its exposed communication moved to ``cause`` (the rest unchanged)."""

    def move(e):  # type: ignore[no-untyped-def]
        parts = dict(e.parts)
        parts[cause.value] += parts.pop(TimeCause.EXPOSED_OTHER.value)
        parts[TimeCause.EXPOSED_OTHER.value] = 0
        return dataclasses.replace(e, parts=parts)

    return dataclasses.replace(led, job=move(led.job), ranks=tuple(move(r) for r in led.ranks))


@pytest.mark.parametrize("cause", [TimeCause.EXPOSED_DP, TimeCause.EXPOSED_TP])
def test_the_verdict_gives_gradient_advice_to_training_only(
    tmp_path: Path, cause: TimeCause
) -> None:
    synthetic_run(tmp_path, 2, [0, 0], steps=6, collectives=((4096, 8_000_000),))
    rep = analyze_run(load_run(tmp_path), all_causes=True)
    led = _with_exposed(rep[LEDGER], cause)
    led.check()
    assert isinstance(led.job, LedgerEntry) and led.job.parts[cause.value] > 0
    actions = {}
    for work in Workload:
        v = VerdictInputs(None, led, rep[STRAGGLERS], 2, {}, workload=work, device="CPU")
        (item,) = [x for x in verdict(v, include_small=True) if x.cause == cause.value]
        actions[work] = item.action
    assert ("gradient" in actions[Workload.TRAINING]) is (cause is TimeCause.EXPOSED_DP)
    assert "gradient" not in actions[Workload.INFERENCE]
    assert actions[Workload.INFERENCE] == actions[Workload.UNKNOWN]
    if cause is TimeCause.EXPOSED_TP:
        assert "forward-only" in actions[Workload.INFERENCE]


@pytest.mark.parametrize(
    ("meta", "kind"),
    [
        (RankMeta(device="cuda", backend="nccl"), "GPU"),
        (RankMeta(device="xpu"), "GPU"),
        (RankMeta(device="cpu", backend="gloo"), "CPU"),
        (RankMeta(device="cpu", backend="cpu:gloo,cuda:nccl"), "CPU"),  # the device decides
        (RankMeta(backend="nccl"), "GPU"),  # files of earlier versions: the backend
        (RankMeta(backend="cpu:gloo,cuda:nccl"), "GPU"),
        (RankMeta(backend="gloo"), "CPU"),
        (RankMeta(), "device"),
        (None, "device"),
    ],
)
def test_what_a_rank_computed_on(meta: RankMeta | None, kind: str) -> None:
    assert device_kind(meta) == kind


def test_a_job_is_a_gpu_job_when_any_rank_is() -> None:
    cpu, gpu = RankMeta(device="cpu"), RankMeta(device="cuda")
    assert job_device_kind([cpu, gpu]) == "GPU"
    assert job_device_kind([cpu, cpu]) == "CPU"
    assert job_device_kind([cpu, RankMeta()]) == "device"


def test_the_recorder_says_cuda_once_the_process_initialized_it(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import torch

    from meshprof.comm.reads import compute_device

    assert compute_device() == ("cuda" if torch.cuda.is_initialized() else "cpu")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert compute_device() == "cuda"


def test_a_golden_gloo_run_of_an_earlier_version_counts_cpu_hours(cli) -> None:  # type: ignore[no-untyped-def]
    """tests/data/ddp_2rank was written before the rank file said its device: its gloo backend
    tells (it ran on CPU), and its DDP training keeps its gradient advice."""
    run = load_run(GOLDEN)
    assert all(rd.meta.device is None for rd in run.ranks.values())
    items = analyze_run(run, all_causes=True, device_hour_price=2.0)[VERDICT]
    assert items and {v.device for v in items} == {"CPU"}
    for v in items:
        assert v.device_hours == v.gpu_hours and v.money == pytest.approx(2.0 * v.device_hours)
    dp = next(v for v in items if v.cause == TimeCause.EXPOSED_DP)  # it trained (DDP, SGD)
    assert "gradient" in dp.action
    out = cli("report", GOLDEN, "--all-causes", "--gpu-hour-price", "2")  # the former name
    assert out.returncode == 0 and "CPU-h" in out.stdout and "GPU-h" not in out.stdout
    d = json.loads(cli("report", GOLDEN, "--json", "--all-causes").stdout)
    assert {v["device"] for v in d["verdict"]} == {"CPU"}
    bad = cli("report", GOLDEN, "--device-hour-price", "-1")
    assert bad.returncode == 2 and "--device-hour-price must be >= 0" in bad.stderr

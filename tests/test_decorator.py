"""``@performance_monitor``: the example on 2 gloo ranks writes every file it promises, and the
numbers in them agree with the recorder and with hand-computed FLOPs; the step's return values
and exceptions pass through; broken parts never reach the training step."""

from __future__ import annotations

import gzip
import json
import struct
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import meshprof
from meshprof.analyze.traces.kineto import kineto_breakdown
from meshprof.api import StepMonitor
from meshprof.launch.spawn import run_ranks
from meshprof.rundir import load_run

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
sys.path.insert(0, str(EXAMPLES))

import train_with_decorator as example  # noqa: E402

STEPS = 7  # schedule wait=1 warmup=1 active=2: trace of steps 2-3; FLOPs step 4; comm step 5


def _wandb_history(path: Path) -> list[dict[str, Any]]:
    """History rows of an offline W&B run file (a LevelDB-style log of protobuf Records)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, buf, rows = 7, 32768, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        buf += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST chunk
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(buf)
            buf = b""
            if rec.WhichOneof("record_type") == "history":
                rows.append(
                    {
                        i.key or "/".join(i.nested_key): json.loads(i.value_json)
                        for i in rec.history.item
                    }
                )
    return rows


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    out = tmp_path_factory.mktemp("deco")
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(out), "WANDB_SILENT": "true"}
    res = run_ranks(
        example.main,
        2,
        (str(out), STEPS, {"tensorboard": True, "wandb": True}),
        timeout=150,
        env=env,
    )
    return out, res


@pytest.mark.timeout(200)
def test_return_values_and_no_failures(run: tuple[Path, list[dict[str, Any]]]) -> None:
    _, res = run
    for r in res:
        assert r["failures"] == {}
        assert len(r["losses"]) == STEPS and all(
            isinstance(x, float) and x > 0 for x in r["losses"]
        )


@pytest.mark.timeout(200)
def test_traces_are_gzip_json_and_split(run: tuple[Path, list[dict[str, Any]]]) -> None:
    out, _ = run
    paths = [out / f"trace_rank{r}_step3.json.gz" for r in (0, 1)]
    for p in paths:
        doc = json.loads(gzip.decompress(p.read_bytes()))
        assert len(doc["traceEvents"]) > 10
    b = kineto_breakdown(paths)
    assert [x.rank for x in b] == [0, 1]
    for x in b:
        # steps 2 and 3 each ran a DDP all_reduce and a TP all_reduce
        assert x.comm_events >= 4 and x.comm_ns > 0 and x.compute_ns > 0
        assert x.compute_ns + x.comm_ns + x.other_ns == x.window_ns


@pytest.mark.timeout(200)
def test_comm_log_matches_recorder(run: tuple[Path, list[dict[str, Any]]]) -> None:
    out, res = run
    for rank, name in ((0, "comm_step5.json"), (1, "comm_step5_rank1.json")):
        doc = json.loads((out / name).read_text())
        assert doc["step"] == 5 and doc["rank"] == rank
        assert doc["count"] == len(doc["events"]) == res[rank]["per_step"][5] == 2
        assert doc["total_bytes"] == res[rank]["bytes_per_step"][5]
        where = {(e["op"], e["phase"], e["module"].split(".")[0]) for e in doc["events"]}
        # the row-parallel layer all-reduces its output in forward; DDP reduces grads in backward
        assert ("all_reduce", "forward", "tp") in where
        assert ("all_reduce", "backward", "ddp") in where
        fwd = next(e for e in doc["events"] if e["phase"] == "forward")
        assert fwd["module"] == "tp.2" and fwd["out_bytes"] == 4 * example.BATCH * example.IN
        assert doc["dtensor_comm_counts"]  # CommDebugMode saw the DTensor collective
    text = (out / "comm_debug_step5.txt").read_text()
    assert "tp.2" in text and "CommDebugMode" in text and "\x1b[" not in text


@pytest.mark.timeout(200)
def test_flops_equal_hand_count(run: tuple[Path, list[dict[str, Any]]]) -> None:
    out, _ = run
    doc = json.loads((out / "flops_step4.json").read_text())
    b, i, h, o = example.BATCH, example.IN, example.HIDDEN, example.OUT
    forward = 2 * b * (i * h + h * o)
    # backward: weight grads of both layers, input grad of the second (the input needs none)
    backward = 2 * b * i * h + 2 * (2 * b * h * o)
    assert doc["modules"]["DistributedDataParallel"]["total"] == forward + backward
    assert doc["total_flops"] >= forward + backward


@pytest.mark.timeout(200)
def test_tensorboard_scalars(run: tuple[Path, list[dict[str, Any]]]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, res = run
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"perf/step_time_ms", "perf/comm_share", "perf/tflops", "perf/collectives"} <= tags
    assert any(t.startswith("prof/") for t in tags)
    counts = {e.step: e.value for e in acc.Scalars("perf/collectives")}
    assert counts == {s: float(n) for s, n in res[0]["per_step"].items()}
    # TFLOP/s from step 4 on, from the counted FLOPs and the step time
    assert sorted(e.step for e in acc.Scalars("perf/tflops")) == list(range(4, STEPS))
    share = [e.value for e in acc.Scalars("perf/comm_share")]
    assert all(0.0 < v <= 1.0 for v in share)


@pytest.mark.timeout(200)
def test_wandb_offline_run(run: tuple[Path, list[dict[str, Any]]]) -> None:
    out, _ = run
    files = list((out / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1  # rank 0 only
    rows = _wandb_history(files[0])
    keys = set().union(*rows)
    assert {"perf/step_time_ms", "perf/comm_share", "perf/tflops"} <= keys
    assert sorted(r["_step"] for r in rows if "perf/step_time_ms" in r) == list(range(STEPS))


@pytest.mark.timeout(200)
def test_rank_files_and_report(run: tuple[Path, list[dict[str, Any]]], cli) -> None:
    out, res = run
    loaded = load_run(out)
    assert sorted(loaded.ranks) == [0, 1] and not loaded.problems
    for r, rd in loaded.ranks.items():
        assert int((rd.spans["kind"] == 0).sum()) == STEPS
        assert int((rd.events["step"] == 5).sum()) == res[r]["per_step"][5]
    p = cli("report", out, "--json")
    assert p.returncode == 0
    assert json.loads(p.stdout)


# -- in this process ---------------------------------------------------------------------------


def _mon(tmp_path: Path, **kw: Any) -> Any:
    kw.setdefault("profiler", False)
    return meshprof.performance_monitor(
        None, out_dir=tmp_path, monitor=StepMonitor(), print_fn=lambda s: None, **kw
    )


def test_disabled_returns_the_function() -> None:
    def f(x: int) -> int:
        return x + 1

    assert meshprof.performance_monitor(None, enabled=False)(f) is f


def test_return_values_and_exceptions_pass_through(tmp_path: Path) -> None:
    mon = _mon(tmp_path, profiler=True, wait=0, warmup=0, active=1)
    sentinel = object()
    err = ValueError("boom")

    @mon
    def step(fail: bool) -> object:
        if fail:
            raise err
        return sentinel

    assert step(False) is sentinel
    with pytest.raises(ValueError) as info:
        step(True)
    assert info.value is err
    assert step(False) is sentinel
    mon.close()
    spans, _ = mon.mon.spans_array()
    assert list(spans["status"]) == [0, 1, 0]  # the failing step is recorded as an error
    assert (tmp_path / "trace_rank0_step0.json.gz").exists()
    assert mon.failures == {}


def test_flops_single_linear(tmp_path: Path) -> None:
    b, i, o = 4, 16, 8
    lin = torch.nn.Linear(i, o)
    mon = _mon(tmp_path, flop_counter_step=1)

    @mon
    def step(x: torch.Tensor) -> None:
        lin(x).sum().backward()

    for _ in range(3):
        step(torch.randn(b, i, requires_grad=True))
    mon.close()
    doc = json.loads((tmp_path / "flops_step1.json").read_text())
    # forward 2·B·in·out; backward twice that (input and weight gradients)
    assert doc["total_flops"] == 2 * b * i * o * 3
    assert mon.mon.flops_per_step == doc["total_flops"]
    # the step under the FLOP counter is meshprof's own slowdown: left out of the analysis
    assert mon.mon.to_meta()["instrumented_steps"] == [1]


def test_broken_parts_never_raise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import meshprof.perfmon as deco

    def broken(self: Any) -> None:
        raise RuntimeError("profiler exploded")

    monkeypatch.setattr(deco.PerformanceMonitor, "_start_profiler", broken)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if not installed
    lines: list[str] = []
    mon = meshprof.performance_monitor(
        None,
        out_dir=tmp_path,
        tensorboard=True,
        memory_snapshot_step=0,
        monitor=StepMonitor(),
        print_fn=lines.append,
    )

    @mon
    def step() -> int:
        return 3

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert [step() for _ in range(3)] == [3, 3, 3]
    mon.close()
    assert "performance_monitor: 1 rank(s)" in lines[0] and "torch.profiler schedule" in lines[0]
    assert set(mon.failures) == {"profiler", "tensorboard"}
    assert "pip install 'meshprof[tensorboard]'" in mon.failures["tensorboard"]
    assert sum("switched off" in str(w.message) for w in caught) == 2  # once per part
    if not torch.cuda.is_available():
        assert any("needs CUDA" in s for s in lines)
        assert not list(tmp_path.glob("memory_snapshot*"))

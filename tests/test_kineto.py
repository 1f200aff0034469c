"""Kineto (torch.profiler) trace ingest: exact numbers on hand-built traces, and a real
2-rank gloo trace checked against a known injected delay and the recorder."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import pytest

from meshprof.analyze.compute.intervals import total as union_ns
from meshprof.analyze.traces.kineto import (
    KINETO_TID_BASE,
    kineto_breakdown,
    kineto_events,
    load_trace,
)
from meshprof.errors import MeshprofError, NotATraceError
from meshprof.launch.spawn import run_ranks

BASE = 1_700_000_000_000_000_000


def _x(name: str, ts_us: float, dur_us: float, cat: str = "cpu_op", tid: int = 1) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts_us, "dur": dur_us}


def _write(path: Path, events: list[dict], rank: int | None = None, gz: bool = False) -> Path:
    doc: dict = {"baseTimeNanoseconds": BASE, "traceEvents": events}
    if rank is not None:
        doc["distributedInfo"] = {"rank": rank, "world_size": 2, "backend": "gloo"}
    raw = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(raw) if gz else raw)
    return path


def test_union_ns_exact() -> None:
    import numpy as np

    s = np.array([10, 0, 5, 30, 31], dtype=np.int64)
    e = np.array([20, 8, 12, 35, 33], dtype=np.int64)
    # [0,20) and [30,35)
    assert union_ns(s, e) == 25
    assert union_ns(s[:0], e[:0]) == 0


def test_host_breakdown_hand_computed(tmp_path: Path) -> None:
    # window: 100..400 µs. Compute: linear 100..200 (nested addmm inside), backward 250..330
    # which encloses a c10d::allreduce_ 300..320 and a gloo thread op 310..360 on another tid.
    # The ProfilerStep annotation spans the window and is not computation.
    ev = [
        _x("ProfilerStep#3", 100, 300, cat="user_annotation"),
        _x("aten::linear", 100, 100),
        _x("aten::addmm", 120, 50),
        _x("autograd::engine::evaluate_function: AddmmBackward0", 250, 80),
        _x("c10d::allreduce_", 300, 20),
        _x("gloo:all_reduce", 310, 50, tid=2),
        {"ph": "M", "name": "thread_name", "pid": 7, "tid": 2, "args": {"name": "gloo"}},
        {
            "ph": "X",
            "cat": "Trace",
            "name": "PyTorch Profiler (0)",
            "pid": "Spans",
            "tid": "x",
            "ts": 0,
            "dur": 9999,
        },
    ]
    p = _write(tmp_path / "trace_rank1_step3.json", ev)
    (b,) = kineto_breakdown([p])
    assert b.rank == 1  # from the file name
    assert b.basis == "host"
    assert b.window_ns == 300_000
    assert b.comm_ns == 60_000  # union of 300..320 and 310..360
    assert b.compute_ns == 100_000 + 50_000  # 100..200, and 250..300 outside communication
    assert b.other_ns == 300_000 - 150_000 - 60_000
    assert b.comm_events == 2
    assert b.start_ns == BASE + 100_000


def test_device_basis_counts_kernels_only(tmp_path: Path) -> None:
    ev = [
        _x("aten::mm", 0, 1000),
        _x("volta_sgemm_128x64_nn", 100, 200, cat="kernel", tid=7),
        _x("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 250, 100, cat="kernel", tid=8),
        _x("Memcpy HtoD", 400, 50, cat="gpu_memcpy", tid=7),
    ]
    p = _write(tmp_path / "t.json.gz", ev, rank=3, gz=True)
    (b,) = kineto_breakdown([p])
    assert (b.rank, b.basis) == (3, "device")
    # HTA's definitions over the GPU kernel span 100..450 µs (the host op is not counted);
    # no ProfilerStep, so nothing is left out
    assert b.window_ns == 350_000
    assert b.compute_ns == 200_000  # the sgemm; the memcpy is not computation
    assert b.comm_ns == 50_000  # exposed: the part of the NCCL kernel after the sgemm
    assert b.gpu is not None and b.gpu.total.comm_ns == 100_000
    assert b.gpu.total.comm_comp_overlap_pct == pytest.approx(50.0)
    assert b.gpu.total.memcpy_ns == 50_000 and b.gpu.total.idle_ns == 50_000  # 350..400


def test_files_of_one_rank_are_summed(tmp_path: Path) -> None:
    a = _write(tmp_path / "trace_rank0_step3.json", [_x("aten::mm", 0, 10)])
    c = _write(tmp_path / "trace_rank0_step7.json.gz", [_x("c10d::broadcast_", 5, 20)], gz=True)
    d = _write(tmp_path / "trace_rank1_step3.json", [_x("aten::mm", 0, 4)])
    b0, b1 = kineto_breakdown([a, c, d])
    assert (b0.rank, b0.window_ns, b0.compute_ns, b0.comm_ns) == (0, 30_000, 10_000, 20_000)
    assert len(b0.paths) == 2
    assert (b1.rank, b1.window_ns) == (1, 4_000)
    assert abs(b0.compute_share + b0.comm_share + b0.other_share - 1.0) < 1e-12


def test_kineto_events_shift(tmp_path: Path) -> None:
    ev = [
        _x("aten::mm", 10.5, 2),
        {"ph": "M", "name": "thread_name", "pid": 7, "tid": 1, "args": {"name": "main"}},
    ]
    ev.append({"ph": "s", "id": 4, "pid": 7, "tid": 1, "ts": 11, "cat": "fwdbwd", "name": "fwdbwd"})
    p = _write(tmp_path / "t.json", ev)
    origin = BASE + 5_000  # the merged trace's zero, 5 µs after the trace's base
    out = kineto_events(p, rank=2, offset_ns=-1_500, origin_ns=origin)
    x = next(e for e in out if e["ph"] == "X")
    # local 10.5 µs after base, moved by -1.5 µs, then 5 µs earlier zero: 4.0 µs
    assert x["ts"] == pytest.approx(4.0)
    assert x["pid"] == 2 and x["tid"] == KINETO_TID_BASE and x["dur"] == 2
    meta = next(e for e in out if e["ph"] == "M")
    assert meta["args"]["name"] == "torch.profiler main" and meta["tid"] == KINETO_TID_BASE
    flow = next(e for e in out if e["ph"] == "s")
    assert flow["id"] == "kineto-2-4"


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(MeshprofError, match="no such trace file"):
        load_trace(tmp_path / "missing.json")
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(b"\x1f\x8bnot gzip")
    with pytest.raises(MeshprofError, match="not a JSON trace"):
        load_trace(bad)
    other = tmp_path / "other.json"
    other.write_text('{"hello": 1}')
    with pytest.raises(NotATraceError, match="no traceEvents") as e:
        kineto_breakdown([other])
    assert e.value.path == other
    with pytest.raises(NotATraceError):
        load_trace(other)


DELAY_S = 0.4  # long against how far apart two ranks leave a barrier on a loaded machine


def _profiled_allreduce(rank: int, world: int, out: str) -> dict:
    import torch
    import torch.distributed as dist
    from torch.profiler import profile

    import meshprof

    prof = meshprof.enable()
    t = torch.ones(1024)
    dist.all_reduce(t)  # warm the connection outside the trace
    with profile() as p:
        dist.barrier()  # both traces running (profiler start-up takes a variable time)
        after_barrier_ns = time.time_ns()
        if rank == 1:
            time.sleep(DELAY_S)  # rank 0 waits this long inside its all_reduce
        dist.all_reduce(t)
    path = Path(out) / f"trace_rank{rank}_step0.json.gz"
    p.export_chrome_trace(str(path))
    ev = prof.events()[-1]
    assert ev.op == "all_reduce"
    return {"path": str(path), "after_barrier_ns": after_barrier_ns, "recorded_ns": ev.duration_ns}


def _trim(path: str, from_ns: int, dest: Path) -> Path:
    """The trace's complete events that start at or after ``from_ns`` (wall clock)."""
    doc = load_trace(path)
    base = int(doc["baseTimeNanoseconds"])
    doc["traceEvents"] = [
        e
        for e in doc["traceEvents"]
        if e.get("ph") == "X"
        and isinstance(e.get("ts"), (int, float))
        and base + e["ts"] * 1000 >= from_ns
    ]
    dest.write_text(json.dumps(doc))
    return dest


@pytest.mark.timeout(120)
def test_real_gloo_trace_agrees_with_injected_delay_and_recorder(tmp_path: Path) -> None:
    res = run_ranks(_profiled_allreduce, 2, (str(tmp_path),), timeout=90)
    full = kineto_breakdown([r["path"] for r in res])
    assert [b.rank for b in full] == [0, 1]
    assert all(b.comm_events >= 2 for b in full)  # the barrier and the all_reduce
    # the part after the barrier: rank 0 waits for the sleeping rank 1 inside its all_reduce
    trimmed = [
        _trim(r["path"], r["after_barrier_ns"], tmp_path / f"trim_rank{i}.json")
        for i, r in enumerate(res)
    ]
    b0, _ = kineto_breakdown(trimmed)
    assert b0.comm_ns >= DELAY_S * 1e9 * 0.9
    # and agrees with meshprof's own recorder for the same all_reduce (20 % + 5 ms)
    rec = res[0]["recorded_ns"]
    assert abs(b0.comm_ns - rec) <= 0.2 * rec + 5e6
    # rank 1 slept between its barrier and its all_reduce: neither computation nor communication
    assert full[1].other_ns >= DELAY_S * 1e9 * 0.9

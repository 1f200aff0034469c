"""Recorder behaviour on real gloo groups: sampling, seq, ring buffer, min duration, ops filter,
threads, never breaking training, failed collectives, profile() windows, the JSON export."""

from __future__ import annotations

import json
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from meshprof.events import CommEvent
from meshprof.launch.spawn import run_ranks
from native_helpers import require_native

N_SAMPLED = 300


def _idle(prof: Any) -> None:
    deadline = time.monotonic() + 10
    while prof.inflight() and time.monotonic() < deadline:
        time.sleep(0.001)


def _sampling(rank: int, ws: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    import meshprof

    sub = dist.new_group([0, 1])
    prof = meshprof.enable(meshprof.ProfilerConfig(sample_rate=0.25))
    t = torch.ones(2)
    for i in range(N_SAMPLED):
        dist.all_reduce(t, group=sub if i % 3 == 0 else None)
    _idle(prof)
    st = prof.stats()
    op = {s.key: s for s in st.by_op}["all_reduce"]
    return {
        "retained": sorted((e.group_name, e.seq) for e in prof.events()),
        "count": op.count,
        "timed": op.timed,
        "total_bytes": op.total_bytes,
    }


@pytest.mark.parametrize("native", [False, True], ids=["python", "native"])
def test_sampling_same_collectives_on_every_rank(native: bool) -> None:
    env = {"MESHPROF_NATIVE": "1" if native else "0"}
    if native:
        require_native()  # built once here, before the ranks start
    r0, r1 = run_ranks(_sampling, 2, timeout=90, env=env)
    assert r0["retained"] == r1["retained"]
    n = len(r0["retained"])
    assert 0.12 * N_SAMPLED < n < 0.4 * N_SAMPLED  # about a quarter, decided by (group, seq)
    assert len({g for g, _ in r0["retained"]}) == 2
    for r in (r0, r1):
        assert r["count"] == N_SAMPLED  # exact counts include the collectives not sampled
        assert r["timed"] == n
        assert r["total_bytes"] == N_SAMPLED * 8


def _behaviour(rank: int, ws: int) -> dict[str, Any]:
    import threading
    import warnings

    import torch
    import torch.distributed as dist

    import meshprof
    from meshprof.comm import ops

    out: dict[str, Any] = {}

    # -- min duration: only the collective delayed by the peer is retained ----------------------
    # (the ranks start the section together, and the injected wait is far above the minimum
    # and the minimum far above what a loaded machine's scheduling makes a rank wait)
    dist.barrier()
    prof = meshprof.enable(meshprof.ProfilerConfig(min_duration_us=200_000))
    t = torch.ones(4)
    for i in range(3):
        if i == 1 and rank == 1:
            time.sleep(0.5)  # injected: rank 0's second all_reduce waits 500 ms
        dist.all_reduce(t)
    _idle(prof)
    st = {s.key: s for s in prof.stats().by_op}["all_reduce"]
    out["min_dur"] = {
        "retained": [(e.seq, e.duration_ns) for e in prof.events()],
        "count": st.count,
        "timed": st.timed,
        "dropped": prof.meta()["dropped_events"],
    }
    meshprof.reset()

    # -- ops filter: only broadcasts are recorded, but seq counts every collective ---------------
    prof = meshprof.enable(meshprof.ProfilerConfig(ops=frozenset({"broadcast"})))
    dist.all_reduce(t)
    dist.broadcast(t, 0)
    dist.barrier()
    dist.broadcast(t, 1)
    _idle(prof)
    out["ops_filter"] = [(e.op, e.seq) for e in prof.events()]
    meshprof.reset()

    # -- threads issuing collectives on separate groups at the same time ----------------------
    groups = [dist.new_group([0, 1]) for _ in range(2)]
    prof = meshprof.enable()
    dist.barrier()

    def issue(g: Any, n: int) -> None:
        x = torch.ones(8)
        for _ in range(n):
            dist.all_reduce(x, group=g)
            dist.broadcast(x, 0, group=g)

    threads = [threading.Thread(target=issue, args=(g, 40)) for g in groups]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    _idle(prof)
    evs = prof.events()
    out["threads"] = {
        g.group_name: sorted((e.seq, e.op) for e in evs if e.group_name == g.group_name)
        for g in groups
    }
    out["threads_errors"] = prof.internal_errors
    meshprof.reset()

    # -- an error inside meshprof is caught, counted, reported once; training goes on ----------
    spec = next(s for s in ops.SPECS if s.schema_name == "allreduce_")
    original = spec.in_bytes

    def broken(args: Any) -> int:
        raise ValueError("injected byte-count failure")

    object.__setattr__(spec, "in_bytes", broken)
    try:
        prof = meshprof.enable()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            vals = []
            for _ in range(3):
                x = torch.ones(2) * (rank + 1)
                dist.all_reduce(x)
                vals.append(x.tolist())
            dist.broadcast(x, 0)
        _idle(prof)
        out["internal"] = {
            "values": vals,
            "count": prof.internal_errors,
            "first": prof.first_internal_error,
            "warnings": [str(w.message) for w in caught if "meshprof" in str(w.message)],
            "ops": [e.op for e in prof.events()],
            "meta": prof.meta()["internal_errors"],
        }
    finally:
        object.__setattr__(spec, "in_bytes", original)
        meshprof.reset()

    # -- a collective's own exception passes through unchanged and is recorded as failed ------
    def bad_all_gather() -> BaseException:
        try:
            # wrong number of output tensors: gloo's kernel rejects it
            dist.all_gather([torch.zeros(2)] * (ws + 1), torch.ones(2))
        except Exception as e:
            return e
        raise AssertionError("gloo accepted a wrong output list")

    plain = bad_all_gather()  # without meshprof: the oracle for type and message
    prof = meshprof.enable()
    seen = bad_all_gather()
    x = torch.ones(2)
    dist.all_reduce(x)  # the group still works, and seq continues
    _idle(prof)
    out["failed"] = {
        "plain": (type(plain).__name__, str(plain)),
        "seen": (type(seen).__name__, str(seen)),
        "events": [(e.op, e.status, e.error, e.seq, e.in_bytes) for e in prof.events()],
        "sum": x[0].item(),
        "stats_errors": {s.key: s.errors for s in prof.stats().by_op},
        "internal": prof.internal_errors,
    }
    meshprof.reset()

    # -- profile(): context manager and decorator windows -------------------------------------
    with meshprof.profile() as window:
        dist.all_reduce(x)
        dist.broadcast(x, 0)
    after = meshprof.get_profiler()
    installed_after = after is not None and after.installed
    dist.all_reduce(x)  # not recorded: the window enabled the recorder and disabled it again

    deco = meshprof.profile()

    @deco
    def step() -> None:
        dist.barrier()
        dist.all_reduce(x)

    step()
    prof = meshprof.enable()
    dist.broadcast(x, 1)
    with meshprof.profile() as inner:
        dist.all_reduce(x)
    dist.barrier()
    _idle(prof)
    out["windows"] = {
        "ctx": [e.op for e in window.events()],
        "ctx_count": {s.key: s.count for s in window.stats().by_op},
        "installed_after": installed_after,
        "decorated": [e.op for e in deco.events()],
        "inner": [e.op for e in inner.events()],
        "still_installed": prof.installed,
        "summary": inner.summary(),
    }
    return out


@pytest.fixture(scope="module")
def behaviour() -> list[dict[str, Any]]:
    # the Python kernel, asked for: its sequence numbers start again with every new recorder
    env = {"MESHPROF_NATIVE": "0"}
    return run_ranks(_behaviour, 2, timeout=120, pg_timeout_s=30, env=env)


def test_min_duration_counts_but_does_not_retain(behaviour: list[dict[str, Any]]) -> None:
    r = behaviour[0]["min_dur"]
    assert [seq for seq, _ in r["retained"]] == [1]
    assert r["retained"][0][1] >= 400_000_000
    assert r["count"] == 3 and r["timed"] == 3 and r["dropped"] == 2


def test_ops_filter_keeps_seq_aligned(behaviour: list[dict[str, Any]]) -> None:
    for r in behaviour:
        assert r["ops_filter"] == [("broadcast", 1), ("broadcast", 3)]


def test_threads_on_separate_groups(behaviour: list[dict[str, Any]]) -> None:
    r0, r1 = behaviour
    assert r0["threads_errors"] == 0 and r1["threads_errors"] == 0
    assert r0["threads"] == r1["threads"]
    assert len(r0["threads"]) == 2
    for evs in r0["threads"].values():
        assert [s for s, _ in evs] == list(range(80))  # every op once, seq without gaps
        assert [op for _, op in evs] == ["all_reduce", "broadcast"] * 40


def test_internal_error_caught_counted_reported_once(behaviour: list[dict[str, Any]]) -> None:
    for r in behaviour:
        i = r["internal"]
        assert i["values"] == [[3.0, 3.0]] * 3  # the collective itself ran correctly
        assert i["count"] == 3 and i["meta"] == 3
        assert i["first"] == "ValueError: injected byte-count failure"
        assert len(i["warnings"]) == 1
        assert i["ops"] == ["broadcast"]  # other ops are still recorded


def test_collective_exception_passes_through_and_is_recorded(
    behaviour: list[dict[str, Any]],
) -> None:
    for r in behaviour:
        f = r["failed"]
        assert f["seen"] == f["plain"]
        assert f["internal"] == 0
        (op, status, error, seq, in_b), ok = f["events"]
        assert (op, status, in_b) == ("all_gather", "error", 8)
        assert error == f"{f['seen'][0]}: {f['seen'][1]}"
        assert ok[:2] == ("all_reduce", "ok") and ok[3] == seq + 1
        assert f["sum"] == 2.0
        assert f["stats_errors"] == {"all_gather": 1, "all_reduce": 0}


def test_profile_windows(behaviour: list[dict[str, Any]]) -> None:
    for r in behaviour:
        w = r["windows"]
        assert w["ctx"] == ["all_reduce", "broadcast"]
        assert w["ctx_count"] == {"all_reduce": 1, "broadcast": 1}
        assert w["installed_after"] is False
        assert w["decorated"] == ["barrier", "all_reduce"]
        assert w["inner"] == ["all_reduce"]
        assert w["still_installed"] is True
        assert "all_reduce" in w["summary"] and "broadcast" not in w["summary"]


def _export(rank: int, ws: int, path: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    import meshprof

    prof = meshprof.enable()
    t = torch.ones(256)
    dist.all_reduce(t)
    dist.all_gather([torch.zeros(256) for _ in range(ws)], t)
    if rank == 0:
        dist.send(t, 1)
    else:
        dist.recv(t, 0)
    _idle(prof)
    prof.export_json(f"{path}.{rank}.json")
    return {"n": len(prof.events())}


def test_export_json_format(tmp_path: Any) -> None:
    base = str(tmp_path / "rank")
    run_ranks(_export, 2, (base,), timeout=60)
    for rank in (0, 1):
        data = json.loads(Path(f"{base}.{rank}.json").read_text())
        assert set(data) == {"meta", "events", "stats"}
        m = data["meta"]
        assert m["rank"] == rank and m["world_size"] == 2
        assert m["total_events"] == 3 and m["evicted_events"] == 0 and m["internal_errors"] == 0
        assert m["groups"][0]["ranks"] == [0, 1] and m["groups"][0]["backend"] == "gloo"
        names = [f.name for f in fields(CommEvent)]
        for e in data["events"]:
            assert list(e) == names
        ar = data["events"][0]
        assert (ar["op"], ar["in_bytes"], ar["group_ranks"], ar["seq"]) == (
            "all_reduce",
            1024,
            [0, 1],
            0,
        )
        # algbw = S / t with S = 1024 bytes; busbw = algbw * 2(n-1)/n = algbw for n = 2
        assert ar["algbw_gbps"] == pytest.approx(1024 / ar["duration_ns"])
        assert ar["busbw_gbps"] == pytest.approx(ar["algbw_gbps"])
        ag = data["events"][1]
        assert ag["algbw_gbps"] == pytest.approx(2048 / ag["duration_ns"])
        assert ag["busbw_gbps"] == pytest.approx(ag["algbw_gbps"] / 2)
        st = data["stats"]
        assert set(st) == {
            "by_op",
            "by_rank",
            "by_group",
            "by_size",
            "percentiles",
            "sketch_relative_error",
        }
        assert st["percentiles"] == "exact"
        row = st["by_op"][0]
        for k in (
            "count",
            "total_bytes",
            "total_ns",
            "min_ns",
            "mean_ns",
            "max_ns",
            "p50_ns",
            "p95_ns",
            "p99_ns",
            "mean_algbw_gbps",
            "mean_busbw_gbps",
            "errors",
        ):
            assert k in row
        assert sum(r["count"] for r in st["by_op"]) == 3


def _no_host_sync(rank: int, ws: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    import meshprof

    torch.cuda.set_device(rank)
    prof = meshprof.enable()
    t = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(t)  # warm up NCCL outside the checked region
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host synchronization raises
    try:
        for _ in range(5):
            dist.all_reduce(t)
            dist.broadcast(t, 0)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    evs = prof.events()
    return {
        "n": len(evs),
        "device_timed": prof.internal_errors,
        "durs": [e.duration_ns for e in evs],
    }


@pytest.mark.gpu
def test_cuda_path_never_synchronizes_the_host() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    r0, _ = run_ranks(_no_host_sync, 2, backend="nccl", timeout=120)
    assert r0["device_timed"] == 0
    assert r0["n"] == 11
    assert all(d > 0 for d in r0["durs"])


def _native_p2p(rank: int, ws: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    import meshprof
    from meshprof.config import ProfilerConfig

    prof = meshprof.enable(ProfilerConfig(native=True))
    mod = prof.backend.mod
    t = torch.ones(256)
    waits = []
    for _ in range(6):
        dist.barrier()
        if rank == 0:
            time.sleep(0.03)  # rank 1's recv waits ~30 ms for this send
        t0 = time.perf_counter_ns()  # the op's whole life lies between t0 and the end below
        w = dist.isend(t, 1) if rank == 0 else dist.irecv(t, 0)
        w.wait()
        waits.append(time.perf_counter_ns() - t0)
    polled = mod.polled_count()  # every waited work left the poller's list at its wait
    _idle(prof)
    ev = [e for e in prof.events() if e.op in ("send", "recv")]
    meshprof.disable()
    return {"polled": polled, "durs": [e.duration_ns for e in ev], "waits": waits}


def test_native_p2p_ends_at_the_python_wait() -> None:
    """Native recorder, gloo send/recv (works without a future): an op waited on from Python
    ends when its wait returns, not when the (slow, ≤ 20 ms) safety-net poller next looks. The
    recv's recorded duration is the ~30 ms the receiver waited, and no longer than the test's own
    timing around the call and its wait (a poll after the wait would make it longer)."""
    require_native()  # built once here, before the ranks start
    res = run_ranks(_native_p2p, 2, timeout=120)
    for r in res:
        assert r["polled"] == 0
        assert len(r["durs"]) == 6
    recv = res[1]
    for d, w in zip(recv["durs"], recv["waits"], strict=True):
        assert d >= 20e6  # it really waited for the late send
        assert d <= w + 200_000  # and ended at the wait, not up to 20 ms later at a poll


def _any_source(rank: int, ws: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    import meshprof

    prof = meshprof.enable()
    t = torch.zeros(8)
    senders = []
    if rank == 0:
        for _ in range(2 * (ws - 1)):  # every other rank sends twice; rank 0 names no source
            senders.append(dist.recv(t))
    else:
        for k in range(2):
            dist.send(torch.full((8,), float(10 * rank + k)), 0)
    dist.barrier()
    _idle(prof)
    ev = [(e.op, e.peer, e.seq) for e in prof.events()]
    native = prof.backend_name == "native"
    meshprof.disable()
    return {"senders": senders, "events": ev, "native": native}


@pytest.mark.parametrize("native", [False, True], ids=["python", "native"])
def test_recv_from_any_source_pairs_with_its_send(native: bool) -> None:
    """``dist.recv(t)`` with no source: the recorded recv carries the sender torch returned and
    the seq of that (sender → receiver) direction, so each one pairs with exactly one send."""
    env = {"MESHPROF_NATIVE": "1" if native else "0"}
    if native:
        require_native()  # built once here, before the ranks start
    res = run_ranks(_any_source, 3, timeout=90, env=env)
    assert all(r["native"] == native for r in res)
    recvs = [(p, s) for op, p, s in res[0]["events"] if op == "recv"]
    assert sorted(p for p, _ in recvs) == sorted(res[0]["senders"]) == [1, 1, 2, 2]
    sends = sorted((r, s) for r in (1, 2) for op, p, s in res[r]["events"] if op == "send")
    assert sends == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert sorted(recvs) == sends  # (sender, seq) of every recv is one send's (rank, seq)


def _native_disable_in_flight(rank: int, ws: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    import meshprof
    from meshprof.config import ProfilerConfig

    prof = meshprof.enable(ProfilerConfig(native=True))
    dist.barrier()
    if rank == 1:
        time.sleep(0.2)  # rank 0's all_reduce is still in flight when it disables
    w = dist.all_reduce(torch.ones(8), async_op=True)
    if rank == 0:
        meshprof.disable()
    w.wait()
    if rank == 1:
        meshprof.disable()
    ev = [(e.op, e.duration_ns) for e in prof.events() if e.op == "all_reduce"]
    return {"events": ev}


def test_native_disable_keeps_ops_in_flight() -> None:
    """Native recorder: an op still in flight when disable() is called completes in C++ after
    the kernel is gone; disable waits for it (up to 0.5 s) before the last drain, so it is kept,
    with its real duration (~200 ms: the other rank came late)."""
    require_native()  # built once here, before the ranks start
    r0, r1 = run_ranks(_native_disable_in_flight, 2, timeout=90)
    assert len(r0["events"]) == 1 and len(r1["events"]) == 1
    assert r0["events"][0][1] >= 150e6

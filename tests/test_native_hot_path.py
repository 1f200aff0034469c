"""The native recorder's hot path and what it reports about itself (issue 17).

- ``Work.wait`` is hooked in C++ (no Python frame per wait) and behaves like PyTorch's own: same
  return value, same exception type and text; an op whose wait raises is recorded as failed.
- A new profiler numbers each group from 0 with either kernel.
- ``recorder_cpu()`` reports the CPU of meshprof's threads: checked against a thread that burns
  a CPU time it measures itself, the native poller's clock, and the process's own CPU time.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from meshprof.launch.spawn import run_ranks
from native_helpers import require_native


def _wait_hook_worker(rank: int, ws: int) -> dict[str, Any]:
    import datetime

    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import PythonCallbackWork, Work

    import meshprof
    from meshprof.comm.completion import is_bound_in_cpp

    def callback(timeout: Any) -> bool:
        raise ValueError("boom from the callback")

    def failing_wait() -> tuple[str, str]:
        work = PythonCallbackWork(callback)  # its C++ wait calls back into Python
        try:
            work.wait()
        except Exception as e:
            return type(e).__name__, str(e)
        return "", ""

    out: dict[str, Any] = {"plain_error": failing_wait()}
    original = Work.__dict__["wait"]
    prof = meshprof.enable()
    out["backend"] = prof.backend_name
    hooked = Work.__dict__["wait"]
    out["hook_in_cpp"] = (
        hooked is not original
        and is_bound_in_cpp(hooked)
        and is_bound_in_cpp(PythonCallbackWork.__dict__["wait"])
    )
    out["hooked_error"] = failing_wait()
    t = torch.ones(4)
    w = dist.all_reduce(t, async_op=True)
    out["wait_result"] = [
        w.wait(),
        w.wait(datetime.timedelta(seconds=5)),
        w.wait(timeout=datetime.timedelta(0)),
    ]
    if rank == 0:  # a recv nobody sends: its wait times out and raises
        r = dist.irecv(torch.empty(4), src=1)
        try:
            r.wait(datetime.timedelta(milliseconds=300))
            out["recv_error"] = ""
        except Exception as e:
            out["recv_error"] = type(e).__name__
    else:
        time.sleep(1.5)
    prof.settle(1.0)
    out["recvs"] = [(e.status, e.error or "") for e in prof.events() if e.op == "recv"]
    meshprof.reset()
    out["restored"] = Work.__dict__["wait"] is original
    return out


def test_wait_hook_in_cpp_behaves_like_torch_and_records_failures() -> None:
    require_native()
    r0, r1 = run_ranks(_wait_hook_worker, 2, timeout=120)
    for r in (r0, r1):
        assert r["backend"] == "native"
        assert r["hook_in_cpp"], "Work.wait should be the C++ hook, not a Python wrapper"
        assert r["hooked_error"] == r["plain_error"]
        assert r["plain_error"][1] and "boom from the callback" in r["plain_error"][1]
        assert r["wait_result"] == [True, True, True]
        assert r["restored"]
    assert r0["recv_error"], "the recv's wait should have raised"
    assert len(r0["recvs"]) == 1
    status, error = r0["recvs"][0]
    assert status == "error" and error, r0["recvs"]


def _seq_worker(rank: int, ws: int, native: bool) -> list[list[int]]:
    import torch
    import torch.distributed as dist

    import meshprof

    t = torch.ones(4)
    out = []
    for n in (3, 2):
        prof = meshprof.enable(meshprof.ProfilerConfig(native=native))
        assert prof.backend_name == ("native" if native else "python")
        for _ in range(n):
            dist.all_reduce(t)
        out.append([e.seq for e in prof.events() if e.op == "all_reduce"])
        meshprof.reset()
    return out


def test_a_new_profiler_numbers_from_zero_in_both_kernels() -> None:
    require_native()
    (native,) = run_ranks(_seq_worker, 1, (True,), timeout=120)
    (python,) = run_ranks(_seq_worker, 1, (False,), timeout=120)
    assert native == python == [[0, 1, 2], [0, 1]]


def _cpu_worker(rank: int, ws: int, out_dir: str) -> dict[str, Any]:
    import threading

    import torch
    import torch.distributed as dist

    import meshprof

    prof = meshprof.enable()
    burned: list[int] = []
    hold = threading.Event()

    def burn() -> None:
        c0 = time.thread_time_ns()
        end = time.perf_counter() + 0.3
        x = 0
        while time.perf_counter() < end:
            x += 1
        burned.append(time.thread_time_ns() - c0)
        hold.wait(30)

    th = threading.Thread(target=burn, name="meshprof-test-burn", daemon=True)
    th.start()
    t = torch.ones(4)
    peer = 1 - rank
    for _ in range(50):  # gloo's send/recv works have no future: the C++ poller backs them up
        if rank == 0:
            dist.send(t, peer)
            dist.recv(t, peer)
        else:
            dist.recv(t, peer)
            dist.send(t, peer)
        dist.all_reduce(t)
    while not burned:
        time.sleep(0.01)
    cpu = prof.recorder_cpu()
    process_ns = time.process_time_ns()
    prof.export_json(f"{out_dir}/rank{rank}.json")
    hold.set()
    th.join()
    return {"cpu": cpu, "burned": burned[0], "process_ns": process_ns}


def test_recorder_cpu_counts_meshprof_threads(tmp_path: Path, cli: Any) -> None:
    require_native()
    results = run_ranks(_cpu_worker, 2, (str(tmp_path),), timeout=120)
    for r in results:
        cpu = r["cpu"]
        threads = cpu["threads_ns"]
        # a thread that measured its own CPU: reported at least that, and not much more
        assert r["burned"] <= threads["meshprof-test-burn"] <= r["burned"] + 20_000_000
        assert threads.get("meshprof-native-poller", 0) > 0  # it ran (future-less works)
        assert cpu["total_ns"] == sum(threads.values())
        assert cpu["total_ns"] <= r["process_ns"]
        assert cpu["collectives"] >= 150
        assert cpu["per_collective_ns"] == cpu["total_ns"] / cpu["collectives"]
    meta = json.loads((tmp_path / "rank0.json").read_text())["meta"]
    assert "meshprof-test-burn" in meta["recorder_cpu"]["threads_ns"]
    res = cli("summary", str(tmp_path / "rank0.json"))
    assert res.returncode == 0 and "recorder threads:" in res.stdout


def _concurrent_read_worker(rank: int, ws: int) -> list[int]:
    import threading

    import torch
    import torch.distributed as dist

    import meshprof

    prof = meshprof.enable()
    stop = threading.Event()

    def other_reader() -> None:  # as the rank writer's tick does, every 0.5 s
        while not stop.is_set():
            prof.flush()

    th = threading.Thread(target=other_reader, daemon=True)
    th.start()
    t = torch.ones(4)
    missed = []
    for i in range(1, 301):
        dist.all_reduce(t, async_op=True).wait()
        n = len(prof.events())
        if n != i:
            missed.append(i)
    stop.set()
    th.join()
    return missed


def test_a_read_misses_nothing_while_another_thread_drains() -> None:
    """Every collective waited on before a read is in it, while another thread drains the
    native kernel at the same time (without one drain at a time, the read saw the log while
    the other thread held records taken from C++ but not yet appended)."""
    require_native()
    (missed,) = run_ranks(_concurrent_read_worker, 1, timeout=120)
    assert missed == []


def _backlog_worker(rank: int, ws: int, n: int, cap: int) -> dict[str, Any]:
    import threading

    import torch
    import torch.distributed as dist

    import meshprof

    prof = meshprof.enable(meshprof.ProfilerConfig(max_events=1000))
    mod = prof._backend.mod  # type: ignore[union-attr]
    mod.set_backlog_cap(cap)
    t = torch.ones(4)
    most = 0
    for i in range(n):  # nobody reads the recorder meanwhile
        dist.all_reduce(t)
        if i % 100 == 99:
            most = max(most, int(mod.backlog()))
    deadline = time.monotonic() + 10
    while prof.log.total < n - cap and time.monotonic() < deadline:
        time.sleep(0.01)  # the drainer's last wake-up
    drained = prof.log.total
    prof.flush()
    threads = [t.name for t in threading.enumerate()]
    backend = prof.backend_name
    meshprof.disable()
    return {
        "backend": backend,
        "most": most,
        "drained_before_read": drained,
        "total": prof.log.total,
        "retained": len(prof.events()),
        "threads": threads,
        "drain_after_disable": [
            t.name for t in threading.enumerate() if t.name == "meshprof-drain"
        ],
    }


def test_an_unread_recorder_keeps_a_bounded_backlog() -> None:
    """Nothing reads the recorder (no ``meshprof run``, no ``events()``): the finished records
    waiting in C++ stay near the backlog bound because the drainer thread moves them into the
    event log (bounded ring, exact counts); before it they grew by ~80 B per collective for the
    whole run. Oracle: the number of collectives issued."""
    require_native()
    n, cap = 5_000, 200
    for r in run_ranks(_backlog_worker, 2, (n, cap), timeout=120):
        assert r["backend"] == "native"
        assert "meshprof-drain" in r["threads"]
        # sampled every 100 collectives: at most the bound plus the drainer's reaction time
        assert r["most"] < 20 * cap, r["most"]
        assert r["drained_before_read"] >= n - cap  # the drainer did it, not the final read
        assert r["total"] == n  # every all_reduce counted once
        assert r["retained"] == 1000  # the ring
        assert r["drain_after_disable"] == []  # disable() stops the thread


def _destroyed_group_worker(rank: int, ws: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    import meshprof

    prof = meshprof.enable()
    sub = dist.new_group([0, 1], group_desc="mine")
    t = torch.ones(4)
    dist.all_reduce(t, group=sub)
    dist.destroy_process_group(sub)  # before anything read the recorder
    ev = [e for e in prof.events() if e.op == "all_reduce"]
    backend = prof.backend_name
    meshprof.disable()
    return {
        "backend": backend,
        "groups": [(e.group_desc, list(e.group_ranks)) for e in ev],
    }


def test_a_group_destroyed_before_the_first_read_keeps_its_members() -> None:
    """The native records name their group only; its description and members are looked up
    when the records are drained. A group destroyed before the first drain used to come out
    with no members and no description (a short ``meshprof run`` job lost its world group's
    members this way): the recorder now drains before ``destroy_process_group``. Oracle: the
    group's members as created."""
    require_native()
    for r in run_ranks(_destroyed_group_worker, 2, timeout=120):
        assert r["backend"] == "native"
        assert r["groups"] == [("mine", [0, 1])]

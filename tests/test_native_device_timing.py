"""The native recorder's device-timing resolution, on CPU, with its scripted stand-in timer.

On a GPU the C++ kernel times an op with CUDA events (or the work's own, ``getDuration()``) and
resolves them later without synchronizing the host. Everything but the CUDA calls is the same
code here: a test hook (``test_device_script``) gives each op a stand-in timer with a scripted
device duration and a scripted moment (on a test-driven device clock) its end is reached. The
oracle is that script: every record waits for its own device end, whatever order the ends come
in, its ``duration_ns`` is its scripted device time, its host time is kept
(``metadata.host_duration_ns``, bracketed by the test's own clock), a flush never waits for the
device, no elapsed time is ever asked before its end was reached (a real device would block or
fail there), and an end never reached is given up after the timeout with the host duration.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from meshprof.launch.spawn import run_ranks

WS = 2
N = 4
MS = 1_000_000


def _host_complete(mod: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while mod.inflight_records() and time.monotonic() < deadline:
        time.sleep(0.001)


def _worker(rank: int, ws: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    import meshprof
    from meshprof.comm import native

    prof = meshprof.enable(meshprof.ProfilerConfig(native=True))
    mod = native.load()
    out: dict[str, Any] = {"backend": prof.backend_name}
    t = torch.ones(256)  # 1 KiB
    dist.all_reduce(t)  # warm up, host-timed
    prof.settle(2.0)
    start = prof.log.total

    # N all_reduces; device ends reached in the reverse order of issue (clock 10*(N-i))
    script = [((i + 1) * MS, 10 * (N - i)) for i in range(N)]
    mod.test_device_clock(0)
    mod.test_device_script(True, script)
    t_before = time.perf_counter_ns()
    for _ in range(N):
        dist.all_reduce(t)
    _host_complete(mod)
    t_host_done = time.perf_counter_ns()
    f0 = time.perf_counter_ns()
    prof.flush()  # host-complete, device not reached: nothing yet, and no waiting
    out["flush_ns"] = time.perf_counter_ns() - f0
    out["before_device"] = len(prof.events(start, inflight=False))
    # ... and every read has them, in flight (no duration yet), once
    out["before_device_inflight"] = [(e.seq, e.duration_ns) for e in prof.events(start)]
    out["pending"] = int(mod.device_pending_count())
    resolved: list[list[int]] = []
    for clock in (15, 25, 100):  # the last issued first, then the third, then the rest
        mod.test_device_clock(clock)
        prof.flush()
        resolved.append(sorted(e.seq for e in prof.events(start, inflight=False)))
    evs = prof.events(start)
    out["events"] = [(e.seq, e.duration_ns, dict(e.metadata)) for e in evs]
    out["counters"] = list(mod.test_device_clock(-1))
    out["resolved"] = resolved
    out["host_window_ns"] = t_host_done - t_before
    seq0 = min(e.seq for e in evs)
    out["seq0"] = seq0

    # an end the device never reaches: given up after the timeout, with the host duration
    mod.test_device_script(True, [(7 * MS, 10**12)])
    mod.set_device_timeout(50 * MS)
    start2 = prof.log.total
    a = time.perf_counter_ns()
    dist.all_reduce(t)
    _host_complete(mod)
    b = time.perf_counter_ns()
    prof.flush()
    out["kept_waiting"] = len(prof.events(start2, inflight=False))
    time.sleep(0.1)
    prof.flush()
    out["abandoned"] = [(e.duration_ns, dict(e.metadata)) for e in prof.events(start2)]
    out["abandon_window_ns"] = b - a
    mod.set_device_timeout(int(native.DEVICE_TIMEOUT_S * 1e9))

    # a synchronous op that returns no work (gloo's monitored_barrier; NCCL's async_op=False
    # ops since torch 2.7, seen on an H200): its end is marked on the current stream when it
    # returns, so it is device-timed like the others
    mod.test_device_script(True, [(3 * MS, 0)])
    start4 = prof.log.total
    dist.monitored_barrier()
    prof.flush()
    out["sync_op"] = [(e.op, e.duration_ns, dict(e.metadata)) for e in prof.events(start4)]
    mod.test_device_script(False, [])

    # script off: host-timed again, nothing pending
    start3 = prof.log.total
    dist.all_reduce(t)
    prof.settle(2.0)
    out["after"] = [(e.duration_ns, dict(e.metadata)) for e in prof.events(start3)]
    out["internal_errors"] = prof.internal_errors
    return out


def test_native_device_timers_resolve_without_waiting() -> None:
    import meshprof.comm.native

    try:
        meshprof.comm.native.load()  # build once here, before the ranks start
    except meshprof.comm.native.MeshprofError as e:
        pytest.skip(str(e))
    res = run_ranks(_worker, WS, timeout=180, env={"MESHPROF_NATIVE": "1"})
    for r in res:
        assert r["backend"] == "native"
        assert r["internal_errors"] == 0
        # host-complete but the device has not reached any end: nothing recorded, all pending
        assert r["before_device"] == 0
        assert r["pending"] == N
        assert [d for _s, d in r["before_device_inflight"]] == [-1] * N
        assert r["flush_ns"] < 50 * MS  # the flush did not wait for the device
        s0 = r["seq0"]
        assert r["resolved"] == [[s0 + 3], [s0 + 2, s0 + 3], [s0 + i for i in range(N)]]
        by_seq = {seq: (dur, meta) for seq, dur, meta in r["events"]}
        for i in range(N):
            dur, meta = by_seq[s0 + i]
            assert dur == (i + 1) * MS  # the scripted device time, not the host's
            assert 0 < meta["host_duration_ns"] <= r["host_window_ns"]
        created, ends, queries, early = r["counters"]
        assert (created, ends) == (N, N)
        assert queries >= N + 3  # every pass queried what was left (N at the first flush)
        assert early == 0  # no elapsed time asked before its end: nothing would have blocked
        # never reached: still waiting at first, then given up with its host duration
        assert r["kept_waiting"] == 0
        ((dur, meta),) = r["abandoned"]
        assert meta == {"device_timing_abandoned": True}
        assert 0 < dur <= r["abandon_window_ns"]
        ((dur, meta),) = r["after"]
        assert meta == {} and dur > 0
        ((op, dur, meta),) = r["sync_op"]
        assert op == "barrier" and dur == 3 * MS and meta["host_duration_ns"] > 0


def _cuda_worker(rank: int, ws: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    import meshprof

    torch.cuda.set_device(rank)
    prof = meshprof.enable(meshprof.ProfilerConfig(native=True))
    t = torch.ones(1 << 22, device="cuda")  # 16 MiB
    dist.all_reduce(t)  # warm up NCCL outside the checked region
    torch.cuda.synchronize()
    prof.settle(2.0)
    start = prof.log.total
    torch.cuda.set_sync_debug_mode("error")  # any host synchronization raises
    try:
        for _ in range(5):
            dist.all_reduce(t)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    prof.settle(5.0)
    evs = prof.events(start)
    return {
        "backend": prof.backend_name,
        "internal_errors": prof.internal_errors,
        "durs": [e.duration_ns for e in evs],
        "host": [e.metadata.get("host_duration_ns", -1) for e in evs],
    }


@pytest.mark.gpu
def test_native_cuda_timing_never_synchronizes_the_host() -> None:
    """On a GPU (and a CUDA toolkit for the build): NCCL all_reduces timed on the device by the
    native kernel, with the host-sync checker on. Numbers against torch.profiler's kernel times:
    ``benchmarks/gpu_native_check.py``."""
    torch = pytest.importorskip("torch")
    from meshprof.comm import native
    from meshprof.comm import native_ext as native_build

    if not torch.cuda.is_available() or not native_build.build_with_cuda():
        pytest.skip("needs CUDA and the CUDA toolkit (CUDA_HOME)")
    native.load()
    (r0,) = run_ranks(_cuda_worker, 1, backend="nccl", timeout=300, env={"MESHPROF_NATIVE": "1"})
    assert r0["backend"] == "native"
    assert r0["internal_errors"] == 0
    assert len(r0["durs"]) == 5
    assert all(d > 0 for d in r0["durs"])
    assert all(h > 0 for h in r0["host"])  # device-timed: the host time kept beside it

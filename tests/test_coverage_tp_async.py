"""DTensor tensor parallelism (functional collectives) on a 2x2 mesh, and ``async_op=True``
durations, on 4 gloo ranks. Oracles: torch.profiler's c10d events, the DeviceMesh's own groups,
and an injected delay."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from meshprof.launch.spawn import run_ranks

WS = 4
DELAY_S = 0.3


def _worker(rank: int, ws: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    from torch.profiler import profile

    import meshprof

    prof = meshprof.enable()
    out: dict[str, Any] = {}

    # -- tensor parallelism over the "tp" dimension of a (dp=2, tp=2) mesh ---------------------
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    tp = mesh["tp"]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    parallelize_module(model, tp, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = torch.randn(4, 8)
    dist.barrier()
    prof.flush()
    start = prof.log.total
    with profile() as p:
        y = model(x)
        y.sum().backward()
    deadline = time.monotonic() + 10
    while prof.inflight() and time.monotonic() < deadline:
        time.sleep(0.001)
    out["tp_events"] = [e.to_dict() for e in prof.events(start)]
    out["tp_c10d"] = [e.name for e in p.events() if e.name.startswith("c10d::")]
    out["tp_group"] = tp.get_group().group_name
    out["tp_ranks"] = sorted(dist.get_process_group_ranks(tp.get_group()))
    out["y_shape"] = list(y.shape)

    # -- async_op=True: the duration runs until the work completes ----------------------------
    dist.barrier()
    t = torch.ones(1024)
    if rank == 0:
        t0 = time.perf_counter_ns()
        work = dist.all_reduce(t, async_op=True)
        t_return = time.perf_counter_ns()
        work.wait()
        t_done = time.perf_counter_ns()
        out["call_ns"] = t_return - t0
        out["wait_ns"] = t_done - t0
    else:
        time.sleep(DELAY_S)  # injected delay: rank 0's all_reduce cannot finish before this
        dist.all_reduce(t)
    out["sum"] = t[0].item()
    deadline = time.monotonic() + 10
    while prof.inflight() and time.monotonic() < deadline:
        time.sleep(0.001)
    last = prof.events()[-1]
    out["async_event"] = last.to_dict()
    out["internal_errors"] = prof.internal_errors
    return out


@pytest.fixture(scope="module")
def runs() -> list[dict[str, Any]]:
    res = run_ranks(_worker, WS, timeout=120, pg_timeout_s=30)
    for r in res:
        assert r["internal_errors"] == 0
    return res


def test_dtensor_tp_collectives_on_the_tp_group(runs: list[dict[str, Any]]) -> None:
    for r in runs:
        evs = r["tp_events"]
        oracle = Counter(n for n in r["tp_c10d"])
        assert r["y_shape"] == [4, 8]
        # exactly once: one event per c10d op the dispatcher saw
        assert len(evs) == len(r["tp_c10d"]) > 0
        assert Counter(e["op"] for e in evs)["all_reduce"] == oracle["c10d::allreduce_"] >= 1
        for e in evs:
            assert e["group_name"] == r["tp_group"]
            assert sorted(e["group_ranks"]) == r["tp_ranks"]
            assert len(e["group_ranks"]) == 2
            assert e["duration_ns"] > 0
            assert e["status"] == "ok"
        # RowwiseParallel's forward all-reduce of the (4, 8) float output
        assert any(e["op"] == "all_reduce" and e["in_bytes"] == 4 * 8 * 4 for e in evs)

    # the two members of each TP group saw the same collectives with the same seqs
    def key(r: dict[str, Any]) -> list[tuple[str, int, int]]:
        evs = sorted(r["tp_events"], key=lambda e: e["seq"])
        return [(e["op"], e["seq"], e["in_bytes"]) for e in evs]

    for a, b in ((0, 1), (2, 3)):
        assert runs[a]["tp_group"] == runs[b]["tp_group"]
        assert key(runs[a]) == key(runs[b])
    assert runs[0]["tp_group"] != runs[2]["tp_group"]


def test_async_duration_runs_until_completion(runs: list[dict[str, Any]]) -> None:
    r0 = runs[0]
    e = r0["async_event"]
    assert all(r["sum"] == WS for r in runs)
    assert e["op"] == "all_reduce" and e["async_op"] is True and e["in_bytes"] == 4096
    delay_ns = int(DELAY_S * 1e9)
    # premise: the call itself returned long before the peers joined
    assert r0["call_ns"] < delay_ns / 2
    # the recorded duration covers the wait for the delayed peers, and ends by wait()'s return
    assert e["duration_ns"] >= 0.8 * delay_ns
    assert e["duration_ns"] <= r0["wait_ns"] + 5_000_000
    for r in runs[1:]:
        assert r["async_event"]["async_op"] is False

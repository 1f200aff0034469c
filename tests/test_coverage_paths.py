"""Every path that issues a collective is recorded exactly once, with the right op, bytes and group.

The oracle is PyTorch's own bookkeeping, which meshprof does not compute:
* torch.profiler's ``c10d::<op>`` events, which the dispatcher emits for every c10d op call
  (collectives and point-to-point alike);
* the Flight Recorder (``TORCH_FR_BUFFER_SIZE``), which ProcessGroupGloo fills with every
  collective it enqueues (gloo does not put send/recv in it), with sizes and sequence ids.

Each scenario runs in a window of its own; the worker returns meshprof's events of the window
and both oracles' records of the same window. One 2-rank job runs every scenario, so the whole
file costs a few process starts.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

import pytest
import torch

# Imported before meshprof is enabled anywhere: the recorder must still see calls through it.
from torch.distributed import all_reduce as imported_all_reduce
from torch.distributed import broadcast as imported_broadcast

from meshprof.launch.spawn import run_ranks
from native_helpers import require_native

# the scenarios call what torch 2.12 added (dist.all_gather_single, reduce_scatter_single, gloo's
# list all_to_all): on older torch (2.11 on the GPU machine) the module does not apply
pytestmark = pytest.mark.skipif(
    tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 12),
    reason="the scenarios use torch >= 2.12's collectives",
)

WS = 2
F32 = 4

#: c10d dispatcher op (torch.profiler event name without "c10d::") -> meshprof op.
#: Written out here, independently of meshprof.comm.ops.
C10D_TO_OP = {
    "allreduce_": "all_reduce",
    "allreduce_coalesced_": "all_reduce",
    "allgather_": "all_gather",
    "_allgather_base_": "all_gather",
    "allgather_coalesced_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather",
    "reduce_scatter_": "reduce_scatter",
    "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "broadcast_": "broadcast",
    "reduce_": "reduce",
    "gather_": "gather",
    "scatter_": "scatter",
    "alltoall_": "all_to_all",
    "alltoall_base_": "all_to_all",
    "barrier": "barrier",
    "monitored_barrier_": "barrier",
    "send": "send",
    "recv_": "recv",
    "recv_any_source_": "recv",
}

#: Flight Recorder names whose entries map one to one onto meshprof events on gloo.
#: (gloo's reduce_scatter shows up as all_reduce entries, so it is checked by the profiler only.)
FR_TO_OP = {
    "gloo:all_reduce": "all_reduce",
    "gloo:all_gather": "all_gather",
    "gloo:broadcast": "broadcast",
    "gloo:reduce": "reduce",
    "gloo:gather": "gather",
    "gloo:scatter": "scatter",
    "gloo:all_to_all": "all_to_all",
    "gloo:barrier": "barrier",
}

P2P = {"send", "recv", "send_object_list", "recv_object_list"}

OBJECT_OPS = {
    "all_gather_object",
    "gather_object",
    "broadcast_object_list",
    "scatter_object_list",
    "send_object_list",
    "recv_object_list",
}


# -- scenarios (run inside the workers) --------------------------------------------------------
def _sc_public(rank: int, ws: int) -> list[tuple[str, int, int]]:
    """Every public tensor collective and p2p function once; returns the expected
    (op, in_bytes, out_bytes) of each, computed from the tensors passed."""
    import warnings

    import torch
    import torch.distributed as dist

    warnings.simplefilter("ignore", FutureWarning)  # deprecated names are still public
    peer = 1 - rank
    exp: list[tuple[str, int, int]] = []
    t = torch.ones(4)
    dist.all_reduce(t)
    exp.append(("all_reduce", 16, 16))
    imported_all_reduce(torch.ones(8))
    exp.append(("all_reduce", 32, 32))
    imported_broadcast(torch.ones(3), 0)
    exp.append(("broadcast", 12, 12))
    dist.distributed_c10d.all_reduce(torch.ones(2))
    exp.append(("all_reduce", 8, 8))
    dist.all_gather([torch.zeros(4) for _ in range(ws)], torch.ones(4))
    exp.append(("all_gather", 16, 16 * ws))
    dist.all_gather_into_tensor(torch.zeros(4 * ws), torch.ones(4))
    exp.append(("all_gather", 16, 16 * ws))
    dist.all_gather_single(torch.zeros(2 * ws), torch.ones(2))
    exp.append(("all_gather", 8, 8 * ws))
    dist.all_gather_coalesced([[torch.zeros(4)] for _ in range(ws)], [torch.ones(4)])
    exp.append(("all_gather", 16, 16 * ws))
    dist.reduce_scatter_single(torch.zeros(2), torch.ones(2 * ws))
    exp.append(("reduce_scatter", 8 * ws, 8))
    dist.reduce_scatter(torch.zeros(4), [torch.ones(4) for _ in range(ws)])
    exp.append(("reduce_scatter", 16 * ws, 16))
    dist.reduce_scatter_tensor(torch.zeros(4), torch.ones(4 * ws))
    exp.append(("reduce_scatter", 16 * ws, 16))
    dist.broadcast(torch.ones(5), src=1)
    exp.append(("broadcast", 20, 20))
    dist.reduce(torch.ones(6), dst=0)
    exp.append(("reduce", 24, 24))
    dist.gather(torch.ones(4), [torch.zeros(4) for _ in range(ws)] if rank == 0 else None, dst=0)
    exp.append(("gather", 16, 16 * ws if rank == 0 else 0))
    dist.scatter(torch.zeros(4), [torch.ones(4) for _ in range(ws)] if rank == 0 else None, src=0)
    exp.append(("scatter", 16 * ws if rank == 0 else 0, 16))
    dist.all_to_all([torch.zeros(2) for _ in range(ws)], [torch.ones(2) for _ in range(ws)])
    exp.append(("all_to_all", 8 * ws, 8 * ws))
    dist.all_to_all_single(torch.zeros(3 * ws), torch.ones(3 * ws))
    exp.append(("all_to_all", 12 * ws, 12 * ws))
    dist.all_reduce_coalesced([torch.ones(4), torch.ones(2)])
    exp.append(("all_reduce", 24, 24))
    dist.barrier()
    exp.append(("barrier", 0, 0))
    dist.monitored_barrier()
    exp.append(("barrier", 0, 0))
    dist.distributed_c10d._get_default_group().allreduce([torch.ones(7)]).wait()  # PG method
    exp.append(("all_reduce", 28, 28))
    if rank == 0:
        dist.send(torch.ones(4), 1)
        dist.isend(torch.ones(9), 1).wait()
        exp += [("send", 16, 0), ("send", 36, 0)]
    else:
        dist.recv(torch.zeros(4), 0)
        dist.irecv(torch.zeros(9), 0).wait()
        exp += [("recv", 0, 16), ("recv", 0, 36)]
    if rank == 1:
        dist.send(torch.ones(2), 0)
        exp.append(("send", 8, 0))
    else:
        dist.recv(torch.zeros(2))  # any source
        exp.append(("recv", 0, 8))
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(torch.ones(4))
        dist.all_reduce(torch.ones(3))
    cm.wait()
    exp.append(("all_reduce", 28, 28))
    reqs = dist.batch_isend_irecv(
        [dist.P2POp(dist.isend, torch.ones(3), peer), dist.P2POp(dist.irecv, torch.zeros(3), peer)]
    )
    for r in reqs:
        r.wait()
    exp += [("send", 12, 0), ("recv", 0, 12)]
    return exp


def _sc_objects(rank: int, ws: int) -> None:
    import torch.distributed as dist

    out: list[Any] = [None] * ws
    dist.all_gather_object(out, {"rank": rank})
    assert out == [{"rank": 0}, {"rank": 1}]
    dist.gather_object(rank, [None] * ws if rank == 0 else None, dst=0)
    dist.broadcast_object_list(["x", rank], src=0)
    dist.scatter_object_list([None], [10, 11] if rank == 0 else None, src=0)
    if rank == 0:
        dist.send_object_list([1, "a"], dst=1)
    else:
        dist.recv_object_list([None, None], src=0)


def _sc_ddp(rank: int, ws: int) -> None:
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    # tiny buckets: several gradient all-reduces per backward, issued by the C++ reducer
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.0001)
    for _ in range(2):
        ddp(torch.randn(4, 8)).sum().backward()


def _sc_fsdp(rank: int, ws: int) -> None:
    import torch
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (ws,))
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model(torch.randn(4, 8)).sum().backward()


def _sc_pipeline(rank: int, ws: int) -> None:
    import torch
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    torch.manual_seed(rank)
    stage = PipelineStage(nn.Linear(8, 8), rank, ws, torch.device("cpu"))
    sched = ScheduleGPipe(stage, n_microbatches=2, loss_fn=lambda out, target: out.sum())
    if rank == 0:
        sched.step(torch.randn(4, 8))
    else:
        sched.step(target=torch.zeros(4, 8))


SCENARIOS = {
    "public": _sc_public,
    "objects": _sc_objects,
    "ddp": _sc_ddp,
    "fsdp": _sc_fsdp,
    "pipeline": _sc_pipeline,
}


def _wait_idle(prof: Any, timeout_s: float = 10.0) -> None:
    """Until every issued op has completed (completion callbacks run on backend threads)."""
    deadline = time.monotonic() + timeout_s
    while prof.inflight() and time.monotonic() < deadline:
        time.sleep(0.001)


def _fr_entries() -> list[dict[str, Any]]:
    import torch

    return json.loads(torch._C._distributed_c10d._dump_fr_trace_json(True, True))["entries"]


def _worker(rank: int, ws: int, names: list[str]) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.profiler import profile

    import meshprof

    prof = meshprof.enable()
    out: dict[str, Any] = {}
    for name in names:
        dist.barrier()  # not inside any window
        _wait_idle(prof)
        prof.flush()
        start = prof.log.total
        fr_seen = max([-1] + [e["record_id"] for e in _fr_entries()])
        with profile() as p:
            try:
                expected = SCENARIOS[name](rank, ws)
            except Exception:
                import traceback

                return {"error": traceback.format_exc()}
        _wait_idle(prof)
        c10d = [e.name[len("c10d::") :] for e in p.events() if e.name.startswith("c10d::")]
        fr = _fr_entries()
        fr_new = [
            {
                k: e[k]
                for k in (
                    "profiling_name",
                    "collective_seq_id",
                    "input_sizes",
                    "output_sizes",
                    "input_dtypes",
                    "output_dtypes",
                )
            }
            for e in fr
            if e["record_id"] > fr_seen
        ]
        events = [e.to_dict() for e in prof.events(start)]
        out[name] = {"expected": expected, "c10d": c10d, "fr": fr_new, "events": events}
    _wait_idle(prof)
    out["all_events"] = [e.to_dict() for e in prof.events()]
    out["internal_errors"] = prof.internal_errors
    out["first_internal_error"] = prof.first_internal_error
    out["native"] = prof.backend_name == "native" or bool(prof.config.native)
    out["typed"] = out["autograd"] = []
    if out["native"]:
        from meshprof.comm.native_ext import load

        out["typed"] = list(load().typed_ops())
        out["autograd"] = list(load().autograd_ops())
    return out


@pytest.fixture(scope="module", params=["python", "native", "native-boxed"])
def runs(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    """Every scenario on every rank, with the Python recorder and with the native (C++) one
    (``MESHPROF_NATIVE=1`` makes every ``enable()`` in the workers native): with its typed
    kernels and unboxed autograd passthrough (the default), and with its one boxed kernel for every op
    (``MESHPROF_NATIVE_TYPED=0``, the fallback for an op whose C++ signature it does not know)."""
    env = {"TORCH_FR_BUFFER_SIZE": "2000", "MESHPROF_NATIVE": "0"}
    if request.param.startswith("native"):
        require_native()  # built once here, before the ranks start
        env["MESHPROF_NATIVE"] = "1"
        env["MESHPROF_NATIVE_TYPED"] = "0" if request.param == "native-boxed" else "1"
    res = run_ranks(
        _worker,
        WS,
        (list(SCENARIOS),),
        timeout=150,
        pg_timeout_s=20,
        env=env,
    )
    for r in res:
        assert "error" not in r, r.get("error")
        assert r["internal_errors"] == 0, r["first_internal_error"]
        assert r["native"] == request.param.startswith("native")
        # this torch build's signatures are known: every c10d op gets its typed kernel
        typed = sorted(C10D_TO_OP) if request.param == "native" else []
        assert sorted(r["typed"]) == typed, r["typed"]
        assert sorted(r["autograd"]) == typed, r["autograd"]  # PyTorch has no autograd kernels
    return res


def _oracle_counts(c10d: list[str]) -> Counter[str]:
    return Counter(C10D_TO_OP[n] for n in c10d)


def _recorded_counts(events: list[dict[str, Any]]) -> Counter[str]:
    return Counter(e["op"] for e in events)


@pytest.mark.parametrize("scenario", ["public", "ddp", "fsdp", "pipeline"])
def test_each_c10d_op_recorded_exactly_once(runs: list[dict[str, Any]], scenario: str) -> None:
    """Counts per op equal the dispatcher's own c10d events (torch.profiler), on every rank.
    Object collectives (pipelining's shape exchange) count their inner c10d ops."""
    for r in runs:
        w = r[scenario]
        plain = [e for e in w["events"] if e["op"] not in OBJECT_OPS]
        inner = sum(e["metadata"]["c10d_ops"] for e in w["events"] if e["op"] in OBJECT_OPS)
        assert len(w["c10d"]) > 0
        assert len(plain) + inner == len(w["c10d"])
        if inner == 0:
            assert _recorded_counts(plain) == _oracle_counts(w["c10d"])
        assert all(e["status"] == "ok" for e in w["events"])
        assert all(e["duration_ns"] > 0 for e in w["events"])


@pytest.mark.parametrize("scenario", ["public", "ddp", "fsdp"])
def test_collectives_match_flight_recorder(runs: list[dict[str, Any]], scenario: str) -> None:
    """Op, order and bytes of every collective gloo enqueued (Flight Recorder) match meshprof,
    walking both in sequence order. gloo's reduce_scatter appears as all_reduce entries (their
    inputs add up to the reduce_scatter's input); monitored_barrier has no entry."""
    for rank, r in enumerate(runs):
        w = r[scenario]
        fr = w["fr"]
        mine = sorted(
            (e for e in w["events"] if e["op"] not in ("send", "recv")), key=lambda e: e["seq"]
        )
        assert fr and mine
        i = 0
        monitored = 0
        for e in mine:
            if e["op"] == "barrier" and (i >= len(fr) or fr[i]["profiling_name"] != "gloo:barrier"):
                monitored += 1
                continue
            if e["op"] == "reduce_scatter":
                numel = 0
                while numel < e["in_bytes"] // F32:
                    assert fr[i]["profiling_name"] == "gloo:all_reduce"
                    numel += sum(_numel(s) for s in fr[i]["input_sizes"])
                    i += 1
                assert numel * F32 == e["in_bytes"]
                continue
            f = fr[i]
            i += 1
            assert FR_TO_OP[f["profiling_name"]] == e["op"], (f, e)
            if e["op"] == "barrier":
                continue
            n_in = _fr_bytes(f["input_sizes"], f["input_dtypes"])
            n_out = _fr_bytes(f["output_sizes"], f["output_dtypes"])
            if e["op"] == "all_gather" and f["output_sizes"][0][:1] == [1]:
                n_out *= WS  # FR lists allgather_coalesced's output as [1, n]: one rank's share
            if e["op"] == "gather" and rank != 0:
                assert e["in_bytes"] == n_in and e["out_bytes"] == 0
            elif e["op"] == "scatter" and rank != 0:
                assert e["out_bytes"] == n_out and e["in_bytes"] == 0
            else:
                assert (e["in_bytes"], e["out_bytes"]) == (n_in, n_out), (f, e)
        assert i == len(fr)  # every FR entry consumed: nothing missed
        assert monitored == Counter(w["c10d"])["monitored_barrier_"]


#: Flight Recorder dtype names (c10::ScalarType) -> bytes per element.
FR_ELEMENT_SIZE = {
    "Float": 4,
    "Double": 8,
    "Long": 8,
    "Int": 4,
    "Byte": 1,
    "Half": 2,
    "BFloat16": 2,
}


def _fr_bytes(sizes: list[list[int]], dtypes: list[str]) -> int:
    return sum(_numel(s) * FR_ELEMENT_SIZE[d] for s, d in zip(sizes, dtypes, strict=True))


def _numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def test_public_functions_bytes_and_imported_names(runs: list[dict[str, Any]]) -> None:
    """Every public function (and names imported before enable) gives one event with the bytes
    of the tensors passed, in issue order."""
    for rank, r in enumerate(runs):
        w = r["public"]
        got = sorted(w["events"], key=lambda e: e["start_ns"])
        assert [(e["op"], e["in_bytes"], e["out_bytes"]) for e in got] == [
            tuple(x) for x in w["expected"]
        ]
        for e in got:
            assert e["group_desc"] == "default_pg"
            assert e["group_ranks"] == [0, 1]
            assert e["rank"] == rank
        p2p = [e for e in got if e["op"] in ("send", "recv")]
        assert {e["peer"] for e in p2p} <= {1 - rank, -1}


def test_seq_equal_on_every_rank(runs: list[dict[str, Any]]) -> None:
    """The same collective has the same seq on every member rank; a send and its recv share
    their pair's seq."""
    colls = []
    for r in runs:
        evs = [e for e in r["all_events"] if e["op"] not in P2P]
        colls.append(sorted((e["group_name"], e["seq"], e["op"]) for e in evs))
    assert colls[0] == colls[1]
    seqs = [s for (g, s, _o) in colls[0] if g == "0"]
    assert seqs == list(range(len(seqs)))  # no gaps, no repeats: nothing missed or doubled

    def p2p(rank: int, op: str, peer: int) -> list[tuple[int, int]]:
        return sorted(
            (e["seq"], e["in_bytes"] + e["out_bytes"])
            for e in runs[rank]["all_events"]
            if e["op"] == op and e["peer"] == peer
        )

    assert p2p(0, "send", 1) == p2p(1, "recv", 0) != []
    # rank 0 also received once from any source, before a named recv from rank 1
    # (the sender and seq it learned at completion pair it with rank 1's first send)
    sends = p2p(1, "send", 0)
    assert p2p(0, "recv", -1) == []
    assert p2p(0, "recv", 1) == sends and sends[:2] == [(0, 8), (1, 12)]


def test_object_collectives_one_event_each(runs: list[dict[str, Any]]) -> None:
    """Each object collective is one event of its own name; its c10d_ops equals the c10d ops
    the dispatcher saw inside it."""
    for rank, r in enumerate(runs):
        w = r["objects"]
        names = [e["op"] for e in sorted(w["events"], key=lambda e: e["start_ns"])]
        last = "send_object_list" if rank == 0 else "recv_object_list"
        assert names == [
            "all_gather_object",
            "gather_object",
            "broadcast_object_list",
            "scatter_object_list",
            last,
        ]
        assert sum(e["metadata"]["c10d_ops"] for e in w["events"]) == len(w["c10d"])
        for e in w["events"]:
            assert e["metadata"]["c10d_ops"] >= 1
            assert e["in_bytes"] + e["out_bytes"] > 0
            assert e["dtype"] == "object"


def test_ddp_gradient_allreduce_from_reducer(runs: list[dict[str, Any]]) -> None:
    for r in runs:
        w = r["ddp"]
        ar = [e for e in w["events"] if e["op"] == "all_reduce"]
        assert len(ar) == Counter(w["c10d"])["allreduce_"] >= 3  # 1 bucket, then >= 2 after rebuild
        # every gradient byte is reduced once per step: (8*8+8) + (8*2+2) floats
        assert sum(e["in_bytes"] for e in ar) == 2 * (72 + 18) * F32
        assert all(e["group_desc"] == "default_pg" for e in ar)


def test_fsdp2_all_gathers_and_reduce_scatters(runs: list[dict[str, Any]]) -> None:
    for r in runs:
        w = r["fsdp"]
        c = _recorded_counts(w["events"])
        o = _oracle_counts(w["c10d"])
        assert c["all_gather"] == o["all_gather"] >= 2
        assert c["reduce_scatter"] == o["reduce_scatter"] >= 2
        # all-gather of the two layers' flat parameters: (8*8+8) and (8*2+2) floats, sharded by 2
        ag_out = sorted({e["out_bytes"] for e in w["events"] if e["op"] == "all_gather"})
        assert ag_out == [(8 * 2 + 2) * F32, (8 * 8 + 8) * F32]
        for e in w["events"]:
            if e["op"] == "reduce_scatter":
                assert e["in_bytes"] == WS * e["out_bytes"]


def test_pipelining_send_recv(runs: list[dict[str, Any]]) -> None:
    for rank, r in enumerate(runs):
        w = r["pipeline"]
        o = _oracle_counts(w["c10d"])
        tensor_p2p = [e for e in w["events"] if e["op"] in ("send", "recv")]
        mine = Counter(e["op"] for e in tensor_p2p)
        inner = sum(e["metadata"]["c10d_ops"] for e in w["events"] if e["op"] in OBJECT_OPS)
        assert mine["send"] + mine["recv"] + inner == o["send"] + o["recv"]
        # GPipe, 2 microbatches of 2x8 floats: activations forward, gradients backward
        data = [e for e in tensor_p2p if max(e["in_bytes"], e["out_bytes"]) == 2 * 8 * F32]
        expect = {"send": 2} if rank == 0 else {"recv": 2}
        expect_bwd = {"recv": 2} if rank == 0 else {"send": 2}
        assert Counter(e["op"] for e in data) == Counter(expect) + Counter(expect_bwd)
        assert {e["peer"] for e in tensor_p2p} == {1 - rank}

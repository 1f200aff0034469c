"""A ``torch.compile``d model with DTensor tensor parallelism is recorded exactly once per
collective, in both kernels. Oracle: PyTorch's Flight Recorder (gloo fills it with every
collective it enqueues; meshprof does not compute it), compared one-for-one on
(op, group, seq, bytes), the seq up to one offset (meshprof counts from its ``enable()``).

Compiled graphs call the ``_c10d_functional`` ops (all_reduce, wait_tensor...), whose kernels
issue the ``c10d::`` ops through the process group's backend: the recorder's kernel at
``BackendSelect`` must see each of those once and nothing for ``wait_tensor``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from meshprof.launch.spawn import run_ranks

WS = 2
STEPS = 3

#: Flight Recorder profiling names ("gloo:<name>") -> meshprof op names
_FR_OPS = {
    "all_reduce": "all_reduce",
    "allreduce": "all_reduce",
    "all_gather": "all_gather",
    "_allgather_base": "all_gather",
    "allgather": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "broadcast": "broadcast",
    "all_to_all": "all_to_all",
    "alltoall_base": "all_to_all",
    "barrier": "barrier",
}


def _fr_entries() -> list[dict[str, Any]]:
    import torch

    return list(json.loads(torch._C._distributed_c10d._dump_fr_trace_json(True, True))["entries"])


def _record(prof: Any, compiled: Any, x: Any, group: str, steps: int) -> dict[str, Any]:
    """``steps`` forward + backward steps of the compiled model: meshprof's events and the
    Flight Recorder's entries of ``group`` over them."""
    import torch.distributed as dist

    dist.barrier()
    prof.settle(5.0)
    start = prof.log.total
    fr_before = len(_fr_entries())
    for _ in range(steps):
        compiled(x).sum().backward()
    dist.barrier()  # everything the steps issued has completed on both ranks
    prof.settle(5.0)
    fr = _fr_entries()[fr_before:]
    events = [
        (e.op, e.group_name, e.seq, e.in_bytes, e.out_bytes)
        for e in prof.events(start)
        if e.group_name == group
    ]
    entries = [
        (
            _FR_OPS.get(e["profiling_name"].split(":", 1)[1], e["profiling_name"]),
            str(e["process_group"][0]),
            int(e["collective_seq_id"]) - 1,
            e.get("input_sizes"),
            e.get("input_dtypes"),
            e.get("output_sizes"),
        )
        for e in fr
        if str(e["process_group"][0]) == group
    ]
    return {
        "backend": prof.backend_name,
        "internal_errors": prof.internal_errors,
        "events": events,
        "fr": entries,
    }


def _worker(rank: int, ws: int, steps: int) -> dict[str, Any]:
    import torch
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    import meshprof

    mesh = init_device_mesh("cpu", (ws,), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    # a replicated first layer: the backward all-reduces the gradient of the column-parallel
    # layer's input, so every step has collectives in both directions
    model = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
    parallelize_module(model, mesh, {"1": ColwiseParallel(), "3": RowwiseParallel()})
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    funcol: list[str] = []  # the _c10d_functional ops of the compiled graphs (fw and bw)

    def keep(gm: Any, _inputs: Any) -> Any:  # aot_eager, noting the graph's collectives
        funcol.extend(str(n.target) for n in gm.graph.nodes if "_c10d_functional" in str(n.target))
        return make_boxed_func(gm.forward)

    compiled = torch.compile(model, backend=aot_autograd(fw_compiler=keep, bw_compiler=keep))
    x = torch.randn(8, 16)
    group = mesh.get_group().group_name
    out: dict[str, Any] = {"close": bool(torch.allclose(compiled(x), model(x), atol=1e-5))}
    # both kernels in turn, under the same compiled graph (the recorder sits below it, at the
    # dispatcher: switching kernels needs no recompilation)
    for mode in ("python", "native"):
        prof = meshprof.enable(meshprof.ProfilerConfig(native=mode == "native"))
        out[mode] = _record(prof, compiled, x, group, steps)
        meshprof.disable()
    out["funcol"] = sorted(set(funcol))
    out["funcol_calls"] = len(funcol)
    return out


_ITEMSIZE = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4}


def _nbytes(sizes: list[list[int]], dtypes: list[str]) -> int:
    total = 0
    for shape, dt in zip(sizes, dtypes, strict=False):
        n = 1
        for d in shape:
            n *= int(d)
        total += n * _ITEMSIZE.get(dt, 4)
    return total


@pytest.mark.slow  # torch.compile on 2 ranks: about 60 s on 2 loaded cores
def test_compiled_dtensor_tp_recorded_once_per_collective() -> None:
    import meshprof.comm.native

    meshprof.comm.native.load()  # build once here, before the ranks start
    env = {"TORCH_FR_BUFFER_SIZE": "20000"}
    res = run_ranks(_worker, WS, (STEPS,), timeout=300, pg_timeout_s=120, env=env)
    for rank, r in enumerate(res):
        assert r["close"]
        # the collectives run inside compiled graphs, as functional collectives
        assert r["funcol"] == [
            "_c10d_functional.all_reduce.default",
            "_c10d_functional.wait_tensor.default",
        ], r["funcol"]
        for mode in ("python", "native"):
            m = r[mode]
            assert m["backend"] == mode
            assert m["internal_errors"] == 0
            fr = m["fr"]
            # forward and backward all-reduce of every step, and the closing barrier
            assert len(fr) == 2 * STEPS + 1, f"rank {rank}: {fr}"
            # meshprof numbers a group's collectives from its enable(), the Flight Recorder
            # from the group's creation: one constant offset between the two
            got = sorted(m["events"], key=lambda e: e[2])
            offset = got[0][2] - min(e[2] for e in fr) if got else 0
            want = [
                (op, group, seq + offset, _nbytes(isz, idt), _nbytes(osz, idt))
                for op, group, seq, isz, idt, osz in sorted(fr, key=lambda e: e[2])
            ]
            assert [g[:3] for g in got] == [w[:3] for w in want], f"rank {rank} {mode}"
            assert got == want, f"rank {rank} {mode}: bytes differ"

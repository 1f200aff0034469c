"""meshprof never changes what the job computes: the c10d path it adds makes no copy, alias,
version bump or write that the op alone would not make (DESIGN.md).

The case that broke torchtitan's tensor parallelism (issue 37): gloo's reduce_scatter returns a
``LambdaWork`` that copies the result into the output inside ``wait()``. The recorder used to wait
on it from a thread of its own, so the output was written (and its version counter bumped) a
second time behind the caller's back, and selective activation checkpointing, which caches
``_c10d_functional.reduce_scatter_tensor`` outputs and checks their version in the recompute,
raised "Tensor cached during selective activation checkpoint has been mutated". Each worker runs
the same computations without meshprof and then with it (both kernels), and compares results bit
for bit and version counters exactly; the oracle is the run without meshprof, in the same process.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import pytest

from meshprof.launch.spawn import run_ranks

#: Long enough for a thread of the recorder that waited on the work to have done so (the old
#: wait thread ran within a millisecond of the op's return).
SETTLE_S = 0.05
DELAY_S = 0.2


def _computations(rank: int) -> dict[str, Any]:
    """Functional and explicit reduce_scatters under selective activation checkpointing, an
    async DTensor redistribute, and their version counters, without any meshprof call."""
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Shard
    from torch.utils.checkpoint import (
        CheckpointPolicy,
        checkpoint,
        create_selective_checkpoint_contexts,
    )

    out: dict[str, Any] = {}
    torch.manual_seed(0)
    w = torch.randn(16, 16, requires_grad=True)
    # torchtitan's policy (distributed/activation_checkpoint.py) saves these ops' outputs
    save = {torch.ops._c10d_functional.reduce_scatter_tensor.default, torch.ops.aten.mm.default}

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE

    def block(x: torch.Tensor) -> torch.Tensor:
        y = funcol.reduce_scatter_tensor(x @ w, "sum", scatter_dim=0, group=dist.group.WORLD)
        return torch.relu(y) * 2

    x = torch.randn(8, 16) + rank
    context = functools.partial(create_selective_checkpoint_contexts, policy)
    errors = []
    for _ in range(3):
        try:
            loss = checkpoint(block, x, use_reentrant=False, context_fn=context).sum()
            time.sleep(SETTLE_S)
            loss.backward()
        except RuntimeError as e:
            errors.append(str(e))
    out["sac_errors"] = errors
    out["sac_grad"] = None if w.grad is None else w.grad.clone()

    # a functional reduce_scatter's output: its version before and after the caller's wait
    y = torch.ops._c10d_functional.reduce_scatter_tensor(torch.ones(12) * (rank + 1), "sum", 2, "0")
    time.sleep(SETTLE_S)
    before = y._version
    torch.ops._c10d_functional.wait_tensor(y)
    out["funcol_versions"] = (before, y._version)
    out["funcol_value"] = y.clone()

    # an explicit async reduce_scatter, waited on from Python after the peer's injected delay
    rs_out = torch.empty(4)
    dist.barrier()
    if rank == 1:
        time.sleep(DELAY_S)
    t0 = time.perf_counter_ns()
    work = dist.reduce_scatter_tensor(rs_out, torch.arange(8.0) * (rank + 1), async_op=True)
    time.sleep(SETTLE_S)
    before = rs_out._version
    work.wait()
    out["explicit_wait_ns"] = time.perf_counter_ns() - t0
    out["explicit_versions"] = (before, rs_out._version)
    out["explicit_value"] = rs_out.clone()

    # DTensor: Partial -> Shard is a reduce_scatter, here left in flight (async_op=True)
    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(1)
    local = torch.randn(4, 6) * (rank + 1)
    d = DTensor.from_local(local, mesh, [Partial()])
    s = d.redistribute(mesh, [Shard(0)], async_op=True)
    time.sleep(SETTLE_S)
    out["redistribute"] = s.to_local().clone()
    return out


def _worker(rank: int, ws: int) -> dict[str, Any]:
    import torch

    import meshprof

    plain = _computations(rank)
    prof = meshprof.enable()
    issued = prof.log.total
    profiled = _computations(rank)
    prof.flush()
    deadline = time.monotonic() + 10
    while prof.inflight() and time.monotonic() < deadline:
        time.sleep(0.001)
    events = [e.to_dict() for e in prof.events(issued)]
    same = {
        k: (torch.equal(plain[k], profiled[k]) if isinstance(plain[k], torch.Tensor) else None)
        for k in plain
    }
    return {
        "plain": {k: v for k, v in plain.items() if not isinstance(v, torch.Tensor)},
        "profiled": {k: v for k, v in profiled.items() if not isinstance(v, torch.Tensor)},
        "same": same,
        "grad_defined": profiled["sac_grad"] is not None,
        "events": events,
        "inflight": len(prof.inflight()),
        "internal_errors": prof.internal_errors,
    }


@pytest.fixture(scope="module", params=["python", "native"])
def runs(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    native = request.param == "native"
    if native:
        from meshprof.comm import native_ext

        if not native_ext.cached():
            pytest.skip("the native recorder is not built (meshprof build-native)")
    env = {"MESHPROF_NATIVE": "1" if native else "0"}
    return run_ranks(_worker, 2, timeout=120, env=env, pg_timeout_s=30)


def test_selective_checkpointing_of_collective_outputs_unchanged(
    runs: list[dict[str, Any]],
) -> None:
    for r in runs:
        assert r["plain"]["sac_errors"] == []
        assert r["profiled"]["sac_errors"] == []  # was: "... has been mutated", every step
        assert r["grad_defined"]
        assert r["same"]["sac_grad"] is True  # gradients bit for bit


def test_version_counters_and_values_unchanged(runs: list[dict[str, Any]]) -> None:
    for r in runs:
        for key in ("funcol_versions", "explicit_versions"):
            assert r["profiled"][key] == r["plain"][key], key
        assert r["plain"]["funcol_versions"][0] == 0  # nothing wrote it before the wait
        for key in ("funcol_value", "explicit_value", "redistribute"):
            assert r["same"][key] is True, key


def test_reduce_scatter_completes_at_the_callers_wait(runs: list[dict[str, Any]]) -> None:
    """Every reduce_scatter is recorded once, completed (none left in flight), and the explicit
    one that waited for the delayed peer lasts as long as the caller's wait saw it."""
    for rank, r in enumerate(runs):
        assert r["internal_errors"] == 0
        assert r["inflight"] == 0
        rs = [e for e in r["events"] if e["op"] == "reduce_scatter"]
        # 3 checkpointed forwards (the recompute reuses the saved output) + functional +
        # explicit + redistribute
        assert len(rs) == 6, [e["op"] for e in r["events"]]
        assert all(e["status"] == "ok" and e["duration_ns"] > 0 for e in rs)
        explicit = [e for e in rs if e["in_bytes"] == 8 * 4 and e["out_bytes"] == 4 * 4]
        assert len(explicit) == 1
        if rank == 0:  # rank 0 waited for rank 1's delay: the op cannot end before it
            assert explicit[0]["duration_ns"] >= 0.5 * DELAY_S * 1e9
            assert explicit[0]["duration_ns"] <= r["profiled"]["explicit_wait_ns"]

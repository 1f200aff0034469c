"""Reads miss nothing: a collective that completed before a read of the recorder is in it.

DDP's C++ reducer waits on its bucket all_reduces inside ``loss.backward()``; nobody waits on
them from Python, so only the recorder's completion path notices they finished. A read right
after ``backward()`` (``events()``, ``stats()``, ``export_json``, a rank-file write) must
nevertheless contain every bucket. The oracle is PyTorch's Flight Recorder, which gloo fills
with every collective it enqueues (meshprof does not compute it).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from meshprof.launch.spawn import run_ranks
from native_helpers import require_native

WS = 4
ITERS = 25


def _fr_all_reduces() -> int:
    import torch

    entries = json.loads(torch._C._distributed_c10d._dump_fr_trace_json(True, True))["entries"]
    return sum(1 for e in entries if e["profiling_name"] == "gloo:all_reduce")


def _worker(rank: int, ws: int, iters: int) -> dict[str, Any]:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import meshprof

    prof = meshprof.enable()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
    # ~16 KiB per layer: several buckets per backward
    ddp = DDP(model, bucket_cap_mb=0.02)
    x = torch.randn(8, 64)
    misses: list[tuple[int, int, int, int]] = []
    for i in range(iters):
        before_fr = _fr_all_reduces()
        before = sum(1 for e in prof.events() if e.op == "all_reduce")
        ddp(x).sum().backward()
        # read at once: DDP's reducer has already waited on every bucket
        got = sum(1 for e in prof.events() if e.op == "all_reduce") - before
        want = _fr_all_reduces() - before_fr
        if got != want:
            misses.append((i, got, want, len(prof.inflight())))
    return {
        "misses": misses,
        "backend": prof.backend_name,
        "internal_errors": prof.internal_errors,
    }


@pytest.mark.parametrize("mode", ["python", "native"])
def test_read_after_ddp_backward_has_every_bucket(mode: str) -> None:
    env = {"TORCH_FR_BUFFER_SIZE": "20000"}
    if mode == "native":
        require_native()  # built once here, before the ranks start
        env["MESHPROF_NATIVE"] = "1"
    else:
        env["MESHPROF_NATIVE"] = "0"
    res = run_ranks(_worker, WS, (ITERS,), timeout=240, pg_timeout_s=60, env=env)
    for rank, r in enumerate(res):
        assert r["internal_errors"] == 0
        assert r["backend"] == mode
        assert r["misses"] == [], f"rank {rank}: (iteration, recorded, flight recorder, in flight)"

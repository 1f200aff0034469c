"""``@meshprof.performance_monitor`` on a training step: DDP plus a DTensor tensor-parallel layer.

Run it on 2 local CPU ranks (gloo) either way:

    torchrun --nproc-per-node 2 examples/train_with_decorator.py --out runs/deco
    python examples/train_with_decorator.py --nproc 2 --out runs/deco

then look at the files in runs/deco (traces, flops_step*.json, comm_step*.json, rank files) and
run ``meshprof report runs/deco``. On GPUs (NCCL) the same script writes CUDA traces and, with
``--memory-snapshot-step``, a memory snapshot for https://pytorch.org/memory_viz.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import meshprof

BATCH, IN, HIDDEN, OUT = 8, 16, 32, 8


def build_model(world_size: int, tp: bool) -> nn.ModuleDict:
    """A DDP MLP ("ddp") and, with ``tp``, a column/row-parallel MLP over all ranks ("tp")."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    parts: dict[str, nn.Module] = {
        "ddp": DDP(nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT)))
    }
    if tp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp",))
        mlp = nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, IN))
        parts["tp"] = parallelize_module(
            mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()}
        )
    return nn.ModuleDict(parts)


def main(
    rank: int, world_size: int, out_dir: str, steps: int = 7, options: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Train ``steps`` steps under the monitor; return what a test needs to check the files."""
    opts = {
        "tp": True,
        "wait": 1,
        "warmup": 1,
        "active": 2,
        "flop_counter_step": 4,
        "comm_logger_step": 5,
    }
    opts.update(options or {})
    tp = bool(opts.pop("tp"))
    model = build_model(world_size, tp)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor = meshprof.performance_monitor(model, out_dir=out_dir, **opts)

    @monitor
    def train_step(x: torch.Tensor) -> float:
        loss = model["ddp"](x).square().mean()
        if tp:
            loss = loss + model["tp"](x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach().item()

    g = torch.Generator().manual_seed(rank)
    losses = [train_step(torch.randn(BATCH, IN, generator=g)) for _ in range(steps)]
    monitor.close()
    prof = meshprof.get_profiler()
    assert prof is not None
    events = prof.events()
    return {
        "losses": losses,
        "per_step": {s: sum(1 for e in events if e.step == s) for s in range(steps)},
        "bytes_per_step": {
            s: sum(max(e.in_bytes, e.out_bytes) for e in events if e.step == s)
            for s in range(steps)
        },
        "failures": dict(getattr(monitor, "failures", {})),
        "files": [str(f) for f in getattr(monitor, "files", [])],
    }


def _cli() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/decorator", help="run directory")
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--nproc", type=int, default=2, help="ranks to start when not under torchrun")
    ap.add_argument("--no-tp", action="store_true", help="leave out the DTensor TP layer")
    ap.add_argument("--tensorboard", action="store_true")
    ap.add_argument("--wandb", action="store_true", help="W&B logging (WANDB_MODE=offline works)")
    ap.add_argument("--nsight", action="store_true", help="NVTX ranges (run under nsys)")
    ap.add_argument("--memory-snapshot-step", type=int, default=None)
    a = ap.parse_args()
    options = {
        "tp": not a.no_tp,
        "tensorboard": a.tensorboard,
        "wandb": a.wandb,
        "nsight": a.nsight,
        "memory_snapshot_step": a.memory_snapshot_step,
    }
    if "RANK" in os.environ:  # under torchrun
        dist.init_process_group("gloo")
        try:
            main(dist.get_rank(), dist.get_world_size(), a.out, a.steps, options)
        finally:
            dist.destroy_process_group()
        return 0
    from meshprof.launch.spawn import run_ranks

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import train_with_decorator as me  # picklable by name in the worker processes

    run_ranks(me.main, a.nproc, (a.out, a.steps, options), timeout=300)
    print(f"wrote {a.out}; now: meshprof report {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(_cli())

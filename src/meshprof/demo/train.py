"""The demo training loop, with the phases a step monitor can time.

``train(job, steps, seed=..., monitor=...)`` runs ``steps`` optimizer steps on synthetic tokens and
returns the loss of each step (the mean next-token cross entropy over the whole global batch),
identical on every rank. ``monitor`` is optional; when given it must offer the context managers
``monitor.step(tokens=..., samples=...)`` and ``monitor.phase(name)``. Phases: "data", then
"forward" and "backward" per micro-batch without pipeline parallelism, or one "forward_backward"
(the pipelining schedule interleaves them) with it, then "optimizer".
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

import torch
import torch.distributed as dist

from meshprof.demo.build import ParallelJob
from meshprof.demo.model import loss_fn, synthetic_batch


class StepMonitorLike(Protocol):
    """What :func:`train` needs of a step monitor (``meshprof.monitor.StepMonitor`` has it)."""

    def step(self, *, tokens: int, samples: int) -> contextlib.AbstractContextManager[Any]: ...

    def phase(self, name: str) -> contextlib.AbstractContextManager[Any]: ...


class _NoMonitor:
    def step(self, *, tokens: int, samples: int) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def phase(self, name: str) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()


def local_batch(job: ParallelJob, step: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This DP rank's slice (num_microbatches × micro_batch_size sequences) of the global batch."""
    cfg = job.config
    inputs, targets = synthetic_batch(
        step, seed=seed, batch_size=cfg.global_batch_size, cfg=job.model_cfg
    )
    n = cfg.num_microbatches * cfg.micro_batch_size
    lo = job.mapping.dp_rank * n
    return inputs[lo : lo + n].to(job.device), targets[lo : lo + n].to(job.device)


def _forward_backward_no_pp(
    job: ParallelJob, inputs: torch.Tensor, targets: torch.Tensor, mon: StepMonitorLike
) -> float:
    cfg = job.config
    model = job.chunks[0]
    mbs, n = cfg.micro_batch_size, cfg.num_microbatches
    total = 0.0
    for i in range(n):
        x, y = inputs[i * mbs : (i + 1) * mbs], targets[i * mbs : (i + 1) * mbs]
        with job.grad_sync(i == n - 1):
            with mon.phase("forward"), job.autocast():
                loss = loss_fn(model(x), y) / n
            with mon.phase("backward"):
                loss.backward()
        total += float(loss.detach())
    return total


def _forward_backward_pp(
    job: ParallelJob, inputs: torch.Tensor, targets: torch.Tensor, mon: StepMonitorLike
) -> float:
    losses: list[torch.Tensor] = []
    args = (inputs,) if job.has_first else ()
    with mon.phase("forward_backward"), job.autocast():
        if job.has_last:
            job.schedule.step(*args, target=targets, losses=losses)
        else:
            job.schedule.step(*args)
    if not job.has_last:
        return 0.0
    return float(torch.stack([loss.detach().double() for loss in losses]).mean())


def _global_loss(job: ParallelJob, local: float) -> float:
    """Mean loss over DP ranks, from the last pipeline stage, the same on every rank: one
    all_reduce on the default group (the last stage's TP ranks all hold the same value)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return local
    t = torch.tensor([local if job.has_last else 0.0], dtype=torch.float64, device=job.device)
    dist.all_reduce(t)
    return float(t.item()) / (job.config.dp * job.config.tp)


def train(
    job: ParallelJob, steps: int, *, seed: int = 0, monitor: StepMonitorLike | None = None
) -> list[float]:
    """Run ``steps`` optimizer steps; return the global-batch loss of each (same on all ranks)."""
    mon: StepMonitorLike = monitor if monitor is not None else _NoMonitor()
    cfg, mcfg = job.config, job.model_cfg
    for c in job.chunks:
        c.train()
    losses: list[float] = []
    for step in range(steps):
        with mon.step(tokens=cfg.global_batch_size * mcfg.seq_len, samples=cfg.global_batch_size):
            with mon.phase("data"):
                inputs, targets = local_batch(job, step, seed)
            if cfg.pp > 1:
                local = _forward_backward_pp(job, inputs, targets, mon)
            else:
                local = _forward_backward_no_pp(job, inputs, targets, mon)
            with mon.phase("optimizer"):
                job.optimizer.step()
                job.optimizer.zero_grad(set_to_none=True)
            losses.append(_global_loss(job, local))
    return losses


__all__ = ["StepMonitorLike", "local_batch", "train"]

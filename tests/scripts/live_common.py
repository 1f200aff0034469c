"""What the live-monitoring test jobs share: the process group, a tiny model with its optimizer
(optimizer steps make the steps), and the step's work outside collectives (slept)."""

import time

import torch
import torch.distributed as dist


def setup() -> tuple[int, torch.nn.Module, torch.optim.Optimizer]:
    """Join the gloo group; (rank, model, optimizer)."""
    dist.init_process_group("gloo")
    model = torch.nn.Linear(8, 8)
    return dist.get_rank(), model, torch.optim.SGD(model.parameters(), lr=0.01)


def busy(seconds: float) -> None:
    """The step's work outside collectives: ``seconds`` of wall time, slept. (A busy loop of
    Python would spend the CPU the other tests running beside it need, and the GIL meshprof's
    threads need; the figures these jobs are checked on are wall times around synchronous
    collectives, the same either way.)"""
    time.sleep(seconds)

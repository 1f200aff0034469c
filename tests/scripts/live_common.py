"""What the live-monitoring test jobs share: the process group, a tiny model with its optimizer
(optimizer steps make the steps), and a busy compute that the CPU time counts."""

import time

import torch
import torch.distributed as dist


def setup() -> tuple[int, torch.nn.Module, torch.optim.Optimizer]:
    """Join the gloo group; (rank, model, optimizer)."""
    dist.init_process_group("gloo")
    model = torch.nn.Linear(8, 8)
    return dist.get_rank(), model, torch.optim.SGD(model.parameters(), lr=0.01)


def busy(seconds: float) -> None:
    """Compute (not sleep) for ``seconds``."""
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1

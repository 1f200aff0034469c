"""A plain Hugging Face Accelerate training loop on 2 gloo CPU ranks, launched by torchrun.

``python accelerate_train.py STEPS``: ``Accelerator(cpu=True)`` prepares a small model (DDP), its
optimizer and a seeded random data loader, and the loop runs STEPS steps with
``accelerator.backward``. Writes, per rank: each step's loss at full precision, the steps run,
each step's end (``time.perf_counter_ns`` after ``optimizer.step``), the Flight Recorder's
collectives per step and a digest of the trained parameters.
"""

from __future__ import annotations

import hashlib
import sys
import time

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from flight import FlightCounter, write_result

WIDTH = 64


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    steps = int(sys.argv[1])
    accelerator = Accelerator(cpu=True)
    set_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU(), torch.nn.Linear(WIDTH, WIDTH)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(steps * 8 * accelerator.num_processes, WIDTH, generator=gen)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, torch.tanh(x.flip(1))), batch_size=8
    )
    model, opt, loader = accelerator.prepare(model, opt, loader)
    flight = FlightCounter()
    losses: list[float] = []
    ends: list[int] = []
    per_step: list[list[str]] = []
    for xb, yb in loader:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        accelerator.backward(loss)
        opt.step()
        ends.append(time.perf_counter_ns())
        per_step.append(flight.since_last())
        losses.append(float(loss.detach()))
        if len(losses) == steps:
            break
    write_result(
        {
            "losses": losses,
            "global_step": len(losses),
            "step_end_ns": ends,
            "flight": per_step,
            "params": digest(accelerator.unwrap_model(model)),
        }
    )
    accelerator.end_training()


if __name__ == "__main__":
    main()

"""PyTorch Lightning on 2 gloo CPU ranks, launched by torchrun (Lightning reads torchrun's
environment), with the strategy named on the command line.

``python lightning_train.py STRATEGY STEPS``: ``Trainer(accelerator="cpu", devices=2,
strategy=..., max_steps=STEPS)`` fits a small model on seeded random data. STRATEGY is "ddp", or
"fsdp2": Lightning's ``ModelParallelStrategy`` (FSDP2, ``fully_shard`` over its DeviceMesh in
``configure_model``), its sharded strategy that runs on CPU (``strategy="fsdp"`` requires a GPU
accelerator). Writes, per rank:
each step's loss at full precision, the Trainer's ``global_step``, each batch's end
(``on_train_batch_end``, ``time.perf_counter_ns``), the Flight Recorder's collectives per step
and a digest of the trained parameters.
"""

from __future__ import annotations

import hashlib
import sys
import time
from typing import Any

import lightning as L
import torch
from flight import FlightCounter, write_result

WIDTH = 64


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU(), torch.nn.Linear(WIDTH, WIDTH)
        )
        self.flight = FlightCounter()
        self.losses: list[float] = []
        self.ends: list[int] = []
        self.per_step: list[list[str]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.losses.append(float(loss.detach()))
        return loss

    def configure_model(self) -> None:
        mesh = getattr(self, "_device_mesh", None)
        if mesh is None:  # DDP
            return
        from torch.distributed.fsdp import fully_shard

        dp = mesh["data_parallel"]
        for layer in self.net:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=dp)
        fully_shard(self.net, mesh=dp)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.ends.append(time.perf_counter_ns())
        self.per_step.append(self.flight.since_last())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def digest(model: torch.nn.Module) -> str:
    """SHA-256 of this rank's parameters (its shards, under FSDP2)."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        local = p.to_local() if hasattr(p, "to_local") else p
        h.update(name.encode())
        h.update(local.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    strategy, steps = sys.argv[1], int(sys.argv[2])
    L.seed_everything(0, verbose=False)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(steps * 8 * 2, WIDTH, generator=gen)
    data = torch.utils.data.TensorDataset(x, torch.tanh(x.flip(1)))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    model = Model()
    if strategy == "fsdp2":
        from lightning.pytorch.strategies import ModelParallelStrategy

        chosen: Any = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
    else:
        chosen = strategy
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=chosen,
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, loader)
    write_result(
        {
            "losses": model.losses,
            "global_step": trainer.global_step,
            "step_end_ns": model.ends,
            "flight": model.per_step,
            "params": digest(model.net),
        }
    )


if __name__ == "__main__":
    main()

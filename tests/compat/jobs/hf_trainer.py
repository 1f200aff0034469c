"""The Hugging Face ``Trainer`` on 2 gloo CPU ranks (DDP), launched by torchrun.

``python hf_trainer.py MODEL_DIR STEPS``: trains the saved tiny Llama for STEPS optimizer steps
on seeded random tokens. Writes, per rank: each step's loss at full precision (the Trainer's own
logs round it to 4 digits), the Trainer's ``global_step``, each step's end
(``on_step_end``, ``time.perf_counter_ns``), the Flight Recorder's collectives per step and a
digest of the trained parameters.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import time
from typing import Any

import torch
from flight import FlightCounter, write_result
from transformers import (
    AutoModelForCausalLM,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

SEQ = 32


class RandomTokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int, vocab: int) -> None:
        gen = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, vocab, (n, SEQ), generator=gen)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Record(TrainerCallback):
    """Each step's end and the collectives the Flight Recorder saw in it."""

    def __init__(self) -> None:
        self.flight = FlightCounter()
        self.ends: list[int] = []
        self.per_step: list[list[str]] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.ends.append(time.perf_counter_ns())
        self.per_step.append(self.flight.since_last())


class LossTrainer(Trainer):
    """The Trainer, keeping each step's loss at full precision."""

    losses: list[float]

    def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        loss = super().training_step(*args, **kwargs)
        self.losses.append(float(loss.detach()))
        return loss


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    model_dir, steps = sys.argv[1], int(sys.argv[2])
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out_dir = tempfile.mkdtemp(prefix="hf-trainer-")
    args = TrainingArguments(
        output_dir=out_dir,
        max_steps=steps,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        dataloader_num_workers=0,
        seed=0,
        disable_tqdm=True,
    )
    record = Record()
    trainer = LossTrainer(
        model=model,
        args=args,
        train_dataset=RandomTokens(steps * 4 * int(os.environ["WORLD_SIZE"]), 128),
        callbacks=[record],
    )
    trainer.losses = []
    result = trainer.train()
    write_result(
        {
            "losses": trainer.losses,
            "global_step": trainer.state.global_step,
            "step_end_ns": record.ends,
            "flight": record.per_step,
            "train_runtime": result.metrics.get("train_runtime"),
            "params": digest(trainer.model),
        }
    )


if __name__ == "__main__":
    main()

"""Hugging Face transformers tensor-parallel generation on 2 gloo CPU ranks.

``python hf_generate_tp.py MODEL_DIR NEW_TOKENS``: loads the saved tiny Llama with
``distributed_config=DistributedConfig(tp_size=2)`` (transformers builds the process group and
its DeviceMesh itself), generates NEW_TOKENS greedily for a fixed prompt and writes, per rank: the
tokens, the number of model forward calls (one per generated token), each forward's own
start/end (``time.perf_counter_ns`` in hooks on the model) and the Flight Recorder's
collectives per forward.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch
from flight import FlightCounter, write_result
from transformers import AutoModelForCausalLM
from transformers.distributed import DistributedConfig


def main() -> None:
    model_dir, new_tokens = sys.argv[1], int(sys.argv[2])
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, distributed_config=DistributedConfig(tp_size=2), dtype=torch.float32
    )
    model.eval()
    flight = FlightCounter()
    forwards: list[dict[str, Any]] = []

    def pre(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        forwards.append({"t0": time.perf_counter_ns(), "before": flight.since_last()})

    def post(module: torch.nn.Module, args: Any, kwargs: Any, out: Any) -> None:
        forwards[-1]["t1"] = time.perf_counter_ns()

    model.register_forward_pre_hook(pre, with_kwargs=True)
    model.register_forward_hook(post, with_kwargs=True)
    prompt = torch.tensor([[1, 17, 42, 7, 99, 3, 64, 23]])
    with torch.no_grad():
        out = model.generate(
            prompt,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    after = flight.since_last()
    # each forward's collectives: what the Flight Recorder added between its start and the next
    per_forward = [f["before"] for f in forwards[1:]] + [after]
    write_result(
        {
            "tokens": out[0].tolist(),
            "forwards": len(forwards),
            "forward_ns": [f["t1"] - f["t0"] for f in forwards],
            "flight": per_forward,
        }
    )
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

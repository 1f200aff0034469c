"""An unmodified Hugging Face ``generate()`` with tensor-parallel weights, for ``meshprof run``.

A tiny random Llama (from its config, no download) on every rank, its attention and MLP made
column/row parallel over all ranks with DTensor's ``parallelize_module`` (transformers' own TP
plan needs a checkpoint to load), and one greedy ``generate()`` of PROMPTS prompts of different
lengths (left padding) × NEW new tokens, no end-of-sequence token. Nothing of meshprof is
imported. Its own truth, taken with its own clock and its own forward hook, goes to OUT (JSON):
when ``generate`` was called and returned, when each forward ended, and when each token was
chosen (its own stopping criterion, which never stops: ``generate`` calls it once a step, with
the step's new token; a streaming client would see it then).

usage: hf_generate_tp.py OUT [PROMPTS] [NEW]
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from transformers import LlamaConfig, LlamaForCausalLM, StoppingCriteria, StoppingCriteriaList


class _Stamp(StoppingCriteria):
    """Notes the time each step's token was chosen; never stops."""

    def __init__(self) -> None:
        self.times: list[int] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kw: object) -> torch.Tensor:
        self.times.append(time.time_ns())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def main() -> None:
    out = sys.argv[1]
    prompts = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    new = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
        bos_token_id=1,
        eos_token_id=None,
        pad_token_id=0,
    )
    model = LlamaForCausalLM(cfg).eval()
    mesh = init_device_mesh("cpu", (world,))
    plan = {
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(),
    }
    for layer in model.model.layers:
        parallelize_module(layer, mesh, plan)
    forwards: list[int] = []
    model.register_forward_hook(lambda m, a, o: forwards.append(time.time_ns()))
    lengths = [5 + 3 * i for i in range(prompts)]
    width = max(lengths)
    g = torch.Generator().manual_seed(1)
    ids = torch.zeros(prompts, width, dtype=torch.int64)
    mask = torch.zeros(prompts, width, dtype=torch.int64)
    for i, n in enumerate(lengths):
        ids[i, width - n :] = torch.randint(2, cfg.vocab_size, (n,), generator=g)
        mask[i, width - n :] = 1
    stamp = _Stamp()
    called = time.time_ns()
    result = model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=new,
        min_new_tokens=new,
        do_sample=False,
        stopping_criteria=StoppingCriteriaList([stamp]),
    )
    returned = time.time_ns()
    truth = {
        "rank": rank,
        "called_ns": called,
        "returned_ns": returned,
        "forward_end_ns": forwards,
        "token_ns": stamp.times,
        "prompt_tokens": lengths,
        "new_tokens": int(result.shape[1] - width),
    }
    with open(os.path.join(out, f"truth{rank}.json"), "w") as f:
        json.dump(truth, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""The demo model: a small decoder-only transformer, and the synthetic tokens it trains on.

The module layout follows torchtitan so that torch's parallel engines can be pointed at names:
``tok_embeddings``, ``pos_embeddings``, ``layers`` (a ModuleDict "0", "1", … so a pipeline stage
keeps its own blocks under their original names), ``norm``, ``output``. A pipeline stage is the
same class with the parts it does not own set to None; its forward takes token ids on the first
stage and hidden states elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from meshprof.parallel.model_config import ModelConfig


class Attention(nn.Module):
    """Causal multi-head self-attention. Under TP, wq/wk/wv are column-parallel and wo
    row-parallel, so a rank sees n_heads / tp heads; the head count is read from the shapes."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.head_dim = cfg.head_dim
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, d, bias=False)
        self.wv = nn.Linear(d, d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    """GELU MLP: w1 column-parallel, w2 row-parallel under TP."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=False)
        self.w2 = nn.Linear(cfg.ffn_hidden, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then + mlp(norm(·))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(cfg.d_model)
        self.attention = Attention(cfg)
        self.ffn_norm = nn.LayerNorm(cfg.d_model)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """Decoder-only transformer, or a pipeline stage of one (parts it does not own are None)."""

    def __init__(self, cfg: ModelConfig, num_layers: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_embeddings: nn.Embedding | None = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(cfg) for i in range(num_layers)})
        self.norm: nn.LayerNorm | None = nn.LayerNorm(cfg.d_model)
        self.output: nn.Linear | None = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        if self.tok_embeddings is not None:
            assert self.pos_embeddings is not None
            pos = torch.arange(x.shape[1], device=x.device)
            h = self.tok_embeddings(x) + self.pos_embeddings(pos)
        for layer in self.layers.values():
            h = layer(h)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h)
        return h

    def keep_only(self, layers: Iterable[int], *, first: bool, last: bool) -> Transformer:
        """Turn this model into a pipeline stage in place: keep the given blocks, the embeddings
        if ``first`` and the final norm and output if ``last``; returns self."""
        keep = {str(i) for i in layers}
        for name in list(self.layers.keys()):
            if name not in keep:
                del self.layers[name]
        if not first:
            self.tok_embeddings = None
            self.pos_embeddings = None
        if not last:
            self.norm = None
            self.output = None
        return self


def build_model(
    cfg: ModelConfig, num_layers: int, *, seed: int, dtype: torch.dtype = torch.float32
) -> Transformer:
    """The full model with weights that depend only on ``seed`` (so every rank and every layout
    starts from the same weights)."""
    gen_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = Transformer(cfg, num_layers)
    finally:
        torch.random.set_rng_state(gen_state)
    return model.to(dtype)


def apply_tensor_parallel(model: Transformer, tp_mesh: Any) -> None:
    """Shard each block of ``model`` over ``tp_mesh`` (a 1-D device mesh): the attention's
    q/k/v and the first feed-forward projection column-wise, the output projections row-wise
    (Megatron's plan: one all-reduce after the attention and one after the feed-forward)."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    plan = {
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(),
    }
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, plan)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy over all tokens of the batch (nats per token)."""
    return F.cross_entropy(
        logits.flatten(0, 1).float()
        if logits.dtype in (torch.bfloat16, torch.float16)
        else logits.flatten(0, 1),
        targets.flatten(),
    )


def synthetic_batch(
    step: int, *, seed: int, batch_size: int, cfg: ModelConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets (``batch_size`` × ``seq_len`` int64) of the global batch of ``step``.

    Every sequence follows x[t+1] = (5·x[t] + 7) mod vocab, with 10% of the tokens replaced by
    random ones, from a random first token; a model can learn the rule, so the loss falls from
    about ln(vocab) towards the noise floor. The batch depends only on (seed, step): every layout
    sees the same tokens, and DP ranks take consecutive slices of it.
    """
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    n, v = cfg.seq_len + 1, cfg.vocab_size
    seq = torch.empty(batch_size, n, dtype=torch.int64)
    seq[:, 0] = torch.randint(v, (batch_size,), generator=g)
    noise = torch.rand(batch_size, n, generator=g) < 0.1
    rand_tokens = torch.randint(v, (batch_size, n), generator=g)
    for t in range(1, n):
        nxt = (seq[:, t - 1] * 5 + 7) % v
        seq[:, t] = torch.where(noise[:, t], rand_tokens[:, t], nxt)
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


__all__ = [
    "Transformer",
    "TransformerBlock",
    "build_model",
    "loss_fn",
    "synthetic_batch",
]

"""A small GPT (decoder-only transformer) for the GPU benchmarks: pre-norm blocks with causal
``scaled_dot_product_attention``, a 4x GELU MLP and an untied LM head, trained in bf16 autocast.

Its FLOPs per step are known analytically (PaLM, appendix B: 6 FLOPs per parameter of the
matrix multiplications per token, plus 12 * layers * seq_len * d_model per token for the
attention scores and values, computed as if not causal, as FlopCounterMode counts them), the
independent figure the MFU checks compare meshprof's against. Imported by the benchmarks
(``sys.path`` holds benchmarks/); nothing here is a test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 16384
    d_model: int = 768
    layers: int = 6
    heads: int = 12
    seq_len: int = 1024
    batch: int = 8

    @property
    def tokens(self) -> int:
        return self.batch * self.seq_len

    def matmul_params(self) -> int:
        """Parameters that take part in a matrix multiplication (biases left out): per block
        QKV (3 d²), the output projection (d²) and the MLP (8 d²); the LM head (d x vocab)."""
        d = self.d_model
        return self.layers * 12 * d * d + d * self.vocab

    def flops_per_step(self) -> int:
        """Forward + backward FLOPs of one training step (PaLM's count)."""
        per_token = 6 * self.matmul_params() + 12 * self.layers * self.seq_len * self.d_model
        return per_token * self.tokens


def build(cfg: GPTConfig, device: Any) -> Any:
    """The model (float32 parameters) on ``device``."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            d = cfg.d_model
            self.ln1 = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.ln2 = nn.LayerNorm(d)
            self.fc = nn.Linear(d, 4 * d)
            self.out = nn.Linear(4 * d, d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            h = cfg.heads
            q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(cfg.vocab, cfg.d_model)
            self.pos = nn.Parameter(torch.zeros(cfg.seq_len, cfg.d_model))
            self.blocks = nn.ModuleList(Block() for _ in range(cfg.layers))
            self.ln = nn.LayerNorm(cfg.d_model)
            self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            x = self.emb(idx) + self.pos
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln(x))

    torch.manual_seed(0)
    return GPT().to(device)


def batch(cfg: GPTConfig, device: Any, seed: int = 0) -> tuple[Any, Any]:
    """Random tokens and their next-token targets."""
    import torch

    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq_len + 1), generator=g)
    return idx[:, :-1].to(device), idx[:, 1:].to(device)


def loss_fn(model: Any, x: Any, y: Any) -> Any:
    import torch
    from torch.nn import functional as F

    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=x.is_cuda):
        logits = model(x)
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))


def ddp_train_step(cfg: GPTConfig, device: Any) -> tuple[Any, Any]:
    """The model under DDP (the default process group) on ``device``, and one training step
    (forward, backward, AdamW, zero_grad) returning the loss tensor, without waiting for it."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    cuda = torch.device(device).type == "cuda"
    model = DDP(build(cfg, device), device_ids=[torch.device(device).index] if cuda else None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
    x, y = batch(cfg, device)

    def train_step() -> Any:
        loss = loss_fn(model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return model, train_step

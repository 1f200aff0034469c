"""The demo transformer served with a KV cache, tensor-parallel with DTensor.

Each rank builds the full model from the seed, then ``parallelize_module`` makes every block's
attention and MLP column/row parallel over the tensor-parallel mesh (as the training demo does):
a rank holds n_heads / tp heads and their slice of the KV cache; the row-parallel projections
all-reduce their outputs, so every rank holds the same hidden states and the same logits, and
greedy sampling picks the same token on every rank.

A request's prompt is prefilled in one forward (causal attention over the prompt, its keys and
values cached per layer); each decode forward then takes the last token of every running
request (a batch of them), appends each request's key and value to its cache and attends over
it. ``slow_s`` > 0 sleeps that long inside the first block (between two collectives) of each
decode forward: the fault a test injects on one rank. ``device_s`` > 0 sleeps that long in every
forward, spread over the blocks (between their collectives): the time a GPU would compute while
the host waits, leaving the CPU to the other processes of a small machine.
"""

from __future__ import annotations

import time
from typing import Any, cast

import torch
import torch.nn.functional as F

from meshprof.demo.model import Transformer, TransformerBlock, apply_tensor_parallel, build_model
from meshprof.parallel.model_config import ModelConfig


class ServingModel:
    """The demo model with per-request KV caches (see the module docstring)."""

    def __init__(self, cfg: ModelConfig, num_layers: int, seed: int, tp_mesh: Any = None) -> None:
        self.cfg = cfg
        self.model: Transformer = build_model(cfg, num_layers, seed=seed).eval()
        if tp_mesh is not None and tp_mesh.size() > 1:
            apply_tensor_parallel(self.model, tp_mesh)
        self.cache: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        """request id → per layer (keys, values), each [local heads, tokens, head dim]."""
        self.slow_s = 0.0
        """Seconds slept inside each decode forward (0: none)."""
        self.device_s = 0.0
        """Seconds slept in every forward, spread over the blocks (0: none)."""

    def blocks(self) -> list[TransformerBlock]:
        """The transformer blocks, in order."""
        return [cast(TransformerBlock, b) for b in self.model.layers.values()]

    def _embed(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        m = self.model
        assert m.tok_embeddings is not None and m.pos_embeddings is not None
        return m.tok_embeddings(tokens) + m.pos_embeddings(pos)

    def _logits_argmax(self, h: torch.Tensor) -> list[int]:
        m = self.model
        assert m.norm is not None and m.output is not None
        return [int(t) for t in m.output(m.norm(h)).argmax(dim=-1).tolist()]

    @torch.no_grad()
    def prefill(self, rid: int, prompt: list[int]) -> int:
        """Fill request ``rid``'s cache with its prompt; its first output token."""
        hd = self.cfg.head_dim
        x = torch.tensor([prompt], dtype=torch.int64)
        s = x.shape[1]
        h = self._embed(x, torch.arange(s))
        caches = []
        for layer in self.blocks():
            att = layer.attention
            a = layer.attention_norm(h)
            q = att.wq(a).view(1, s, -1, hd).transpose(1, 2)
            k = att.wk(a).view(1, s, -1, hd).transpose(1, 2)
            v = att.wv(a).view(1, s, -1, hd).transpose(1, 2)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            caches.append((k[0], v[0]))
            h = h + att.wo(out.transpose(1, 2).reshape(1, s, -1))
            self._device()
            h = h + layer.feed_forward(layer.ffn_norm(h))
        self.cache[rid] = caches
        return self._logits_argmax(h[:, -1])[0]

    @torch.no_grad()
    def decode(self, rids: list[int], last: list[int], positions: list[int]) -> list[int]:
        """One decode forward over the running requests ``rids`` (their last tokens at
        ``positions``); the next token of each."""
        hd = self.cfg.head_dim
        b = len(rids)
        h = self._embed(
            torch.tensor(last, dtype=torch.int64)[:, None],
            torch.tensor(positions, dtype=torch.int64)[:, None],
        )
        for li, layer in enumerate(self.blocks()):
            att = layer.attention
            a = layer.attention_norm(h)
            q = att.wq(a).view(b, 1, -1, hd).transpose(1, 2)
            k = att.wk(a).view(b, 1, -1, hd).transpose(1, 2)
            v = att.wv(a).view(b, 1, -1, hd).transpose(1, 2)
            outs = []
            for i, rid in enumerate(rids):
                kc, vc = self.cache[rid][li]
                kc = torch.cat([kc, k[i]], dim=1)
                vc = torch.cat([vc, v[i]], dim=1)
                self.cache[rid][li] = (kc, vc)
                outs.append(F.scaled_dot_product_attention(q[i : i + 1], kc[None], vc[None]))
            out = torch.cat(outs)
            h = h + att.wo(out.transpose(1, 2).reshape(b, 1, -1))
            if li == 0 and self.slow_s > 0:
                time.sleep(self.slow_s)
            self._device()
            h = h + layer.feed_forward(layer.ffn_norm(h))
        return self._logits_argmax(h[:, 0])

    def _device(self) -> None:
        if self.device_s > 0:
            time.sleep(self.device_s / len(self.model.layers))

    def drop(self, rid: int) -> None:
        """Free a finished request's cache."""
        self.cache.pop(rid, None)


__all__ = ["ServingModel"]

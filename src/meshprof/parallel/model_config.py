"""The demo transformer's sizes (kept free of torch so the CLI can parse them cheaply)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from meshprof.errors import MeshprofError
from meshprof.parallel.parallel_config import require_positive_ints


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Sizes of the demo transformer (the number of layers is ``ParallelConfig.num_layers``)."""

    d_model: int = 64
    """Hidden size (width of the residual stream)."""
    n_heads: int = 4
    """Attention heads; d_model must be divisible by it, and tp must divide it."""
    ffn_mult: int = 4
    """MLP hidden size = ffn_mult × d_model."""
    vocab_size: int = 256
    """Token vocabulary (synthetic tokens are drawn from it)."""
    seq_len: int = 32
    """Tokens per sequence."""

    def __post_init__(self) -> None:
        require_positive_ints(self, ("d_model", "n_heads", "ffn_mult", "vocab_size", "seq_len"))
        if self.d_model % self.n_heads:
            raise MeshprofError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}"
            )
        if self.vocab_size < 2:
            raise MeshprofError(f"vocab_size={self.vocab_size} must be at least 2")

    @property
    def ffn_hidden(self) -> int:
        """MLP hidden size."""
        return self.ffn_mult * self.d_model

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def block_params(self) -> int:
        """Parameters of one transformer block (4 d² attention, 2 d·f MLP, two LayerNorms)."""
        d, f = self.d_model, self.ffn_hidden
        return 4 * d * d + 2 * d * f + 4 * d

    def embedding_params(self) -> int:
        """Token and position embeddings."""
        return (self.vocab_size + self.seq_len) * self.d_model

    def head_params(self) -> int:
        """Final LayerNorm and output projection."""
        return 2 * self.d_model + self.d_model * self.vocab_size

    def num_params(self, num_layers: int) -> int:
        return self.embedding_params() + num_layers * self.block_params() + self.head_params()

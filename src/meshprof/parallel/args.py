"""Command-line options shared by ``meshprof plan`` and ``meshprof demo``: the layout and the
model's sizes, turned into :class:`ParallelConfig` and :class:`ModelConfig`."""

from __future__ import annotations

import argparse
import enum
from typing import Any

from meshprof.parallel import parallel_config as layout
from meshprof.parallel.model_config import ModelConfig


def _add_choice(g: Any, flag: str, choices: type[enum.Enum], default: str, help_text: str) -> None:
    """An option that takes one of an enum's values by name."""
    g.add_argument(flag, choices=[m.value for m in choices], default=default, help=help_text)


_SAME_NAME = (
    "micro_batch_size",
    "schedule",
    "virtual_stages",
    "mixed_precision",
    "memory_strategy",
    "dp_mode",
    "grad_compression",
)
"""ParallelConfig fields set by the option of the same name."""


def add_layout_args(
    p: argparse.ArgumentParser, *, default_layers: int = 4, default_microbatches: int = 4
) -> None:
    """The 3D layout: degrees, pipeline schedule, memory, precision and gradient options."""
    g = p.add_argument_group("layout")
    g.add_argument("--dp", type=int, default=None, help="data-parallel degree")
    g.add_argument("--tp", type=int, default=None, help="tensor-parallel degree")
    g.add_argument("--pp", type=int, default=None, help="pipeline-parallel degree")
    g.add_argument(
        "--layers",
        type=int,
        default=default_layers,
        help=f"transformer blocks (default {default_layers})",
    )
    g.add_argument(
        "--micro-batch-size", type=int, default=2, help="sequences per micro-batch (default 2)"
    )
    g.add_argument(
        "--microbatches",
        type=int,
        default=default_microbatches,
        help=f"micro-batches per step and DP rank (default {default_microbatches})",
    )
    _add_choice(
        g, "--schedule", layout.PipelineSchedule, "1f1b", "pipeline schedule (default 1f1b)"
    )
    g.add_argument(
        "--virtual-stages",
        type=int,
        default=1,
        help="pipeline chunks per rank (interleaved/looped ≥ 2, V schedules 2)",
    )
    _add_choice(
        g,
        "--memory-strategy",
        layout.MemoryStrategy,
        "standard",
        "basic, standard (ZeRO-3), aggressive (+checkpointing), extreme (+CPU offload)",
    )
    g.add_argument(
        "--activation-checkpointing",
        choices=("on", "off"),
        default=None,
        help="override the strategy's checkpointing",
    )
    _add_choice(
        g, "--dp-mode", layout.DataParallelMode, "fsdp", "FSDP2 fully_shard or DDP (default fsdp)"
    )
    _add_choice(
        g, "--mixed-precision", layout.Precision, "none", "compute precision (default none)"
    )
    _add_choice(
        g,
        "--grad-compression",
        layout.GradCompression,
        "none",
        "DP gradient compression (powersgd needs --dp-mode ddp)",
    )
    g.add_argument(
        "--comm-timeout",
        type=float,
        default=600.0,
        help="process-group timeout in seconds (default 600)",
    )


def add_model_args(
    p: argparse.ArgumentParser,
    *,
    d_model: int = 64,
    heads: int = 4,
    vocab: int = 256,
    seq_len: int = 32,
) -> None:
    """The transformer's sizes."""
    g = p.add_argument_group("model size")
    g.add_argument("--d-model", type=int, default=d_model, help=f"hidden size (default {d_model})")
    g.add_argument("--heads", type=int, default=heads, help=f"attention heads (default {heads})")
    g.add_argument(
        "--ffn-mult", type=int, default=4, help="MLP hidden size = ffn-mult × d-model (default 4)"
    )
    g.add_argument("--vocab", type=int, default=vocab, help=f"vocabulary size (default {vocab})")
    g.add_argument(
        "--seq-len", type=int, default=seq_len, help=f"tokens per sequence (default {seq_len})"
    )


def parallel_config_from_args(
    args: argparse.Namespace, *, default: tuple[int, int, int] = (1, 1, 1)
) -> layout.ParallelConfig:
    """A ParallelConfig from the layout options; degrees not given come from ``default``
    (dp, tp, pp) when none is given, else 1. Raises MeshprofError on bad values."""
    given = (args.dp, args.tp, args.pp)
    dp, tp, pp = (
        default if all(v is None for v in given) else tuple(1 if v is None else v for v in given)
    )
    ac = None if args.activation_checkpointing is None else args.activation_checkpointing == "on"
    return layout.ParallelConfig(
        dp=dp,
        tp=tp,
        pp=pp,
        num_layers=args.layers,
        num_microbatches=args.microbatches,
        activation_checkpointing=ac,
        comm_timeout_s=args.comm_timeout,
        **{name: getattr(args, name) for name in _SAME_NAME},
    )


def model_config_from_args(args: argparse.Namespace) -> ModelConfig:
    """A ModelConfig from the model-size options. Raises MeshprofError on bad values."""
    return ModelConfig(
        d_model=args.d_model,
        n_heads=args.heads,
        ffn_mult=args.ffn_mult,
        vocab_size=args.vocab,
        seq_len=args.seq_len,
    )


__all__ = [
    "add_layout_args",
    "add_model_args",
    "model_config_from_args",
    "parallel_config_from_args",
]

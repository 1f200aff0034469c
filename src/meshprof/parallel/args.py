"""Command-line options shared by ``meshprof plan`` and ``meshprof demo``: the layout and the
model's sizes, turned into :class:`ParallelConfig` and :class:`ModelConfig`."""

from __future__ import annotations

import argparse

from meshprof.parallel.config import (
    DataParallelMode,
    GradCompression,
    MemoryStrategy,
    ParallelConfig,
    PipelineSchedule,
    Precision,
)
from meshprof.parallel.model_config import ModelConfig


def _choices(enum_cls: type) -> list[str]:
    return [m.value for m in enum_cls]  # type: ignore[attr-defined]


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
    g.add_argument(
        "--schedule",
        choices=_choices(PipelineSchedule),
        default="1f1b",
        help="pipeline schedule (default 1f1b)",
    )
    g.add_argument(
        "--virtual-stages",
        type=int,
        default=1,
        help="pipeline chunks per rank (interleaved/looped ≥ 2, V schedules 2)",
    )
    g.add_argument(
        "--memory-strategy",
        choices=_choices(MemoryStrategy),
        default="standard",
        help="basic, standard (ZeRO-3), aggressive (+checkpointing), extreme (+CPU offload)",
    )
    g.add_argument(
        "--activation-checkpointing",
        choices=("on", "off"),
        default=None,
        help="override the strategy's checkpointing",
    )
    g.add_argument(
        "--dp-mode",
        choices=_choices(DataParallelMode),
        default="fsdp",
        help="FSDP2 fully_shard or DDP (default fsdp)",
    )
    g.add_argument(
        "--mixed-precision",
        choices=_choices(Precision),
        default="none",
        help="compute precision (default none)",
    )
    g.add_argument(
        "--grad-compression",
        choices=_choices(GradCompression),
        default="none",
        help="DP gradient compression (powersgd needs --dp-mode ddp)",
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
) -> ParallelConfig:
    """A ParallelConfig from the layout options; degrees not given come from ``default``
    (dp, tp, pp) when none is given, else 1. Raises MeshprofError on bad values."""
    given = (args.dp, args.tp, args.pp)
    dp, tp, pp = (
        default if all(v is None for v in given) else tuple(1 if v is None else v for v in given)
    )
    ac = None if args.activation_checkpointing is None else args.activation_checkpointing == "on"
    return ParallelConfig(
        dp=dp,
        tp=tp,
        pp=pp,
        num_layers=args.layers,
        micro_batch_size=args.micro_batch_size,
        num_microbatches=args.microbatches,
        schedule=args.schedule,
        virtual_stages=args.virtual_stages,
        activation_checkpointing=ac,
        mixed_precision=args.mixed_precision,
        memory_strategy=args.memory_strategy,
        dp_mode=args.dp_mode,
        grad_compression=args.grad_compression,
        comm_timeout_s=args.comm_timeout,
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

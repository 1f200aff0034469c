"""Per-device memory estimate of the demo transformer under a 3D-parallel layout.

Counts the bytes of parameters, gradients, AdamW state and saved activations a rank holds at its
peak (the start of the backward pass of the last micro-batch that is in flight), for every memory
strategy. The assumptions are in :data:`ASSUMPTIONS` (and in the result, so renderers can show them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from meshprof.parallel.mapping import RankMapping
from meshprof.parallel.model_config import ModelConfig
from meshprof.parallel.parallel_config import (
    DataParallelMode,
    MemoryStrategy,
    ParallelConfig,
    PipelineSchedule,
    Precision,
    strategy_settings,
)

ASSUMPTIONS: tuple[str, ...] = (
    "Parameters, gradients and the two AdamW moments are stored in the parameter dtype (param_bytes each).",
    "Saved activations per block and micro-batch (b sequences × s tokens, width d, MLP width f, tensor-parallel degree t): "
    "b·s·d·(4 + 5/t) + 2·b·s·f/t elements — block input, both LayerNorm outputs, the residual sum, q, k, v, "
    "the attention output and its re-layout, and the MLP pre- and post-GELU (fused CPU/flash attention: no s×s scores).",
    "With activation checkpointing a block keeps only its input (b·s·d); backward recomputes one block at a time.",
    "The last stage keeps the final LayerNorm input and output (2·b·s·d) and the log-softmax (b·s·vocab); its backward "
    "adds two b·s·vocab gradients. A pipeline stage also keeps each in-flight micro-batch's output (b·s·d).",
    "Micro-batches in flight on pipeline rank r: GPipe all n; 1F1B min(n, pp − r); interleaved/zero-bubble as torch's "
    "warm-up, (v − 1)·n_round + 2·(pp − 1 − r) + 1 chunks; looped BFS all n·v chunks; V schedules as interleaved with v = 2; "
    "without pipelining 1 (gradient accumulation).",
    "FSDP (dp > 1): parameters, gradients and optimizer state are divided by dp; while computing, the root chunk's "
    "parameters (embeddings, head) stay gathered and two blocks (current + prefetched) are gathered with reshard-after-forward "
    "(standard and above), all blocks without it (basic); one block's unsharded gradients and their reduce-scatter "
    "input buffer exist before its reduce-scatter.",
    "DDP (dp > 1): full replicas; gradients are copied into flat buckets, so gradient memory is counted twice.",
    "Extreme offloads sharded parameters, gradients and optimizer state to host memory on CUDA only; on CPU it equals aggressive.",
    "Mixed precision: activations in 2 bytes; parameters, gradients and optimizer state stay in param_bytes.",
    "Not counted: allocator fragmentation and caching, communication buffers, pipeline receive buffers, the CUDA context.",
)


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """Estimated peak bytes on one device."""

    strategy: str
    """Memory strategy this breakdown is for."""
    pp_rank: int
    """Pipeline rank of the device (stages differ: the first holds the embeddings, the last the head)."""
    params_bytes: int
    """Parameters the device keeps (its DP shard under FSDP), plus FSDP's gathered copies while computing."""
    grads_bytes: int
    """Gradients (DP shard under FSDP, plus one block's unsharded gradients; doubled by DDP buckets)."""
    optimizer_bytes: int
    """AdamW first and second moments."""
    activations_bytes: int
    """Saved activations of the micro-batches in flight, with the strategy's checkpointing setting."""
    activations_no_ckpt_bytes: int
    """Saved activations without activation checkpointing."""
    activations_ckpt_bytes: int
    """Saved activations with activation checkpointing of every block."""
    transient_bytes: int
    """Short-lived buffers at the peak (logit gradients, one recomputed block)."""
    microbatches_in_flight: float
    """Micro-batches (in units of this rank's whole stage) whose activations are held at once."""
    offloaded_bytes: int
    """Bytes moved to host memory by CPU offload (not counted in ``total_bytes``)."""

    @property
    def total_bytes(self) -> int:
        """Peak device bytes: parameters + gradients + optimizer + activations + transient."""
        return (
            self.params_bytes
            + self.grads_bytes
            + self.optimizer_bytes
            + self.activations_bytes
            + self.transient_bytes
        )


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """Estimates for every pipeline rank under the configured strategy and, per strategy, the
    busiest device."""

    config: ParallelConfig
    """The layout estimated."""
    model: ModelConfig
    """The model's sizes."""
    param_bytes: int
    """Bytes per parameter element (4 for float32, 8 for float64)."""
    per_stage: tuple[MemoryBreakdown, ...]
    """One breakdown per pipeline rank (index = pp_rank) under ``config.memory_strategy``."""
    by_strategy: tuple[MemoryBreakdown, ...]
    """The busiest device under each memory strategy (basic, standard, aggressive, extreme)."""
    assumptions: tuple[str, ...] = ASSUMPTIONS
    """What the numbers assume."""

    @property
    def peak(self) -> MemoryBreakdown:
        """The busiest device under the configured strategy."""
        return max(self.per_stage, key=lambda b: b.total_bytes)


def _inflight(config: ParallelConfig, pp_rank: int) -> float:
    """Micro-batches in flight on ``pp_rank``, in units of the rank's whole stage (all chunks)."""
    n, pp, v = config.num_microbatches, config.pp, config.virtual_stages
    if pp == 1:
        return 1.0
    sched = config.schedule
    if sched is PipelineSchedule.GPIPE:
        return float(n)
    if sched is PipelineSchedule.ONE_F_ONE_B:
        return float(min(n, pp - pp_rank))
    if sched is PipelineSchedule.LOOPED_BFS:
        return float(n)
    rounds = max(1, n // pp)
    per_round = n // rounds
    chunks = min((v - 1) * per_round + 2 * (pp - 1 - pp_rank) + 1, n * v)
    return chunks / v


def _breakdown(
    config: ParallelConfig,
    model: ModelConfig,
    pp_rank: int,
    strategy: MemoryStrategy,
    param_bytes: int,
    device_type: str,
) -> MemoryBreakdown:
    st = strategy_settings(strategy)
    # an explicit activation_checkpointing overrides only the configured strategy's own setting
    override = config.activation_checkpointing is not None and strategy is config.memory_strategy
    ckpt = bool(config.activation_checkpointing) if override else st.activation_checkpointing
    d, f, t, V = model.d_model, model.ffn_hidden, config.tp, model.vocab_size
    b, s = config.micro_batch_size, model.seq_len
    e = param_bytes
    a = 2 if config.mixed_precision is not Precision.NONE else e
    mapping = RankMapping(config, pp_rank)  # rank (0, 0, pp_rank) is global rank pp_rank
    stages = mapping.stage_indices()
    n_blocks = len(mapping.layers())
    first = 0 in stages
    last = config.num_stages - 1 in stages if config.pp > 1 else True

    block_p = (4 * d * d + 2 * d * f) // t + 4 * d
    root_p = (model.embedding_params() if first else 0) + (model.head_params() if last else 0)
    p_rank = n_blocks * block_p + root_p

    fsdp = config.dp > 1 and config.dp_mode is DataParallelMode.FSDP
    ddp = config.dp > 1 and config.dp_mode is DataParallelMode.DDP
    offload = fsdp and st.cpu_offload and device_type == "cuda"
    if fsdp:
        shard = math.ceil(p_rank / config.dp)
        gathered = root_p + (
            min(2, n_blocks) * block_p if st.reshard_after_forward else n_blocks * block_p
        )
        params = (0 if offload else shard) + gathered
        grads = (0 if offload else shard) + 2 * block_p
        optim = 0 if offload else 2 * shard
        offloaded = 4 * shard if offload else 0
    else:
        params, grads, optim, offloaded = p_rank, p_rank * (2 if ddp else 1), 2 * p_rank, 0

    bsd = b * s * d
    per_block = bsd * (4 + 5 / t) + 2 * b * s * f / t
    head = (2 * bsd + b * s * V) if last else 0
    stage_out = bsd * len(stages) if config.pp > 1 else 0
    inflight = _inflight(config, pp_rank)
    act_full = inflight * (n_blocks * per_block + head + stage_out)
    act_ckpt = inflight * (n_blocks * bsd + head + stage_out)
    transient = (2 * b * s * V if last else 0) + (per_block if ckpt else 0)
    return MemoryBreakdown(
        strategy=str(strategy),
        pp_rank=pp_rank,
        params_bytes=int(params * e),
        grads_bytes=int(grads * e),
        optimizer_bytes=int(optim * e),
        activations_bytes=int((act_ckpt if ckpt else act_full) * a),
        activations_no_ckpt_bytes=int(act_full * a),
        activations_ckpt_bytes=int(act_ckpt * a),
        transient_bytes=int(transient * a),
        microbatches_in_flight=inflight,
        offloaded_bytes=int(offloaded * e),
    )


def estimate_memory(
    config: ParallelConfig, model: ModelConfig, *, param_bytes: int = 4, device_type: str = "cuda"
) -> MemoryEstimate:
    """Estimated peak memory per device of the demo transformer trained with AdamW under
    ``config``, for every pipeline rank and every memory strategy (see :data:`ASSUMPTIONS`).

    ``param_bytes``: bytes per parameter element (4 for float32). ``device_type``: "cuda" or
    "cpu" (CPU offload only moves bytes off a CUDA device).
    """
    config.validate(n_heads=model.n_heads, hidden=model.d_model, ffn_hidden=model.ffn_hidden)
    per_stage = tuple(
        _breakdown(config, model, r, config.memory_strategy, param_bytes, device_type)
        for r in range(config.pp)
    )
    by_strategy = tuple(
        max(
            (
                _breakdown(config, model, r, strat, param_bytes, device_type)
                for r in range(config.pp)
            ),
            key=lambda x: x.total_bytes,
        )
        for strat in MemoryStrategy
    )
    return MemoryEstimate(
        config=config,
        model=model,
        param_bytes=param_bytes,
        per_stage=per_stage,
        by_strategy=by_strategy,
    )


__all__ = ["ASSUMPTIONS", "MemoryBreakdown", "MemoryEstimate", "estimate_memory"]

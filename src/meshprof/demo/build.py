"""Build the 3D-parallel demo job with PyTorch's own engine.

Order (as torchtitan does it): DeviceMesh (dp, tp, pp) → the full model from a seed → keep this
rank's pipeline chunks → tensor parallel (``parallelize_module``, column/row-parallel attention and
MLP) → activation checkpointing (``checkpoint_wrapper``) → data parallel (FSDP2 ``fully_shard``
per block and per chunk, or ``DistributedDataParallel`` with optional communication hooks) →
``PipelineStage`` per chunk and a ``torch.distributed.pipelining`` schedule → AdamW.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from meshprof.demo.model import Transformer, apply_tensor_parallel, build_model, loss_fn
from meshprof.parallel.mapping import RankMapping
from meshprof.parallel.mesh import build_mesh
from meshprof.parallel.model_config import ModelConfig
from meshprof.parallel.parallel_config import (
    DataParallelMode,
    GradCompression,
    ParallelConfig,
    Precision,
)

_LOW_PRECISION = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}
_REDUCE_DTYPE = {GradCompression.BF16: torch.bfloat16, GradCompression.FP16: torch.float16}


@dataclass
class ParallelJob:
    """Everything one rank needs to train: its chunks, pipeline schedule and optimizer."""

    config: ParallelConfig
    """The layout."""
    model_cfg: ModelConfig
    """The model's sizes."""
    mapping: RankMapping
    """This rank's coordinates and groups."""
    device: torch.device
    """Where parameters and activations live."""
    mesh: Any
    """The (dp, tp, pp) DeviceMesh, or None for a single process without torch.distributed."""
    chunks: list[nn.Module]
    """This rank's model chunks in stage order (wrapped by DDP/FSDP as configured)."""
    optimizer: torch.optim.Optimizer
    """AdamW over this rank's parameters (DP shards under FSDP)."""
    schedule: Any = None
    """The pipelining schedule when pp > 1."""
    stages: list[Any] = field(default_factory=list)
    """The ``PipelineStage`` objects when pp > 1."""
    has_first: bool = True
    """This rank runs pipeline stage 0 (it consumes the token ids)."""
    has_last: bool = True
    """This rank runs the last pipeline stage (it computes the loss)."""
    autocast_dtype: torch.dtype | None = None
    """Low-precision dtype used through ``torch.autocast`` (when FSDP does not cast)."""
    comm_hook_state: Any = None
    """The DDP communication hook's state (PowerSGD keeps error feedback there)."""

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The autocast context for forward (and pipeline steps), or a null context."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def grad_sync(self, enabled: bool) -> contextlib.AbstractContextManager[Any]:
        """Context in which backward does (or, for accumulation, does not) reduce DP gradients."""
        from torch.distributed.fsdp import FSDPModule
        from torch.nn.parallel import DistributedDataParallel

        stack = contextlib.ExitStack()
        for c in self.chunks:
            if isinstance(c, FSDPModule):
                c.set_requires_gradient_sync(enabled)
            elif isinstance(c, DistributedDataParallel) and not enabled:
                stack.enter_context(c.no_sync())
        return stack


def _apply_ac(chunk: Transformer) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for name, block in list(chunk.layers.items()):
        chunk.layers[name] = checkpoint_wrapper(block, preserve_rng_state=False)


def _apply_fsdp(
    chunk: Transformer, config: ParallelConfig, dp_mesh: Any, device: torch.device
) -> nn.Module:
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
    )

    s = config.settings
    mp = MixedPrecisionPolicy(
        param_dtype=_LOW_PRECISION.get(config.mixed_precision),
        reduce_dtype=_REDUCE_DTYPE.get(config.grad_compression),
    )
    offload: OffloadPolicy = (
        CPUOffloadPolicy() if s.cpu_offload and device.type == "cuda" else OffloadPolicy()
    )
    for block in chunk.layers.values():
        fully_shard(
            block,
            mesh=dp_mesh,
            reshard_after_forward=s.reshard_after_forward,
            mp_policy=mp,
            offload_policy=offload,
        )
    fully_shard(
        chunk,
        mesh=dp_mesh,
        reshard_after_forward=s.reshard_after_forward,
        mp_policy=mp,
        offload_policy=offload,
    )
    return chunk


def _apply_ddp(
    chunk: Transformer, config: ParallelConfig, dp_group: Any, device: torch.device
) -> tuple[nn.Module, Any]:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel

    if config.tp > 1:
        from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform

        _pre_dp_module_transform(chunk)
    kwargs: dict[str, Any] = {}
    if config.grad_compression is GradCompression.POWERSGD and dist.get_backend(dp_group) == "gloo":
        # PowerSGD issues its all_reduces from the completion callbacks of the previous ones;
        # with several buckets gloo runs those callbacks on different threads, so two ranks can
        # issue the buckets' all_reduces in different orders and gloo fails with a size
        # mismatch. One bucket keeps a single chain.
        kwargs["bucket_cap_mb"] = 1 << 14
    ddp = DistributedDataParallel(
        chunk,
        process_group=dp_group,
        device_ids=[device.index] if device.type == "cuda" else None,
        **kwargs,
    )
    state: Any = None
    if config.grad_compression is GradCompression.FP16:
        ddp.register_comm_hook(dp_group, default_hooks.fp16_compress_hook)
    elif config.grad_compression is GradCompression.BF16:
        ddp.register_comm_hook(dp_group, default_hooks.bf16_compress_hook)
    elif config.grad_compression is GradCompression.POWERSGD:
        state = powerSGD_hook.PowerSGDState(
            process_group=dp_group,
            matrix_approximation_rank=config.powersgd_rank,
            start_powerSGD_iter=2,
            use_error_feedback=True,
            warm_start=True,
        )
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    return ddp, state


def _schedule(config: ParallelConfig, stages: list[Any]) -> Any:
    from torch.distributed.pipelining import schedules

    cls = getattr(schedules, config.schedule.torch_class_name)
    if config.schedule.is_multi_stage:
        return cls(
            stages, n_microbatches=config.num_microbatches, loss_fn=loss_fn, scale_grads=True
        )
    return cls(stages[0], n_microbatches=config.num_microbatches, loss_fn=loss_fn, scale_grads=True)


def build_job(
    config: ParallelConfig,
    model_cfg: ModelConfig,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    lr: float = 3e-3,
) -> ParallelJob:
    """Build this rank's part of the 3D-parallel demo model.

    With torch.distributed initialized the world size must equal dp×tp×pp; without it only the
    1×1×1 layout is possible (a plain single-process model). Weights depend only on ``seed``,
    so every layout starts from the same model.
    """
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    config.validate(
        world, n_heads=model_cfg.n_heads, hidden=model_cfg.d_model, ffn_hidden=model_cfg.ffn_hidden
    )
    dev = torch.device(device) if device is not None else torch.device("cpu")
    mapping = RankMapping(config, rank)
    mesh: Any = build_mesh(config, dev.type) if dist.is_initialized() else None

    stage_ids = mapping.stage_indices()
    per = config.layers_per_stage
    chunks: list[nn.Module] = []
    hook_state: Any = None
    for s in stage_ids:
        chunk = build_model(model_cfg, config.num_layers, seed=seed, dtype=dtype)
        if config.pp > 1:
            chunk.keep_only(
                range(s * per, (s + 1) * per), first=s == 0, last=s == config.num_stages - 1
            )
        chunk.to(dev)
        if config.tp > 1:
            apply_tensor_parallel(chunk, mesh["tp"])
        if config.settings.activation_checkpointing:
            _apply_ac(chunk)
        wrapped: nn.Module = chunk
        if config.dp > 1 and config.dp_mode is DataParallelMode.FSDP:
            wrapped = _apply_fsdp(chunk, config, mesh["dp"], dev)
        elif config.dp > 1:
            wrapped, hook_state = _apply_ddp(chunk, config, mesh["dp"].get_group(), dev)
        chunks.append(wrapped)

    fsdp_casts = config.dp > 1 and config.dp_mode is DataParallelMode.FSDP
    autocast_dtype = None if fsdp_casts else _LOW_PRECISION.get(config.mixed_precision)
    params = [p for c in chunks for p in c.parameters()]
    # foreach=False: under TP a chunk mixes DTensor (sharded) and plain (replicated) parameters,
    # which one foreach kernel call cannot take together.
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, foreach=False)
    job = ParallelJob(
        config,
        model_cfg,
        mapping,
        dev,
        mesh,
        chunks,
        optimizer,
        autocast_dtype=autocast_dtype,
        comm_hook_state=hook_state,
    )
    if config.pp > 1:
        from torch.distributed.pipelining import PipelineStage

        pp_group = mesh["pp"].get_group()
        job.stages = [
            PipelineStage(
                c, stage_index=s, num_stages=config.num_stages, device=dev, group=pp_group
            )
            for c, s in zip(chunks, stage_ids, strict=True)
        ]
        job.schedule = _schedule(config, job.stages)
        job.has_first = 0 in stage_ids
        job.has_last = config.num_stages - 1 in stage_ids
    return job


__all__ = ["ParallelJob", "build_job"]

"""The 3D-parallel layout: :class:`ParallelConfig` and its validation.

A layout is ``dp × tp × pp`` ranks (data, tensor and pipeline parallel) plus how the pipeline is
scheduled and how memory and gradients are handled. :meth:`ParallelConfig.validate` checks a layout
against a world size and a model and raises :class:`~meshprof.errors.MeshprofError` with a message
that names the field and the numbers.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass
from typing import Any

from meshprof.errors import MeshprofError


class _Choice(str, enum.Enum):
    """A setting chosen by name; prints as its value (``str(Precision.BF16) == "bf16"``)."""

    def __str__(self) -> str:
        return str(self.value)


def require_positive_ints(owner: object, names: tuple[str, ...]) -> None:
    """Raise :class:`MeshprofError` naming the first of ``owner``'s fields ``names`` that is not
    a positive integer (bools are refused too)."""
    for name in names:
        v = getattr(owner, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise MeshprofError(f"{name}={v!r} must be a positive integer")


class PipelineSchedule(_Choice):
    """A ``torch.distributed.pipelining`` schedule, by the name meshprof uses for it."""

    GPIPE = "gpipe"
    """``ScheduleGPipe``: all forwards, then all backwards; holds every micro-batch's activations."""
    ONE_F_ONE_B = "1f1b"
    """``Schedule1F1B``: one forward, one backward; stage r holds at most pp - r micro-batches."""
    INTERLEAVED_1F1B = "interleaved_1f1b"
    """``ScheduleInterleaved1F1B``: 1F1B over ``virtual_stages`` looped chunks per rank."""
    LOOPED_BFS = "looped_bfs"
    """``ScheduleLoopedBFS``: looped chunks, breadth first (all micro-batches of a chunk at once)."""
    INTERLEAVED_ZERO_BUBBLE = "interleaved_zero_bubble"
    """``ScheduleInterleavedZeroBubble``: interleaved with backward split into input and weight."""
    ZBV_ZERO_BUBBLE = "zbv_zero_bubble"
    """``ScheduleZBVZeroBubble``: zero-bubble V schedule, exactly 2 chunks per rank."""
    DUALPIPE_V = "dualpipe_v"
    """``ScheduleDualPipeV``: DeepSeek's DualPipe in V shape, exactly 2 chunks per rank."""

    @property
    def torch_class_name(self) -> str:
        """The class name in ``torch.distributed.pipelining.schedules``."""
        return _TORCH_SCHEDULE[self]

    @property
    def is_multi_stage(self) -> bool:
        """Whether a rank runs several pipeline chunks (``PipelineScheduleMulti``)."""
        return self not in (PipelineSchedule.GPIPE, PipelineSchedule.ONE_F_ONE_B)

    @property
    def is_v_shape(self) -> bool:
        """Whether chunks are placed in a V (rank r holds stages r and 2·pp − 1 − r)."""
        return self in (PipelineSchedule.ZBV_ZERO_BUBBLE, PipelineSchedule.DUALPIPE_V)


_TORCH_SCHEDULE = {
    PipelineSchedule.GPIPE: "ScheduleGPipe",
    PipelineSchedule.ONE_F_ONE_B: "Schedule1F1B",
    PipelineSchedule.INTERLEAVED_1F1B: "ScheduleInterleaved1F1B",
    PipelineSchedule.LOOPED_BFS: "ScheduleLoopedBFS",
    PipelineSchedule.INTERLEAVED_ZERO_BUBBLE: "ScheduleInterleavedZeroBubble",
    PipelineSchedule.ZBV_ZERO_BUBBLE: "ScheduleZBVZeroBubble",
    PipelineSchedule.DUALPIPE_V: "ScheduleDualPipeV",
}


class MemoryStrategy(_Choice):
    """How hard to trade compute and transfers for memory. See :func:`strategy_settings`."""

    BASIC = "basic"
    """Nothing saved: FSDP keeps parameters gathered from forward to backward (ZeRO-2 like),
    no activation checkpointing, no offload."""
    STANDARD = "standard"
    """FSDP reshards parameters after forward (ZeRO-3), no activation checkpointing."""
    AGGRESSIVE = "aggressive"
    """``standard`` plus full activation checkpointing of every transformer block."""
    EXTREME = "extreme"
    """``aggressive`` plus CPU offload of parameters, gradients and optimizer state
    (FSDP2 ``CPUOffloadPolicy``). Offload needs CUDA; on a CPU run it changes nothing."""


@dataclass(frozen=True, slots=True)
class StrategySettings:
    """What a :class:`MemoryStrategy` turns on."""

    reshard_after_forward: bool
    """FSDP frees the gathered parameters after each block's forward and gathers them again for
    backward (ZeRO-3) instead of keeping them until backward (ZeRO-2)."""
    activation_checkpointing: bool
    """Every transformer block keeps only its input and recomputes the rest in backward."""
    cpu_offload: bool
    """Sharded parameters, gradients and optimizer state live in host memory (CUDA only)."""


_STRATEGIES = {
    MemoryStrategy.BASIC: StrategySettings(False, False, False),
    MemoryStrategy.STANDARD: StrategySettings(True, False, False),
    MemoryStrategy.AGGRESSIVE: StrategySettings(True, True, False),
    MemoryStrategy.EXTREME: StrategySettings(True, True, True),
}


def strategy_settings(strategy: MemoryStrategy | str) -> StrategySettings:
    """The switches a memory strategy turns on."""
    return _STRATEGIES[MemoryStrategy(strategy)]


class Precision(_Choice):
    """Compute precision of the forward and backward pass."""

    NONE = "none"
    """Compute in the parameters' dtype."""
    BF16 = "bf16"
    """bfloat16 compute (FSDP2 ``MixedPrecisionPolicy`` when FSDP wraps, ``autocast`` otherwise)."""
    FP16 = "fp16"
    """float16 compute, as ``bf16``."""


class DataParallelMode(_Choice):
    """Which torch engine runs the data-parallel dimension."""

    FSDP = "fsdp"
    """FSDP2 ``fully_shard`` on the ``dp`` mesh dimension (parameters, gradients and optimizer
    state sharded over DP ranks)."""
    DDP = "ddp"
    """``DistributedDataParallel`` over the ``dp`` group (everything replicated; gradients
    all-reduced; supports communication hooks)."""


class GradCompression(_Choice):
    """How data-parallel gradients are compressed before they are communicated."""

    NONE = "none"
    """Gradients are reduced in their own dtype."""
    FP16 = "fp16"
    """Reduced in float16: DDP ``fp16_compress_hook``, FSDP2 ``reduce_dtype=float16``."""
    BF16 = "bf16"
    """Reduced in bfloat16: DDP ``bf16_compress_hook``, FSDP2 ``reduce_dtype=bfloat16``."""
    POWERSGD = "powersgd"
    """Low-rank PowerSGD (DDP ``powerSGD_hook``); lossy, needs ``dp_mode=ddp``."""


def _enum(cls: type[enum.Enum], value: Any, name: str) -> Any:
    try:
        return cls(value)
    except ValueError:
        choices = ", ".join(str(m.value) for m in cls)  # type: ignore[attr-defined]
        raise MeshprofError(f"{name}={value!r} is not one of: {choices}") from None


@dataclass(frozen=True, slots=True)
class ParallelConfig:
    """A 3D-parallel layout: rank ``r`` has coordinates (dp_rank, tp_rank, pp_rank) with PP
    varying fastest, then TP, then DP (see :class:`~meshprof.parallel.mapping.RankMapping`)."""

    dp: int = 1
    """Data-parallel degree: replicas (or FSDP shards) that each see a different part of the batch."""
    tp: int = 1
    """Tensor-parallel degree: ranks that split every attention and MLP matrix (Megatron style)."""
    pp: int = 1
    """Pipeline-parallel degree: ranks that each hold a contiguous slice of the layers."""
    num_layers: int = 4
    """Transformer blocks in the model; split evenly over ``pp × virtual_stages`` pipeline stages."""
    micro_batch_size: int = 2
    """Sequences per micro-batch on one DP rank."""
    num_microbatches: int = 4
    """Micro-batches per step on one DP rank (pipeline micro-batches, or gradient accumulation
    when pp = 1). Global batch = dp × num_microbatches × micro_batch_size sequences."""
    schedule: PipelineSchedule = PipelineSchedule.ONE_F_ONE_B
    """Pipeline schedule (ignored when pp = 1)."""
    virtual_stages: int = 1
    """Pipeline chunks per rank: 1 for GPipe and 1F1B, ≥ 2 for the looped/interleaved schedules,
    exactly 2 for the V schedules."""
    activation_checkpointing: bool | None = None
    """Recompute each block's activations in backward. None: as the memory strategy says."""
    mixed_precision: Precision = Precision.NONE
    """Compute precision of forward and backward (parameters and optimizer stay in full precision)."""
    memory_strategy: MemoryStrategy = MemoryStrategy.STANDARD
    """Memory/compute trade-off; see :class:`MemoryStrategy` for what each level turns on."""
    dp_mode: DataParallelMode = DataParallelMode.FSDP
    """Engine of the DP dimension: FSDP2 ``fully_shard`` or ``DistributedDataParallel``."""
    grad_compression: GradCompression = GradCompression.NONE
    """Compression of DP gradient communication."""
    powersgd_rank: int = 1
    """Matrix approximation rank of PowerSGD (only with ``grad_compression=powersgd``)."""
    comm_timeout_s: float = 600.0
    """Timeout of the process groups in seconds: a collective that waits longer fails."""

    def __post_init__(self) -> None:
        require_positive_ints(
            self,
            (
                "dp",
                "tp",
                "pp",
                "num_layers",
                "micro_batch_size",
                "num_microbatches",
                "virtual_stages",
                "powersgd_rank",
            ),
        )
        if not self.comm_timeout_s > 0:
            raise MeshprofError(
                f"comm_timeout_s={self.comm_timeout_s!r} must be a positive number of seconds"
            )
        object.__setattr__(self, "schedule", _enum(PipelineSchedule, self.schedule, "schedule"))
        object.__setattr__(
            self, "mixed_precision", _enum(Precision, self.mixed_precision, "mixed_precision")
        )
        object.__setattr__(
            self, "memory_strategy", _enum(MemoryStrategy, self.memory_strategy, "memory_strategy")
        )
        object.__setattr__(self, "dp_mode", _enum(DataParallelMode, self.dp_mode, "dp_mode"))
        object.__setattr__(
            self,
            "grad_compression",
            _enum(GradCompression, self.grad_compression, "grad_compression"),
        )

    @property
    def world_size(self) -> int:
        """dp × tp × pp."""
        return self.dp * self.tp * self.pp

    @property
    def num_stages(self) -> int:
        """Pipeline stages in total: pp × virtual_stages."""
        return self.pp * self.virtual_stages

    @property
    def layers_per_stage(self) -> int:
        """Transformer blocks in one pipeline stage (chunk)."""
        return self.num_layers // self.num_stages

    @property
    def global_batch_size(self) -> int:
        """Sequences per optimizer step over all DP ranks."""
        return self.dp * self.num_microbatches * self.micro_batch_size

    @property
    def settings(self) -> StrategySettings:
        """The memory strategy's switches, with ``activation_checkpointing`` overriding its own."""
        s = strategy_settings(self.memory_strategy)
        if self.activation_checkpointing is None:
            return s
        return StrategySettings(
            s.reshard_after_forward, bool(self.activation_checkpointing), s.cpu_offload
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (enums as their string values)."""
        return {k: (v.value if isinstance(v, enum.Enum) else v) for k, v in asdict(self).items()}

    def validate(
        self,
        world_size: int | None = None,
        *,
        n_heads: int | None = None,
        hidden: int | None = None,
        ffn_hidden: int | None = None,
    ) -> ParallelConfig:
        """Check the layout; raise :class:`MeshprofError` naming the field and numbers. Returns self.

        ``world_size``: the number of ranks the job has. ``n_heads``, ``hidden``, ``ffn_hidden``:
        the model's attention heads, width and MLP width, which tp must divide.
        """
        if world_size is not None and self.world_size != world_size:
            raise MeshprofError(
                f"dp×tp×pp = {self.dp}×{self.tp}×{self.pp} = {self.world_size} ranks, but the world size is {world_size}"
            )
        self._validate_pipeline()
        for name, value in (
            ("attention heads", n_heads),
            ("hidden size", hidden),
            ("MLP hidden size", ffn_hidden),
        ):
            if value is not None and value % self.tp != 0:
                raise MeshprofError(f"tp={self.tp} does not divide the {name} ({value})")
        if (
            self.grad_compression is GradCompression.POWERSGD
            and self.dp_mode is not DataParallelMode.DDP
        ):
            raise MeshprofError(
                "grad_compression=powersgd needs dp_mode=ddp (it is a DDP communication hook)"
            )
        if self.grad_compression is not GradCompression.NONE and self.dp == 1:
            raise MeshprofError(
                f"grad_compression={self.grad_compression} needs dp > 1 (there are no DP gradients to communicate with dp=1)"
            )
        if self.memory_strategy is MemoryStrategy.EXTREME and self.dp_mode is DataParallelMode.DDP:
            raise MeshprofError(
                "memory_strategy=extreme offloads FSDP shards to CPU and needs dp_mode=fsdp"
            )
        return self

    def _validate_pipeline(self) -> None:
        sched, v, n = self.schedule, self.virtual_stages, self.num_microbatches
        if self.pp == 1:
            if v != 1:
                raise MeshprofError(
                    f"virtual_stages={v} needs pp > 1 (there is no pipeline with pp=1)"
                )
            if self.num_layers < 1:
                raise MeshprofError("num_layers must be at least 1")
            return
        if sched.is_v_shape and v != 2:
            raise MeshprofError(f"schedule={sched} needs virtual_stages=2 (got {v})")
        if sched.is_multi_stage and not sched.is_v_shape and v < 2:
            raise MeshprofError(
                f"schedule={sched} runs several chunks per rank: set virtual_stages ≥ 2 (got {v})"
            )
        if not sched.is_multi_stage and v != 1:
            raise MeshprofError(
                f"schedule={sched} runs one chunk per rank: virtual_stages must be 1 (got {v}); use interleaved_1f1b for more"
            )
        stages = self.num_stages
        if self.num_layers % stages != 0:
            what = (
                f"pp×virtual_stages = {self.pp}×{v} = {stages} stages"
                if v > 1
                else f"pp={self.pp} stages"
            )
            raise MeshprofError(f"num_layers={self.num_layers} is not divisible into {what}")
        if sched is PipelineSchedule.ONE_F_ONE_B and n < self.pp:
            raise MeshprofError(
                f"schedule=1f1b needs num_microbatches ≥ pp: got {n} micro-batches for pp={self.pp}"
            )
        if sched is PipelineSchedule.DUALPIPE_V and n < stages:
            raise MeshprofError(
                f"schedule=dualpipe_v needs num_microbatches ≥ 2·pp = {stages}: got {n}"
            )
        if sched in (PipelineSchedule.INTERLEAVED_1F1B, PipelineSchedule.INTERLEAVED_ZERO_BUBBLE):
            rounds = max(1, n // self.pp)
            if n % rounds != 0:
                raise MeshprofError(
                    f"schedule={sched} needs num_microbatches to be a multiple of the rounds "
                    f"(num_microbatches // pp = {rounds}): got {n} micro-batches for pp={self.pp}; use a multiple of {self.pp}"
                )


__all__ = [
    "DataParallelMode",
    "GradCompression",
    "MemoryStrategy",
    "ParallelConfig",
    "PipelineSchedule",
    "Precision",
    "StrategySettings",
    "require_positive_ints",
    "strategy_settings",
]

"""What the step analysis needs to know besides the recorded data: :class:`StepOptions`."""

from __future__ import annotations

from dataclasses import dataclass, field

from meshprof.analyze.compute.workload import Workload
from meshprof.config import BottleneckThresholds
from meshprof.layout import Layout
from meshprof.records.rank_meta import MonitorSettings


@dataclass(frozen=True, kw_only=True, slots=True)
class StepOptions:
    """Settings of one rank's step analysis (the step monitor's, or a rank file's ``monitor``
    meta)."""

    rank: int = 0
    """The analyzed rank (reported as is)."""
    layout: Layout | None = None
    """The dp × tp × pp layout that names each process group's parallel dimension."""
    schedule: str = ""
    """Pipeline schedule name (GPipe, 1F1B, interleaved 1F1B, ...), for the bubble's theory."""
    microbatches: int = 0
    """Micro-batches per pipeline step (0: unknown)."""
    virtual_stages: int = 1
    """Virtual stages per rank of an interleaved schedule."""
    flops_per_step: float | None = None
    """FLOPs of one step (None: no FLOP figures)."""
    peak_tflops: float | None = None
    """Peak TFLOP/s of the device, for MFU (None: no MFU)."""
    thresholds: BottleneckThresholds = field(default_factory=BottleneckThresholds)
    """Thresholds of the bottleneck rules."""
    warmup_steps: int = 0
    """Steps left out at the start (at most all but one)."""
    skip_steps: tuple[int, ...] = ()
    """Step numbers left out besides (meshprof's own instrumented steps: the FLOP counter's,
    torch.profiler's, a capture's), unless that would leave none."""
    workload: Workload = Workload.UNKNOWN
    """Whether the rank trains (:func:`meshprof.analyze.compute.workload.workload_of`): the
    bottleneck rules give gradient advice only to a training rank (a training phase among the
    analysed phases also says so)."""

    @classmethod
    def from_meta(
        cls,
        meta: MonitorSettings | None,
        *,
        rank: int = 0,
        layout: Layout | None = None,
        workload: Workload = Workload.UNKNOWN,
    ) -> StepOptions:
        """The options a step monitor wrote into a rank file's meta
        (:meth:`meshprof.monitor.StepMonitor.to_meta`); missing entries take the defaults."""
        m = meta if meta is not None else MonitorSettings()
        return cls(
            rank=rank,
            layout=layout,
            workload=workload,
            schedule=str(m.schedule or ""),
            microbatches=int(m.microbatches or 0),
            virtual_stages=int(m.virtual_stages or 1),
            flops_per_step=m.flops_per_step,
            peak_tflops=m.peak_tflops,
            thresholds=BottleneckThresholds(**m.thresholds)
            if m.thresholds is not None
            else BottleneckThresholds(),
            warmup_steps=int(m.warmup_steps or 0),
            skip_steps=tuple(int(s) for s in m.instrumented_steps or ()),
        )

"""The FLOP counter part: runs ``flop_counter_step`` under ``torch.utils.flop_counter.
FlopCounterMode`` and writes ``flops_step{N}.json`` (FLOPs per module and op, the step's wall
time in ns, achieved TFLOP/s, MFU as a fraction 0..1 when the peak is known).

The counted step runs slower than usual; the FLOP count (not the time) is what later steps use
for their TFLOP/s.
"""

from __future__ import annotations

import json
from typing import Any

from meshprof.perfmon.context import PerfmonContext, StepState
from meshprof.records.perfmon import FlopsReport, ModuleFlops


class FlopCounterPart:
    """Counts the FLOPs of one step; sets ``ctx.flops_per_step`` and the step monitor's."""

    name = "FLOP counter"

    def __init__(self, ctx: PerfmonContext) -> None:
        self.ctx = ctx
        self._mode: Any = None

    def before_step(self, st: StepState) -> None:
        if st.step != self.ctx.config.flop_counter_step:
            return
        from torch.utils.flop_counter import FlopCounterMode

        self.ctx.mon.mark_instrumented(st.step)
        self._mode = st.stack.enter_context(FlopCounterMode(display=False))

    def after_step(self, st: StepState) -> None:
        mode, self._mode = self._mode, None
        if mode is None:
            return
        report = self.report(mode, st.step, st.t1_ns - st.t0_ns)
        self.ctx.flops_per_step = float(report.total_flops)
        self.ctx.mon.flops_per_step = float(report.total_flops)
        from meshprof.rundir.atomic import atomic_write_text

        path = self.ctx.path(f"flops_step{st.step}", ".json")
        atomic_write_text(path, json.dumps(report.to_dict(), indent=2))
        self.ctx.files.append(path)
        if self.ctx.rank == 0:
            from meshprof.render.perfmon_text import flops_summary

            self.ctx.say(flops_summary(report))

    def report(self, mode: Any, step: int, dur_ns: int) -> FlopsReport:
        """The counts of ``mode`` (a FlopCounterMode that has exited) for a step of ``dur_ns``."""
        from meshprof.monitor.flop_counter import mfu

        total = int(mode.get_total_flops())
        modules = {}
        for mod, ops in mode.get_flop_counts().items():
            counts = {str(op): int(n) for op, n in ops.items()}
            modules[mod] = ModuleFlops(total=sum(counts.values()), ops=counts)
        peak = getattr(self.ctx.mon, "peak_tflops", None)
        tflops, util = mfu(total, dur_ns / 1e9, peak)
        return FlopsReport(
            step=step,
            rank=self.ctx.rank,
            total_flops=total,
            step_time_ns=dur_ns,
            achieved_tflops=tflops,
            peak_tflops=peak,
            mfu=util,
            modules=modules,
        )

    def close(self) -> None:
        self._mode = None

"""The memory snapshot part: records the CUDA caching allocator's history during
``memory_snapshot_step`` and dumps it as ``memory_snapshot_rank{r}_step{N}.pickle`` (open it in
https://pytorch.org/memory_viz). Without CUDA it does nothing (rank 0 says so at start).
"""

from __future__ import annotations

from meshprof.perfmon.context import PerfmonContext, StepState

#: Allocation events the allocator keeps in its history (a ring; older ones are dropped).
MAX_ENTRIES = 100_000


class MemorySnapshotPart:
    """One CUDA memory snapshot of one step."""

    name = "memory snapshot"

    def __init__(self, ctx: PerfmonContext) -> None:
        self.ctx = ctx
        self._recording = False
        step = ctx.config.memory_snapshot_step
        if step is not None and not ctx.cuda and ctx.rank == 0:
            ctx.say(
                f"meshprof: memory snapshot (step {step}) needs CUDA; this run has no GPU, so no snapshot will be written"
            )

    def before_step(self, st: StepState) -> None:
        if st.step != self.ctx.config.memory_snapshot_step or not self.ctx.cuda:
            return
        import torch

        self.ctx.mon.mark_instrumented(st.step)
        torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES)
        self._recording = True

    def after_step(self, st: StepState) -> None:
        if not self._recording:
            return
        self._recording = False
        import torch

        path = self.ctx.out_dir / f"memory_snapshot_rank{self.ctx.rank}_step{st.step}.pickle"
        torch.cuda.memory._dump_snapshot(str(path))
        torch.cuda.memory._record_memory_history(enabled=None)
        self.ctx.files.append(path)
        if self.ctx.rank == 0:
            self.ctx.say(
                f"meshprof: memory snapshot -> {path} (open it in https://pytorch.org/memory_viz)"
            )

    def close(self) -> None:
        self._recording = False

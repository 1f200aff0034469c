"""The NVTX part (``nsight=True``, CUDA only): a range per step (``step N``) and one around
each forward of the model, for Nsight Systems timelines."""

from __future__ import annotations

from typing import Any

from meshprof.perfmon.context import PerfmonContext, StepState


class NvtxPart:
    """Pushes and pops NVTX ranges around each step and the model's forward."""

    name = "nvtx"

    def __init__(self, ctx: PerfmonContext) -> None:
        self.ctx = ctx
        self._hooks: list[Any] = []

    def before_step(self, st: StepState) -> None:
        if not (self.ctx.config.nsight and self.ctx.cuda):
            return
        import torch

        torch.cuda.nvtx.range_push(f"step {st.step}")
        st.stack.callback(torch.cuda.nvtx.range_pop)
        model = self.ctx.model
        if model is not None and not self._hooks:

            def push(m: Any, a: Any) -> None:
                torch.cuda.nvtx.range_push("forward")

            def pop(m: Any, a: Any, o: Any) -> None:
                torch.cuda.nvtx.range_pop()

            self._hooks = [model.register_forward_pre_hook(push), model.register_forward_hook(pop)]

    def after_step(self, st: StepState) -> None:
        hooks, self._hooks = self._hooks, []
        for h in hooks:
            h.remove()

    def close(self) -> None:
        self.after_step(StepState(step=-1))

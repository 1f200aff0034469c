"""The torch.profiler part: runs ``torch.profiler.profile`` on the configured schedule (wait,
warmup, active, repeat; in steps) and, for each finished window, writes
``trace_rank{r}_step{s}.json.gz`` (a Chrome/Kineto trace; ``s`` is the window's last step),
prints the ten most expensive ops (rank 0) and logs their self time as ``prof/<op>_ms`` (ms).
"""

from __future__ import annotations

from typing import Any

from meshprof.perfmon.context import PerfmonContext, StepState


class ProfilerSchedulePart:
    """torch.profiler over the decorated steps; ``start()`` begins the first cycle."""

    name = "profiler"

    def __init__(self, ctx: PerfmonContext) -> None:
        self.ctx = ctx
        self._prof: Any = None
        self._step = 0

    def start(self) -> None:
        from torch.profiler import ProfilerActivity, profile, schedule

        c = self.ctx.config
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.ctx.cuda else [])
        self._prof = profile(
            activities=acts,
            schedule=schedule(wait=c.wait, warmup=c.warmup, active=c.active, repeat=c.repeat),
            on_trace_ready=self._trace_ready,
            record_shapes=c.record_shapes,
            profile_memory=c.profile_memory,
            with_stack=c.with_stack,
        )
        self._prof.start()

    def _trace_ready(self, p: Any) -> None:
        """torch.profiler's ``on_trace_ready``: called inside ``step()`` or ``stop()``."""
        ctx = self.ctx
        try:
            step = self._step
            path = ctx.out_dir / f"trace_rank{ctx.rank}_step{step}.json.gz"
            p.export_chrome_trace(str(path))
            ctx.files.append(path)
            key = "self_device_time_total" if ctx.cuda else "self_cpu_time_total"
            avgs = sorted(p.key_averages(), key=lambda a: getattr(a, key, 0.0), reverse=True)[:10]
            if ctx.rank == 0:
                from meshprof.render.perfmon_text import trace_message

                table = p.key_averages().table(sort_by=key, row_limit=10)
                ctx.say(trace_message(step, path, ctx.cuda, table))
            # torch.profiler's times are in µs
            ctx.loggers.log({f"prof/{a.key}_ms": getattr(a, key, 0.0) / 1000.0 for a in avgs}, step)
            ctx.write_rank_file()
        except Exception as e:
            ctx.fail("profiler trace", e)

    def before_step(self, st: StepState) -> None:
        self._step = st.step
        prof = self._prof
        if prof is not None:
            from torch.profiler import ProfilerAction

            if getattr(prof, "current_action", ProfilerAction.NONE) != ProfilerAction.NONE:
                self.ctx.mon.mark_instrumented(st.step)  # warm-up and traced steps

    def after_step(self, st: StepState) -> None:
        if self._prof is not None:
            self._prof.step()

    def close(self) -> None:
        prof, self._prof = self._prof, None
        if prof is not None:
            prof.stop()

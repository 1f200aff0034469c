"""The communication log part: every collective of ``comm_logger_step`` with the module and
phase (forward / backward / other) that issued it, plus DTensor's ``CommDebugMode`` counts.
Writes ``comm_step{N}.json`` and ``comm_debug_step{N}.txt`` (bytes in B, times in ns).

The files are written at the start of the next step (or at close): asynchronous collectives of
the logged step, such as DDP's buckets, are recorded only once their completion is noticed.
"""

from __future__ import annotations

import functools
import json
import re
import warnings
from typing import Any

from meshprof.perfmon.context import AfterSettle, PerfmonContext, StepState
from meshprof.perfmon.module_timeline import ModuleTimeline
from meshprof.records.perfmon import CommLog, CommLogRow

#: Longest wait (seconds) for the logged step's collectives still in flight.
COMM_SETTLE_S = 2.0
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # CommDebugMode colors its table for terminals


def count_by_module(rows: list[CommLogRow]) -> dict[str, dict[str, int]]:
    """Collectives per "<module> [<phase>]" and op."""
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        ops = out.setdefault(f"{r.module or '(no module)'} [{r.phase}]", {})
        ops[r.event.op] = ops.get(r.event.op, 0) + 1
    return out


class CommLogPart:
    """Logs the collectives of one step (see the module docstring)."""

    name = "communication log"

    def __init__(self, ctx: PerfmonContext) -> None:
        self.ctx = ctx
        self._mode: Any = None
        self._timeline: ModuleTimeline | None = None
        self._active = False
        self._later = AfterSettle(ctx, self.name, COMM_SETTLE_S)

    def before_step(self, st: StepState) -> None:
        self._later.flush()
        if st.step != self.ctx.config.comm_logger_step:
            return
        self.ctx.mon.mark_instrumented(st.step)
        try:
            from torch.distributed.tensor.debug import CommDebugMode

            mode: Any = CommDebugMode()
        except Exception:
            mode = None
        model = self.ctx.model
        self._timeline = ModuleTimeline(model) if model is not None else None
        self._mode = mode
        if mode is not None:
            # its module tracker's full backward hooks warn when inputs need no grad
            st.stack.enter_context(warnings.catch_warnings())
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            st.stack.enter_context(mode)
        self._active = True

    def after_step(self, st: StepState) -> None:
        if not self._active:
            return
        self._active = False
        if self._timeline is not None:
            self._timeline.remove()
        write = functools.partial(self._write_log, self._mode, self._timeline, st.step)
        self._later.defer(st, write)
        self._mode, self._timeline = None, None

    def _write_log(self, mode: Any, timeline: ModuleTimeline | None, step: int) -> None:
        self.write(self.collect(mode, timeline, step))

    def collect(self, mode: Any, timeline: ModuleTimeline | None, step: int) -> CommLog:
        """The log of ``step`` from the recorder's events, the timeline and CommDebugMode."""
        rows = []
        for e in self.ctx.prof.events():
            if e.step != step:
                continue
            module, phase = timeline.attribute(e.start_ns) if timeline else ("", "other")
            rows.append(CommLogRow(event=e, module=module, phase=phase))
        dtensor: dict[str, int] = {}
        table = ""
        if mode is not None:
            try:
                dtensor = {str(k): int(v) for k, v in mode.get_comm_counts().items()}
                table = _ANSI.sub("", mode.generate_comm_debug_tracing_table(noise_level=1))
            except Exception as e:
                table = f"(CommDebugMode table unavailable: {type(e).__name__}: {e})"
        return CommLog(
            step=step,
            rank=self.ctx.rank,
            world_size=self.ctx.world_size,
            rows=rows,
            by_module=count_by_module(rows),
            dtensor_comm_counts=dtensor,
            dtensor_table=table,
        )

    def write(self, log: CommLog) -> None:
        from meshprof.render.perfmon_text import comm_log_text
        from meshprof.rundir.atomic import atomic_write_text

        jpath = self.ctx.path(f"comm_step{log.step}", ".json")
        atomic_write_text(jpath, json.dumps(log.to_dict(), indent=1, default=str))
        tpath = self.ctx.path(f"comm_debug_step{log.step}", ".txt")
        atomic_write_text(tpath, comm_log_text(log))
        self.ctx.files += [jpath, tpath]
        if self.ctx.rank == 0:
            self.ctx.say(
                f"meshprof: step {log.step}: {len(log.rows)} collective(s) logged -> {jpath}, {tpath}"
            )

    def close(self) -> None:
        self._later.flush()

"""What a capture reads from the step monitor and from torch, apart from the agent's logic:
the recent step time, the phases inside the traced steps, the activities this rank can trace,
the trace's ``distributedInfo``. Each tolerates a monitor that lacks what it looks for."""

from __future__ import annotations

import contextlib
import json
import statistics
from typing import Any

from meshprof.records.captures import CapturedPhase, CapturedStep

STEPS_BEFORE = 8
"""Steps before a capture whose median is its ``step_ns_before``."""
_STEP_KIND = 0  # SPAN_KINDS.index("step")
_PHASE_KIND = 1  # SPAN_KINDS.index("phase")


def warm_up_profiler() -> None:
    """Import the profiler's module on the agent's thread, not at the training thread's step
    boundary."""
    with contextlib.suppress(Exception):
        import torch.autograd.profiler  # noqa: F401


def add_distributed_info() -> None:
    """The trace's ``distributedInfo`` (rank, world size, backend), as torch.profiler adds it,
    when the default group exists (the trace's file name says the rank otherwise)."""
    with contextlib.suppress(Exception):
        import torch
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            info = {
                "backend": str(dist.get_backend()),
                "rank": dist.get_rank(),
                "world_size": dist.get_world_size(),
            }
            torch.autograd._add_metadata_json("distributedInfo", json.dumps(info))


def choose_activities(
    asked: tuple[str, ...], allowed: tuple[str, ...] = ("cpu", "cuda")
) -> tuple[tuple[str, ...], str]:
    """The activities to trace (``asked`` empty: cpu, and cuda where available; never one
    the job does not allow) and a note on those left out (cuda asked where there is none)."""
    try:
        import torch

        cuda = bool(torch.cuda.is_available()) and "cuda" in allowed
    except Exception:
        cuda = False
    if not asked:
        return ("cpu", "cuda") if cuda else ("cpu",), ""
    out = [a for a in asked if a == "cpu" or (a == "cuda" and cuda)]
    note = "" if cuda or "cuda" not in asked else "cuda asked but not available here: not traced"
    return tuple(out) or ("cpu",), note


def mark_instrumented(monitor: Any, step: int) -> None:
    """The step analysis leaves the traced step out (the step monitor's own record)."""
    mark = getattr(monitor, "mark_instrumented", None)
    if mark is not None:
        mark(step)


def median_recent_step(monitor: Any) -> int:
    """Median duration of the monitor's last :data:`STEPS_BEFORE` steps (ns; 0 without any)."""
    rows = span_rows(monitor)
    durs = [int(r[6]) for r in rows if r[0] == _STEP_KIND and r[2] == 0][-STEPS_BEFORE:]
    return int(statistics.median(durs)) if durs else 0


def span_rows(monitor: Any, last: int = 20_000) -> list[tuple[Any, ...]]:
    """The monitor's last ``last`` span rows (empty when it keeps none)."""
    spans = getattr(monitor, "span_rows", None)
    if spans is None:
        return []
    for _ in range(3):  # the training thread may append while we read
        try:
            n = len(spans)
            return [spans[i] for i in range(max(n - last, 0), n)]
        except (RuntimeError, IndexError):
            continue
    return []


def traced_phases(monitor: Any, steps: list[CapturedStep]) -> tuple[CapturedPhase, ...]:
    """The monitor's phase spans inside the traced steps."""
    if not steps:
        return ()
    first, last = steps[0].step, steps[-1].step
    names = list(getattr(monitor, "span_names", []) or [])
    out = []
    for r in span_rows(monitor):
        # SPAN row: (kind, status, depth, name, step, start_ns, duration_ns, ...)
        if r[0] != _PHASE_KIND or not first <= int(r[4]) <= last:
            continue
        name = names[int(r[3])] if int(r[3]) < len(names) else f"phase{r[3]}"
        out.append(CapturedPhase(name, int(r[4]), int(r[5]), int(r[5]) + int(r[6])))
    return tuple(sorted(out, key=lambda p: p.start_ns))


__all__ = [
    "STEPS_BEFORE",
    "add_distributed_info",
    "choose_activities",
    "mark_instrumented",
    "median_recent_step",
    "span_rows",
    "traced_phases",
    "warm_up_profiler",
]

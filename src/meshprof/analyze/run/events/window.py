"""A window of steps of a loaded run: ``meshprof report --steps A:B`` (or ``--since``/``--until``
times) and the latest regime the report analyses when something changed mid-run
(:mod:`meshprof.analyze.run.events.changes`).

A window is applied rank by rank, on the rank's own clock: its step spans whose step is in the
window are kept, and its events, memory samples and other spans that fall between the first kept
step's start and the last kept step's end. Ranks without step spans keep events by their
``step`` column when they have one, else everything (the window cannot be placed on them).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import re
from dataclasses import dataclass

import numpy as np

from meshprof.errors import MeshprofError
from meshprof.rundir import LoadedRun, RankData


@dataclass(frozen=True, slots=True)
class StepWindow:
    """Steps ``lo`` (included) to ``hi`` (excluded); None: open on that side."""

    lo: int | None = None
    hi: int | None = None

    def contains(self, steps: np.ndarray) -> np.ndarray:
        """Boolean mask of the ``steps`` inside the window."""
        ok = np.ones(len(steps), dtype=bool)
        if self.lo is not None:
            ok &= steps >= self.lo
        if self.hi is not None:
            ok &= steps < self.hi
        return ok

    def text(self) -> str:
        """``"A:B"`` as the user would write it."""
        return f"{'' if self.lo is None else self.lo}:{'' if self.hi is None else self.hi}"


def parse_steps(text: str) -> StepWindow | None:
    """``"A:B"``, ``"A:"``, ``":B"`` or ``"all"`` (None: every step). MeshprofError names what is
    wrong."""
    t = text.strip()
    if t in ("all", ":"):
        return None
    m = re.fullmatch(r"(\d*)\s*:\s*(\d*)", t)
    if not m or (not m.group(1) and not m.group(2)):
        raise MeshprofError(f"--steps {text!r}: expected A:B (steps A to B-1), A:, :B or all")
    lo = int(m.group(1)) if m.group(1) else None
    hi = int(m.group(2)) if m.group(2) else None
    if lo is not None and hi is not None and hi <= lo:
        raise MeshprofError(f"--steps {text!r}: the end must come after the start")
    return StepWindow(lo, hi)


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h|min)?")


def parse_time(text: str, run_start_ns: int) -> int:
    """A point in time (ns since the epoch) from ``--since``/``--until``: an ISO 8601 date and
    time (``2026-11-25T14:02:11``, local time unless it has a zone), a time of day
    (``14:02:11``, on the day the run started, local time), or a duration after the run's start
    (``90s``, ``5m``, ``2h``; plain numbers are seconds). MeshprofError when it is none of them."""
    t = text.strip()
    m = _DURATION.fullmatch(t)
    if m:
        unit = {"s": 1, None: 1, "m": 60, "min": 60, "h": 3600}[m.group(2)]
        return run_start_ns + int(float(m.group(1)) * unit * 1e9)
    try:
        if re.fullmatch(r"\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?", t):
            day = _dt.datetime.fromtimestamp(run_start_ns / 1e9).date()
            when = _dt.datetime.combine(
                day, _dt.time.fromisoformat(t.zfill(5) if len(t) < 5 else t)
            )
        else:
            when = _dt.datetime.fromisoformat(t)
    except ValueError:
        raise MeshprofError(
            f"{text!r}: expected a time (14:02:11, 2026-11-25T14:02:11) or a duration after "
            "the run's start (90s, 5m, 2h)"
        ) from None
    return int(when.timestamp() * 1e9)


def run_start_ns(run: LoadedRun) -> int:
    """When the run started (ns since the epoch): the manifest's start, else the earliest step
    or event of any rank (0 when there is nothing)."""
    start = int(run.manifest.start_ns or 0)
    if start > 0:
        return start
    firsts = []
    for rd in run.ranks.values():
        if len(rd.spans):
            firsts.append(int(rd.spans["start_ns"].min()))
        elif len(rd.events):
            firsts.append(int(rd.events["start_ns"].min()))
    return min(firsts) if firsts else 0


def step_spans(rd: RankData) -> np.ndarray:
    """A rank's step spans (depth 0, kind step, a step number), in recorded order."""
    spans = rd.spans
    if not len(spans):
        return spans
    return spans[(spans["depth"] == 0) & (spans["kind"] == 0) & (spans["step"] >= 0)]


def steps_between(run: LoadedRun, since_ns: int | None, until_ns: int | None) -> StepWindow:
    """The steps that started in [since, until) on the clock of the lowest rank with steps.
    MeshprofError when the run has no step spans or no step in that time."""
    for r in sorted(run.ranks):
        st = step_spans(run.ranks[r])
        if len(st):
            break
    else:
        raise MeshprofError(
            "--since/--until need steps (the step monitor's spans); this run has none"
        )
    ok = np.ones(len(st), dtype=bool)
    if since_ns is not None:
        ok &= st["start_ns"] >= since_ns
    if until_ns is not None:
        ok &= st["start_ns"] < until_ns
    if not ok.any():
        first, last = int(st["start_ns"].min()), int(st["start_ns"].max())
        raise MeshprofError(
            "no step started in that time: rank "
            f"{r}'s steps started from {_clock(first)} to {_clock(last)}"
        )
    steps = st["step"][ok]
    return StepWindow(int(steps.min()), int(steps.max()) + 1)


def _clock(ns: int) -> str:
    return _dt.datetime.fromtimestamp(ns / 1e9).strftime("%Y-%m-%d %H:%M:%S")


def window_run(run: LoadedRun, window: StepWindow) -> LoadedRun:
    """The run with only the window's steps (see the module's docstring); the same object when
    the window is open on both sides."""
    if window.lo is None and window.hi is None:
        return run
    ranks = {}
    for r, rd in run.ranks.items():
        st = step_spans(rd)
        kept = st[window.contains(st["step"])] if len(st) else st
        spans, events, memory = rd.spans, rd.events, rd.memory
        if len(kept):
            t0 = int(kept["start_ns"].min())
            t1 = int((kept["start_ns"] + kept["duration_ns"]).max())
            if len(spans):
                in_steps = spans["step"] >= 0
                spans = spans[
                    np.where(in_steps, window.contains(spans["step"]), spans["start_ns"] >= t0)
                    & (in_steps | (spans["start_ns"] < t1))
                ]
            if len(events):
                ev_t = events["start_ns"]
                events = events[(ev_t >= t0) & (ev_t < t1)]
            if len(memory) and "step" in (memory.dtype.names or ()):
                memory = memory[window.contains(memory["step"])]
        elif len(st):  # steps, none in the window: nothing of this rank is in it
            spans, events = spans[:0], events[:0]
            memory = memory[:0] if len(memory) else memory
        elif len(events) and "step" in (events.dtype.names or ()):
            events = events[window.contains(events["step"])]
        ranks[r] = dataclasses.replace(rd, spans=spans, events=events, memory=memory)
    return dataclasses.replace(run, ranks=ranks)


__all__ = [
    "StepWindow",
    "parse_steps",
    "parse_time",
    "run_start_ns",
    "step_spans",
    "steps_between",
    "window_run",
]

"""The captures of the run (``RUN_DIR/captures/``, by ``meshprof capture`` or ``meshprof run
--capture-on``), each analysed: what differs between its culprit and its peer
(:mod:`meshprof.analyze.traces.capture_diff`)."""

from __future__ import annotations

from meshprof.analyze.traces.capture_diff import CaptureComparison, compare_capture
from meshprof.report.stage import Key, stage
from meshprof.rundir import LoadedRun
from meshprof.rundir.captures import list_captures

CAPTURES: Key[tuple[CaptureComparison, ...]] = Key("captures")


@stage(CAPTURES)
def captures(run: LoadedRun) -> tuple[CaptureComparison, ...]:
    """Every capture, oldest first (empty without any)."""
    return tuple(compare_capture(c) for c in list_captures(run.path))


STAGES = (captures,)

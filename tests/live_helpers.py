"""Helpers of the live-monitoring tests that drive tests/scripts/metrics_job.py (a 2-rank job in
phases that pauses after each phase until told to go on)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from meshprof.rundir.live import read_rank_lives


def wait_for(pred: Any, timeout: float = 120.0) -> Any:
    """Poll ``pred`` until it returns something true; that value (AssertionError on timeout)."""
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError("timed out")


def phase_counts(ctl: Path, phase: int) -> dict[int, int] | None:
    """The all_reduces each rank says it completed by the end of ``phase`` (None: not there)."""
    files = [ctl / f"phase{phase}.rank{r}" for r in (0, 1)]
    if not all(f.exists() and f.read_text() for f in files):
        return None
    return {r: int(f.read_text()) for r, f in enumerate(files)}


def settled(out: Path, ctl: Path, phase: int) -> dict[int, int] | None:
    """Both ranks paused after ``phase`` and published a record written after the pause began
    (so it counts every collective the rank issued): the counts, else None."""
    counts = phase_counts(ctl, phase)
    if counts is None:
        return None
    began = max((ctl / f"phase{phase}.rank{r}").stat().st_mtime_ns for r in (0, 1))
    recs = read_rank_lives(out)
    if len(recs) == 2 and all(x.updated_ns > began + 50_000_000 for x in recs.values()):
        return counts
    return None

"""Analysis step: memory over the analyzed steps, from the rank's memory samples (bytes).

Samples of the analyzed steps are used (all samples when none belongs to them). Peak = the
largest of the samples' peaks and allocations; kind "cpu" when every sample's allocation is the
resident set size (no CUDA allocator), else "cuda"; capacity 0 means unknown.
"""

from __future__ import annotations

import numpy as np

from meshprof.analyze.steps.options import StepOptions
from meshprof.analyze.steps.timeline import StepTimeline
from meshprof.analyze.steps.types import MemoryStats, StepAnalysis, updated


def memory_stats(memory: np.ndarray, steps: np.ndarray) -> MemoryStats | None:
    """Memory statistics of the samples (MEMORY_DTYPE) of the step numbers ``steps`` (None
    without samples)."""
    if len(memory) == 0:
        return None
    mem = memory
    if len(steps):
        known = np.unique(steps)
        s = memory["step"]
        mem = memory[known[np.minimum(np.searchsorted(known, s), len(known) - 1)] == s]
    if len(mem) == 0:
        mem = memory
    alloc = mem["allocated"].astype(np.int64)
    peak = int(max(mem["peak"].max(), alloc.max()))
    cap = int(mem["capacity"][-1])
    is_cpu = bool((mem["allocated"] == mem["rss"]).all())
    mean = float(alloc.mean())
    return MemoryStats(
        kind="cpu" if is_cpu else "cuda",
        current_bytes=int(alloc[-1]),
        peak_bytes=peak,
        mean_bytes=mean,
        mean_over_peak=mean / peak if peak > 0 else 0.0,
        capacity_bytes=cap,
        headroom_bytes=cap - peak if cap > 0 else -1,
        peak_fraction=peak / cap if cap > 0 else 0.0,
    )


def add_memory(a: StepAnalysis, t: StepTimeline, o: StepOptions) -> StepAnalysis:
    """Fill ``memory``."""
    return updated(a, memory=memory_stats(t.memory, t.steps.step))

"""Memory samples: CUDA allocator statistics on GPUs, resident set size on CPU."""

from __future__ import annotations

import os
import time

import numpy as np

from meshprof.events import MEMORY_DTYPE

_TOTAL: int | None = None
_PROC: tuple[int, object] | None = None  # (pid, psutil.Process)
_LAST: tuple[int, int] = (0, -1)  # (monotonic ns of the last RSS read, RSS)
RSS_INTERVAL_NS = 100_000_000
"""Reading RSS costs ~60 µs here (/proc); it is read at most every 100 ms and reused between."""


def _rss_and_total() -> tuple[int, int]:
    """(RSS, host RAM) in bytes; RSS at most RSS_INTERVAL_NS old."""
    global _TOTAL, _PROC, _LAST
    try:
        import psutil

        if _TOTAL is None:
            _TOTAL = int(psutil.virtual_memory().total)
        now = time.monotonic_ns()
        pid = os.getpid()
        if _PROC is None or _PROC[0] != pid:
            _PROC = (pid, psutil.Process(pid))
            _LAST = (0, -1)
        if now - _LAST[0] >= RSS_INTERVAL_NS:
            _LAST = (now, int(_PROC[1].memory_info().rss))  # type: ignore[attr-defined]
        return _LAST[1], _TOTAL
    except Exception:
        return -1, -1 if _TOTAL is None else _TOTAL


def _peak_rss() -> int:
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB
    except Exception:
        return -1


def sample_memory(step: int, device: int | None = None) -> tuple[int, int, int, int, int, int, int]:
    """One MEMORY_DTYPE row for ``step``: (step, t_ns, allocated, reserved, peak, rss, capacity).

    On CUDA: allocated/reserved from the caching allocator, peak = max_memory_allocated since the
    previous sample (the peak counter is reset after reading), capacity = the device's total
    memory. On CPU: allocated = reserved = RSS, peak = the process's peak RSS, capacity = host RAM.
    The peak is never below the allocated figure of the same row.
    Bytes; -1 where unknown.
    """
    rss, host_total = _rss_and_total()
    try:
        import torch

        if device is not None and torch.cuda.is_available():
            alloc = int(torch.cuda.memory_allocated(device))
            reserved = int(torch.cuda.memory_reserved(device))
            peak = max(int(torch.cuda.max_memory_allocated(device)), alloc)
            torch.cuda.reset_peak_memory_stats(device)
            cap = int(torch.cuda.get_device_properties(device).total_memory)
            return (step, time.time_ns(), alloc, reserved, peak, rss, cap)
    except Exception:
        pass
    # ru_maxrss and psutil's RSS are read at different moments (and RSS may come from the
    # cache above): the peak is never below the current figure it is shown with
    return (step, time.time_ns(), rss, rss, max(_peak_rss(), rss), rss, host_total)


def empty_memory() -> np.ndarray:
    return np.zeros(0, dtype=MEMORY_DTYPE)

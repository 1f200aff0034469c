"""Memory samples: CUDA allocator statistics on GPUs, resident set size on CPU."""

from __future__ import annotations

import os
import time

import numpy as np

from meshprof.events import MEMORY_DTYPE


def _rss_and_total() -> tuple[int, int]:
    try:
        import psutil

        return int(psutil.Process(os.getpid()).memory_info().rss), int(
            psutil.virtual_memory().total
        )
    except Exception:
        return -1, -1


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
    Bytes; -1 where unknown.
    """
    rss, host_total = _rss_and_total()
    try:
        import torch

        if device is not None and torch.cuda.is_available():
            alloc = int(torch.cuda.memory_allocated(device))
            reserved = int(torch.cuda.memory_reserved(device))
            peak = int(torch.cuda.max_memory_allocated(device))
            torch.cuda.reset_peak_memory_stats(device)
            cap = int(torch.cuda.get_device_properties(device).total_memory)
            return (step, time.time_ns(), alloc, reserved, peak, rss, cap)
    except Exception:
        pass
    return (step, time.time_ns(), rss, rss, _peak_rss(), rss, host_total)


def empty_memory() -> np.ndarray:
    return np.zeros(0, dtype=MEMORY_DTYPE)

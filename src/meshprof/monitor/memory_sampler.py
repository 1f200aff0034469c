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


def warm() -> None:
    """Import and open what the first sample needs (psutil, the process handle, the host's RAM)
    now, not at the first step's end: that took 9 ms on the serving demo's rank 0 (2 loaded
    cores), a delay of the first request's first token on its way to the client."""
    _rss_and_total()
    _peak_rss()


def _peak_rss() -> int:
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB
    except Exception:
        return -1


_CAPACITY: dict[int, int] = {}  # CUDA device index -> total memory (bytes)


def _cuda_device(device: int | None) -> int | None:
    """The CUDA device to sample: ``device``, else the current one once this process has
    initialized CUDA (a job that never touches the GPU is sampled as a CPU job)."""
    try:
        import torch

        if device is not None:
            return device if torch.cuda.is_available() else None
        if torch.cuda.is_initialized():
            return int(torch.cuda.current_device())
    except Exception:
        pass
    return None


def sample_memory(step: int, device: int | None = None) -> tuple[int, int, int, int, int, int, int]:
    """One MEMORY_DTYPE row for ``step``: (step, t_ns, allocated, reserved, peak, rss, capacity).

    On CUDA (``device``, else the current device once CUDA is initialized): allocated/reserved
    from the caching allocator, peak = the allocator's peak since the process started or the
    user last reset it (``torch.cuda.max_memory_allocated``; never reset here: the user's own
    readings of it stay theirs), capacity = the device's total memory. One read of the
    allocator's statistics per sample (``torch.cuda.memory_allocated`` and its siblings each
    flatten the whole table: ~470 µs for the three on an H200, ``benchmarks/gpu_step_check.py``).
    On CPU: allocated = reserved = RSS, peak = the process's peak RSS, capacity = host RAM.
    The peak is never below the allocated figure of the same row.
    Bytes; -1 where unknown.
    """
    rss, host_total = _rss_and_total()
    dev = _cuda_device(device)
    if dev is not None:
        try:
            import torch

            stats = torch.cuda.memory_stats_as_nested_dict(dev)
            allocated = stats.get("allocated_bytes", {}).get("all", {})
            alloc = int(allocated.get("current", 0))
            reserved = int(stats.get("reserved_bytes", {}).get("all", {}).get("current", 0))
            peak = max(int(allocated.get("peak", 0)), alloc)
            cap = _CAPACITY.get(dev)
            if cap is None:
                cap = _CAPACITY[dev] = int(torch.cuda.get_device_properties(dev).total_memory)
            return (step, time.time_ns(), alloc, reserved, peak, rss, cap)
        except Exception:
            pass
    # ru_maxrss and psutil's RSS are read at different moments (and RSS may come from the
    # cache above): the peak is never below the current figure it is shown with
    return (step, time.time_ns(), rss, rss, max(_peak_rss(), rss), rss, host_total)


def empty_memory() -> np.ndarray:
    return np.zeros(0, dtype=MEMORY_DTYPE)

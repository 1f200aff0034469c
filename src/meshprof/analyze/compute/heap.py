"""Handing freed heap memory back to the operating system between the run report's phases.

Why: the report's phases (table, clock, match, stragglers, what-if, tables) each build large
temporary numpy arrays and free them. glibc's malloc keeps freed blocks below its dynamic mmap
threshold (which rises to 32 MiB after the first large free) in its heaps, and holes in the
middle of a heap are not returned by ``free``: the resident set stays ~10–25 % above the live
allocations, and the next phase's peak lands on top of it. ``malloc_trim(0)`` returns every
whole free page of every arena (``madvise(MADV_DONTNEED)``), a few ms per call. Lowering the
mmap threshold instead (``MALLOC_MMAP_THRESHOLD_``) maps and faults in every large array
afresh: twice the system time (benchmarks/README.md, "Issue 12").

Only on Linux with glibc; elsewhere (macOS, musl, Windows) :func:`release_free_memory` does
nothing. It never raises.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable

_trim: Callable[[int], int] | None = None
_looked = False


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, None where there is none (looked up once)."""
    global _trim, _looked
    if not _looked:
        _looked = True
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(None)
                # musl has no gnu_get_libc_version (and no malloc_trim worth calling)
                if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "malloc_trim"):
                    fn = libc.malloc_trim
                    fn.argtypes = [ctypes.c_size_t]
                    fn.restype = ctypes.c_int
                    _trim = fn
            except (OSError, AttributeError, TypeError):
                _trim = None
    return _trim


def release_free_memory() -> bool:
    """Return the heap's free pages to the OS (glibc ``malloc_trim(0)``); True when memory
    was released, False when none was or the C library has no such call. Never raises."""
    try:
        fn = _malloc_trim()
        return bool(fn(0)) if fn is not None else False
    except Exception:  # an allocator hint must never cost the report
        return False


__all__ = ["release_free_memory"]

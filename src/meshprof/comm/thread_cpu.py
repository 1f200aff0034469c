"""CPU time taken by meshprof's own threads in this process (issue 17: "no CPU taken from
training").

Every thread meshprof starts is named ``meshprof-*`` (the Python poller, the rank writer, the
live publisher, the watchdog...); the native kernel's C++ poller is read through the extension
(``poller_cpu_ns``). Each figure is the thread's CPU clock (``pthread_getcpuclockid``), in ns,
since it started: threads that already ended are not counted, nor the completion callbacks
that run on the backend's own threads (part of the collective's cost, measured in
``benchmarks/record_cost.py``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

PREFIX = "meshprof-"


def python_threads_cpu_ns() -> dict[str, int]:
    """CPU ns of the live ``meshprof-*`` Python threads, summed by thread name."""
    out: dict[str, int] = {}
    getclock = getattr(time, "pthread_getcpuclockid", None)
    if getclock is None:  # not on this platform
        return out
    for t in threading.enumerate():
        if not t.name.startswith(PREFIX) or t.ident is None:
            continue
        try:
            ns = time.clock_gettime_ns(getclock(t.ident))
        except (OSError, ValueError, OverflowError):
            continue  # ended meanwhile
        out[t.name] = out.get(t.name, 0) + ns
    return out


def recorder_cpu(
    native_threads: Callable[[], dict[str, int]] | None,
    collectives: int,
    since_ns: int,
) -> dict[str, object]:
    """The recorder's thread CPU as plain data.

    ``threads_ns``: CPU ns per thread name; ``total_ns``: their sum; ``per_collective_ns``:
    ``total_ns`` / ``collectives`` (collectives recorded so far, None before the first);
    ``per_second_ms``: ms of CPU per second of wall time since ``since_ns`` (``time.time_ns``
    when recording began), i.e. the share of one core in thousandths."""
    threads = python_threads_cpu_ns()
    if native_threads is not None:
        try:
            for name, ns in native_threads().items():
                if ns > 0:
                    threads[name] = threads.get(name, 0) + ns
        except Exception:
            pass  # an older build without the counter
    total = sum(threads.values())
    wall_s = max((time.time_ns() - since_ns) / 1e9, 1e-9)
    return {
        "threads_ns": dict(sorted(threads.items())),
        "total_ns": total,
        "collectives": collectives,
        "per_collective_ns": (total / collectives) if collectives else None,
        "per_second_ms": total / 1e6 / wall_s,
    }

"""Forked worker processes for the report's independent per-rank work (loading rank files,
the per-rank step analyses), where forking is safe.

A fork copies the parent's memory copy-on-write, so the workers read what the parent holds (a
loaded run, the function to apply, even a closure) without pickling it; only each chunk's
argument and result travel. Forking is used only on Linux, and only from a process with no
other Python thread (a fork copies only the calling thread: a lock held by another one would
stay held in the child). Anywhere else :func:`start` returns None and the caller does the work
in-process. A worker that dies (killed for memory, say) fails only its chunks: their results
come back as None, for the caller to redo in-process.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import BrokenExecutor, Future, ProcessPoolExecutor
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

_fn: Callable[[Any], Any] | None = None
"""The function the forked workers apply (set in the parent around the fork)."""


def usable_cores(cgroup_root: str = "/sys/fs/cgroup") -> int:
    """CPU cores this process may use: its affinity mask where the OS has one, lowered to its
    cgroup's CPU quota when there is one (a container limited to 2 CPUs on a 64-core host sees
    64 cores in its mask: 16 workers there would only share the 2)."""
    try:
        n = max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):
        n = max(os.cpu_count() or 1, 1)
    quota = cgroup_cpu_quota(cgroup_root)
    return max(min(n, quota), 1) if quota is not None else n


def cgroup_cpu_quota(root: str = "/sys/fs/cgroup") -> int | None:
    """The CPU quota of this process's cgroup in whole CPUs, rounded up (cgroup v2
    ``cpu.max``, else v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``); None when unlimited or
    unknown."""
    try:
        with open(os.path.join(root, "cpu.max")) as f:
            quota_text, period_text = f.read().split()[:2]
        if quota_text == "max":
            return None
        return max(-(-int(quota_text) // int(period_text)), 1)
    except (OSError, ValueError):
        pass
    try:
        with open(os.path.join(root, "cpu", "cpu.cfs_quota_us")) as f:
            q = int(f.read())
        with open(os.path.join(root, "cpu", "cpu.cfs_period_us")) as f:
            p = int(f.read())
        return max(-(-q // p), 1) if q > 0 and p > 0 else None
    except (OSError, ValueError):
        return None


def can_fork() -> bool:
    """True where forking is safe: Linux, the ``fork`` start method exists, and this is the
    only Python thread."""
    if sys.platform != "linux":
        return False
    if "fork" not in multiprocessing.get_all_start_methods():
        return False
    return threading.active_count() == 1


def chunks(items: Sequence[T], workers: int, per_worker: int = 4) -> list[list[T]]:
    """``items`` cut into about ``per_worker`` contiguous chunks per worker (load balance),
    in order; no empty chunk."""
    n = max(min(len(items), workers * per_worker), 1)
    size = -(-len(items) // n)
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def _apply(arg: Any) -> Any:
    """In a worker: the inherited function applied to one chunk."""
    assert _fn is not None
    return _fn(arg)


class Forked(Generic[T, R]):
    """``fn(chunk)`` of every chunk, running on forked workers; :meth:`results` collects them."""

    def __init__(self, pool: ProcessPoolExecutor, futures: list[Future[R]]) -> None:
        self._pool = pool
        self._futures = futures
        self._results: list[R | None] | None = None

    def results(self) -> list[R | None]:
        """Each chunk's result, in order; None for a chunk whose worker failed (it died, or
        its result could not be sent). Waits for all, then lets the workers exit."""
        if self._results is None:
            out: list[R | None] = []
            for fut in self._futures:
                try:
                    out.append(fut.result())
                except Exception:  # BrokenProcessPool, a pickling error, fn's own error
                    out.append(None)
            self._pool.shutdown(wait=True)
            self._results = out
        return self._results


def start(fn: Callable[[T], R], parts: Sequence[T], workers: int) -> Forked[T, R] | None:
    """Start ``fn(part)`` for every part on ``min(workers, len(parts))`` forked processes and
    return at once; None, with nothing started, where forking is unsafe, fewer than two
    workers would run, or the processes cannot be started."""
    global _fn
    workers = min(workers, len(parts))
    if workers < 2 or not can_fork():
        return None
    _fn = fn
    # the parent's objects go to the permanent generation around the fork: a worker's full
    # collections then do not walk (and copy-on-write) the loaded run's millions of objects,
    # which made the per-rank analyses ~2× slower per rank at 100,000 ranks than at 1,024
    gc.freeze()
    try:
        with warnings.catch_warnings():
            # Python >= 3.12 warns about fork() in a process with OS-level threads; numpy's
            # OpenBLAS pool is one, and it re-initialises itself in the child (pthread_atfork).
            warnings.simplefilter("ignore", DeprecationWarning)
            pool = ProcessPoolExecutor(
                max_workers=workers, mp_context=multiprocessing.get_context("fork")
            )
            # a fork pool starts all its processes at the first submit
            futures = [_submit(pool, p) for p in parts]
    except (OSError, RuntimeError, ValueError):
        return None
    finally:
        _fn = None  # the children took their copy at the fork
        gc.unfreeze()
    return Forked(pool, futures)


def _submit(pool: ProcessPoolExecutor, part: Any) -> Future[Any]:
    """``part`` submitted to ``pool``; where the pool broke before it (a worker died while the
    parts were still being submitted: one that fails at once, on a loaded host) a future that
    failed, so that its part, like a dead worker's, is redone in-process."""
    try:
        return pool.submit(_apply, part)
    except BrokenExecutor as e:
        failed: Future[Any] = Future()
        failed.set_exception(e)
        return failed

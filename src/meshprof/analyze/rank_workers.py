"""The per-rank step analyses of a loaded run on forked worker processes.

Why: every rank's step analysis (:mod:`meshprof.analyze.steps`) is independent of the others
and of the cross-rank steps, and costs ~3 ms of Python and small numpy calls per rank, nearly
all of it under the GIL: at 4,096 ranks that is ~12 s, which a second *thread* cannot take off
the cross-rank steps' core. Worker processes can. They are forked after the run is loaded, so
they read the loaded rank files from the parent's memory (copy-on-write: the event and span
arrays are never written, so their pages stay shared) and send back only the results (a few
KB per rank, pickled).

Forking is used only where it is safe: Linux (``fork`` start method available), and no other
Python thread running (a fork copies only the calling thread; a lock held by another one would
stay held in the child). Anywhere else :func:`analyze_in_workers` returns None and the caller
analyses in-process. A worker that dies (e.g. killed for memory) does not fail the report: its
ranks are analysed in-process afterwards.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meshprof.analyze.steps import StepAnalysis
    from meshprof.rundir import LoadedRun

MIN_RANKS = 64
"""Below this many loaded ranks the analyses stay in-process (a fork costs more than it saves:
~3 ms of analysis per rank against ~10-30 ms to start a worker)."""

MAX_WORKERS = 16
"""At most this many worker processes by default."""

_run: LoadedRun | None = None
"""The run the forked workers analyse (set in the parent just before the fork)."""

_analyze: Callable[[LoadedRun, Sequence[int]], dict[int, StepAnalysis]] | None = None


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):
        return max(os.cpu_count() or 1, 1)


def default_workers(ranks: int) -> int:
    """Worker processes for ``ranks`` loaded ranks: the usable cores (at most
    :data:`MAX_WORKERS`), 1 (none) below :data:`MIN_RANKS` ranks or on one core."""
    if ranks < MIN_RANKS:
        return 1
    return min(usable_cores(), MAX_WORKERS)


def can_fork() -> bool:
    """True where forking the report is safe: the ``fork`` start method exists and this is the
    only Python thread."""
    if sys.platform != "linux":
        return False
    if "fork" not in multiprocessing.get_all_start_methods():
        return False
    return threading.active_count() == 1


def _chunks(ranks: Sequence[int], workers: int) -> list[list[int]]:
    """``ranks`` cut into ~4 contiguous chunks per worker (load balance), in order."""
    n = max(min(len(ranks), workers * 4), 1)
    size = -(-len(ranks) // n)
    return [list(ranks[i : i + size]) for i in range(0, len(ranks), size)]


def _work(ranks: list[int]) -> dict[int, StepAnalysis]:
    """In a worker: the analyses of ``ranks`` of the inherited run."""
    assert _run is not None and _analyze is not None
    return _analyze(_run, ranks)


class WorkerAnalyses:
    """Analyses running on worker processes; :meth:`result` collects them (and analyses
    in-process whatever a failed worker did not return)."""

    def __init__(
        self,
        pool: ProcessPoolExecutor,
        futures: list[tuple[list[int], Future[dict[int, StepAnalysis]]]],
        run: LoadedRun,
        analyze: Callable[[LoadedRun, Sequence[int]], dict[int, StepAnalysis]],
        after_rank: Callable[[int], None] | None,
    ) -> None:
        self._pool = pool
        self._futures = futures
        self._run = run
        self._analyze = analyze
        self._after_rank = after_rank
        self._result: dict[int, StepAnalysis] | None = None
        self.failed_chunks = 0
        """Chunks a worker did not return (analysed in-process instead)."""

    def result(self) -> dict[int, StepAnalysis]:
        """Every rank's analysis, by rank (waits for the workers, then lets them exit); then
        ``after_rank(r)`` for every rank (a failed worker's ranks are analysed from this
        process's copy of their rows, so those must stay until here)."""
        if self._result is None:
            out: dict[int, StepAnalysis] = {}
            redo: list[int] = []
            for ranks, fut in self._futures:
                try:
                    out.update(fut.result())
                except Exception:  # a dead worker (BrokenProcessPool) or a failed pickle
                    self.failed_chunks += 1
                    redo.extend(ranks)
            self._pool.shutdown(wait=True)
            if redo:
                out.update(self._analyze(self._run, redo))
            self._result = dict(sorted(out.items()))
            if self._after_rank is not None:
                for r in self._result:
                    self._after_rank(r)
        return self._result


def analyze_in_workers(
    run: LoadedRun,
    analyze: Callable[[LoadedRun, Sequence[int]], dict[int, StepAnalysis]],
    workers: int,
    after_rank: Callable[[int], None] | None = None,
) -> WorkerAnalyses | None:
    """Start ``analyze(run, ranks)`` over all loaded ranks on ``workers`` forked processes and
    return at once (None, with nothing started, where forking is unsafe or ``workers`` < 2).
    ``analyze`` runs in the children (forked: any callable works); ``after_rank(r)`` is called
    for every rank once the results are in (:meth:`WorkerAnalyses.result`)."""
    global _run, _analyze
    ranks = sorted(run.ranks)
    if workers < 2 or len(ranks) < 2 or not can_fork():
        return None
    workers = min(workers, len(ranks))
    _run, _analyze = run, analyze
    try:
        with warnings.catch_warnings():
            # Python >= 3.12 warns about fork() in a process with OS-level threads; numpy's
            # OpenBLAS pool is one, and it re-initialises itself in the child (pthread_atfork).
            warnings.simplefilter("ignore", DeprecationWarning)
            pool = ProcessPoolExecutor(
                max_workers=workers, mp_context=multiprocessing.get_context("fork")
            )
            futures = [(c, pool.submit(_work, c)) for c in _chunks(ranks, workers)]
    except (OSError, RuntimeError, ValueError):
        _run = _analyze = None
        return None
    finally:
        # the children took their copy at the fork; the parent keeps no extra reference
        _run = _analyze = None
    return WorkerAnalyses(pool, futures, run, analyze, after_rank)

"""The per-rank step analyses of a loaded run on forked worker processes
(:mod:`meshprof.forking`).

Why: every rank's step analysis (:mod:`meshprof.analyze.steps`) is independent of the others
and of the cross-rank steps, and costs ~1–3 ms of Python and small numpy calls per rank, nearly
all of it under the GIL: at 4,096 ranks that is 5–8 s, which a second *thread* cannot take off
the cross-rank steps' core. Worker processes can. They are forked after the run is loaded, so
they read the loaded rank files from the parent's memory (copy-on-write: the event and span
arrays are never written, so their pages stay shared) and send back only the results (a few
KB per rank, pickled). Where forking is unsafe :func:`analyze_in_workers` returns None and the
caller analyses in-process; a worker that dies costs no rank (its ranks are analysed
in-process).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from meshprof.forking import Forked, chunks, start, usable_cores

if TYPE_CHECKING:
    from meshprof.analyze.steps import StepAnalysis
    from meshprof.rundir import LoadedRun

MIN_RANKS = 64
"""Below this many loaded ranks the analyses stay in-process (a fork costs more than it saves:
~1–3 ms of analysis per rank against ~10–30 ms to start a worker)."""

MAX_WORKERS = 16
"""At most this many worker processes by default."""

Analyze = Callable[["LoadedRun", Sequence[int]], "dict[int, StepAnalysis]"]


def default_workers(ranks: int) -> int:
    """Worker processes for ``ranks`` loaded ranks: the usable cores (at most
    :data:`MAX_WORKERS`), 1 (none) below :data:`MIN_RANKS` ranks or on one core."""
    if ranks < MIN_RANKS:
        return 1
    return min(usable_cores(), MAX_WORKERS)


class WorkerAnalyses:
    """Analyses running on worker processes; :meth:`result` collects them (and analyses
    in-process whatever a failed worker did not return)."""

    def __init__(
        self,
        forked: Forked[list[int], dict[int, StepAnalysis]],
        parts: list[list[int]],
        run: LoadedRun,
        analyze: Analyze,
        after_rank: Callable[[int], None] | None,
    ) -> None:
        self._forked = forked
        self._parts = parts
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
            for ranks, got in zip(self._parts, self._forked.results(), strict=True):
                if got is None:
                    self.failed_chunks += 1
                    redo.extend(ranks)
                else:
                    out.update(got)
            if redo:
                out.update(self._analyze(self._run, redo))
            self._result = dict(sorted(out.items()))
            if self._after_rank is not None:
                for r in self._result:
                    self._after_rank(r)
        return self._result


def analyze_in_workers(
    run: LoadedRun,
    analyze: Analyze,
    workers: int,
    after_rank: Callable[[int], None] | None = None,
) -> WorkerAnalyses | None:
    """Start ``analyze(run, ranks)`` over all loaded ranks on ``workers`` forked processes and
    return at once (None, with nothing started, where forking is unsafe or ``workers`` < 2).
    ``after_rank(r)`` is called for every rank once the results are in
    (:meth:`WorkerAnalyses.result`)."""
    parts = chunks(sorted(run.ranks), workers)
    forked = start(lambda ranks: analyze(run, ranks), parts, workers)
    if forked is None:
        return None
    return WorkerAnalyses(forked, parts, run, analyze, after_rank)

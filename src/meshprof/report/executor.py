"""Runs report stages over a loaded run: the one place that owns their order, the second thread or
worker processes, the raw rows' release and the heap's.

* Order: the stages' list order (:func:`~meshprof.report.stage.check_stages` proved it works).
* Beside: stages marked ``beside`` (the per-rank step analyses) start first, on forked worker
  processes when :attr:`ReportOptions.workers` > 1 and the stage is ``per_rank`` (its result a
  dict by rank, computable for any subset of ranks: :mod:`meshprof.report.workers`), else on a
  second thread; a stage that takes their result waits for it.
* Raw rows (``release_events``): a rank's event rows go once every stage that reads them called
  ``after_rank(r)``; with workers, their results are collected right after the last in-process
  reader, so the rows are gone before the next stage's peak.
* Intermediates: a result that is no section, not asked to be kept, and no later stage's input
  is dropped after its last use; the heap's free pages go back to the system after the stages
  marked ``release_after``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from meshprof.analyze.compute.heap import release_free_memory
from meshprof.gc_pause import paused_gc
from meshprof.report.stage import INPUTS, ReportOptions, Stage, check_stages, needed
from meshprof.report.workers import analyze_in_workers
from meshprof.rundir import LoadedRun


def _releaser(run: LoadedRun, readers: int) -> Callable[[int], None]:
    """A callback that empties rank r's raw event rows on its ``readers``-th call."""
    left = dict.fromkeys(run.ranks, readers)
    lock = threading.Lock()

    def done_with(r: int) -> None:
        with lock:
            left[r] -= 1
            if left[r] == 0:
                rd = run.ranks[r]
                rd.events = rd.events[:0].copy()

    return done_with


class _Beside:
    """A stage running beside the others: on worker processes or the second thread."""

    def __init__(self, get: Callable[[], Any]) -> None:
        self._get = get

    def result(self) -> Any:
        return self._get()


def _call(s: Stage[Any], values: dict[str, Any], after_rank: Callable[[int], None] | None) -> Any:
    kwargs = {name: values[name] for name in s.inputs}
    if s.reads_events:
        kwargs["after_rank"] = after_rank
    return s.compute(**kwargs)


@paused_gc()
def run_stages(
    run: LoadedRun,
    stages: Sequence[Stage[Any]],
    options: ReportOptions | None = None,
    *,
    only: Iterable[str] | None = None,
    keep: Iterable[str] = (),
) -> dict[str, Any]:
    """Run ``stages`` (those ``only`` needs, when given) and return the sections' results (and
    those named in ``keep``) by key, in stage order."""
    options = options or ReportOptions()
    todo = needed(stages, only) if only is not None else list(stages)
    check_stages(todo)
    keep_set = set(keep) | set(only or ())
    last_use: dict[str, int] = {}
    for i, s in enumerate(todo):
        for name in s.inputs:
            last_use[name] = i
    readers = [s for s in todo if s.reads_events]
    done_with = _releaser(run, len(readers)) if options.release_events and readers else None
    values: dict[str, Any] = {"run": run, "options": options}
    beside: dict[str, _Beside] = {}
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="meshprof-report") as pool:
        for s in todo:
            if not s.beside:
                continue
            in_workers = None
            if options.workers > 1 and s.per_rank:

                def chunk(r: LoadedRun, ranks: Sequence[int], s: Stage[Any] = s) -> Any:
                    return s.compute(r, only_ranks=ranks)

                in_workers = analyze_in_workers(run, chunk, options.workers, done_with)
            if in_workers is not None:
                beside[s.name] = _Beside(in_workers.result)
            else:
                fut: Future[Any] = pool.submit(_call, s, values, done_with)
                beside[s.name] = _Beside(fut.result)
        main_readers = [s.name for s in readers if not s.beside]
        for i, s in enumerate(todo):
            if s.beside:
                continue
            for name in s.inputs:
                if name in beside and name not in values:
                    values[name] = beside[name].result()
            values[s.name] = _call(s, values, done_with)
            if s.reads_events and done_with is not None and s.name == main_readers[-1]:
                # the last in-process reader is done: the readers beside go too, so the rows
                # never coexist with the next stages' peaks
                for r in readers:
                    if r.beside and r.name not in values:
                        values[r.name] = beside[r.name].result()
                release_free_memory()
            for name in s.inputs:
                if last_use.get(name) == i and name not in INPUTS:
                    stage_of = next((t for t in todo if t.name == name), None)
                    if stage_of is not None and not stage_of.section and name not in keep_set:
                        del values[name]
            if s.release_after:
                release_free_memory()
        for name, b in beside.items():
            if name not in values:
                values[name] = b.result()
    wanted = {s.name for s in todo if s.section} | keep_set
    return {s.name: values[s.name] for s in todo if s.name in wanted and s.name in values}

"""Assembles the cross-rank run report from the analyzers: one pure function from a loaded run
to a typed :class:`~meshprof.analyze.report_types.RunReport`.

The steps, in order (each an analyzer of :mod:`meshprof.analyze`):

1. table       every completed event of every rank as columns        (:mod:`.analyze.table`)
2. clock       clock offsets between ranks                           (:mod:`.analyze.clock`)
   failures    ranks that did not finish normally, the first failure  (:mod:`.analyze.failures`)
3. match       collectives matched across ranks, arrival skew, waits (:mod:`.analyze.match`)
4. stragglers  per-step times, straggler scores, slow phases         (:mod:`.analyze.stragglers`)
5. what_if     what each rank, group and dimension costs every step: the matched collectives
               replayed with its compute set to its peers' median    (:mod:`.analyze.what_if`)
6. tables      per-rank, memory, heatmap, dimensions, sizes, groups  (:mod:`.analyze.run_tables`)
7. timeline    a two-step excerpt on the aligned clock     (:mod:`.analyze.merged_timeline`)
8. findings    conclusions with their figures                        (:mod:`.analyze.findings`)
9. steps       step analysis of every rank, from the start beside the others: on worker
               processes (:mod:`.analyze.rank_workers`) or a second thread (:mod:`.analyze.steps`)
10. pipeline   the pipeline bubble of all stages on the aligned clock  (:mod:`.analyze.pipeline`)
11. bottlenecks per-rank rules merged across ranks + cross-rank rules (:mod:`.analyze.run_bottlenecks`)
12. traces     torch.profiler traces: HTA's GPU breakdown per rank, kernel stragglers (:mod:`.analyze.kineto`)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from meshprof.analyze.clock import ClockAlignment, align_clocks
from meshprof.analyze.failures import find_failures
from meshprof.analyze.findings import find_findings
from meshprof.analyze.heap import release_free_memory
from meshprof.analyze.match import CollectiveMatch, match_collectives, summarize_match
from meshprof.analyze.merged_timeline import timeline_excerpt
from meshprof.analyze.rank_workers import WorkerAnalyses, analyze_in_workers
from meshprof.analyze.report_types import RunReport
from meshprof.analyze.run_bottlenecks import run_bottlenecks
from meshprof.analyze.run_tables import (
    comm_share_by_dimension,
    group_rows,
    mean_step_ns,
    memory_imbalance,
    rank_rows,
    recorded_by_size,
    size_rows,
    step_heatmap,
    with_recorded,
)
from meshprof.analyze.stragglers import DEFAULT_THRESHOLD, find_stragglers
from meshprof.analyze.table import EventTable, build_event_table
from meshprof.analyze.what_if import what_if
from meshprof.layout import Layout
from meshprof.rundir import LoadedRun, RankMeta, resolve_layout

if TYPE_CHECKING:
    from meshprof.analyze.bottlenecks import Bottleneck
    from meshprof.analyze.kineto import KinetoReport
    from meshprof.analyze.pipeline import PipelineBubble
    from meshprof.analyze.steps.types import StepAnalysis


@dataclass(frozen=True, slots=True)
class RunAnalysis:
    """The report with the intermediate results it was built from (for renderers that need
    every event, such as the merged trace, without computing them again)."""

    report: RunReport
    """What ``meshprof report`` shows."""
    table: EventTable
    """Every completed event of every loaded rank."""
    clock: ClockAlignment
    """The clock offsets used."""
    match: CollectiveMatch
    """The matched collectives."""


def analyze_run(
    run: LoadedRun,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    bottlenecks: Iterable[Bottleneck] = (),
    hta_rounding: bool = False,
) -> RunReport:
    """Build the cross-rank report of a loaded run (pure: reads ``run``, returns data).

    Bottlenecks come from the step monitor's rules on every rank and the cross-rank rules
    (:mod:`meshprof.analyze.bottlenecks`); ``bottlenecks`` adds more, shown as given.
    ``hta_rounding``: torch.profiler traces are read with HTA 0.5's whole-µs rounding
    (:mod:`meshprof.analyze.kineto_load`)."""
    return analyze_run_parts(
        run, threshold=threshold, bottlenecks=bottlenecks, hta_rounding=hta_rounding
    ).report


def analyze_run_parts(
    run: LoadedRun,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    bottlenecks: Iterable[Bottleneck] = (),
    hta_rounding: bool = False,
    release_events: bool = False,
    workers: int = 1,
) -> RunAnalysis:
    """:func:`analyze_run`, keeping the event table, clock alignment and match it computed.

    ``release_events``: let each rank's raw event rows go once they are in the table (the
    ranks' ``events`` become empty): lower peak memory for a caller that needs only the
    results, such as ``meshprof report``. ``workers`` > 1: the per-rank step analyses run on
    that many forked processes where that is safe (:mod:`meshprof.analyze.rank_workers`; the
    results are the same), else in-process."""
    # The per-rank step analyses do not depend on the cross-rank steps: they run beside them,
    # on worker processes (forked before any thread starts) or on a second thread (numpy
    # releases the GIL in its kernels only: most of their time is under the GIL).
    # When the raw rows are let go, a rank's go once both the table and its analysis have
    # read them: on the thread, rank by rank, and matching waits for the analyses (the rows
    # then never coexist with it); from workers, all at once when their results are in, which
    # clock alignment waits for.
    done_with = _releaser(run) if release_events else None
    in_workers = analyze_in_workers(run, _analyses_of, workers, done_with)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="meshprof-rank-analyses") as pool:
        analyses_future: Future[dict[int, StepAnalysis]] | WorkerAnalyses
        if in_workers is None:
            analyses_future = pool.submit(rank_analyses, run, done_with)
        else:
            analyses_future = in_workers
        table = build_event_table(run, after_rank=done_with, sample_fraction=run.sample_fraction)
        if release_events and in_workers is not None:
            # workers return their ranks' rows only with their results (their fallback reads
            # them): collected here, the rows are gone before clock alignment's peak (1,024
            # ranks × 8M events: 919 -> 702 MiB, no slower, the workers being done by then)
            in_workers.result()
            release_free_memory()
        clock = align_clocks(run, table)
        failures = find_failures(run, clock)
        if release_events:
            analyses_future.result()
        # (between phases: freed temporaries back to the OS before the next phase's peak)
        release_free_memory()
        match = match_collectives(table, clock)
        release_free_memory()
        stragglers = find_stragglers(run, table, clock, match, threshold=threshold)
        release_free_memory()
        what = what_if(run, table, clock, match, stragglers)
        release_free_memory()
        ranks = rank_rows(run, table, stragglers)
        memory = memory_imbalance(ranks)
        dims, share = comm_share_by_dimension(run, table, stragglers)
        timeline, timeline_ns = timeline_excerpt(run, table, clock, stragglers)
        release_free_memory()
        problems = tuple(sorted(run.problems.items()))
        summary = summarize_match(match)
        findings = find_findings(
            stragglers,
            memory,
            problems,
            clock,
            summary,
            run.manifest_state,
            run.manifest_problem,
        )
        analyses = analyses_future.result()
    pipeline = run_pipeline_bubble(run, clock)
    sampled = memory.max_rank >= 0
    found = run_bottlenecks(
        stragglers,
        memory.imbalance if sampled else None,
        memory.max_rank if sampled else None,
        analyses,
        pipeline,
        extra=bottlenecks,
    )
    kineto = run_kineto(run, hta_rounding=hta_rounding)
    by_size = with_recorded(size_rows(table), recorded_by_size(run))
    sampling = None
    if run.sample_fraction < 1:
        from meshprof.analyze.sampling import sampling_info

        recorded = sum(max(rd.file_events, len(rd.events)) for rd in run.ranks.values())
        sampling = sampling_info(
            table, stragglers, by_size, summary.collectives, recorded, run.sample_reason
        )
    report = RunReport(
        path=str(run.path),
        world_size=run.world_size,
        loaded_ranks=tuple(sorted(run.ranks)),
        problems=problems,
        metadata={
            k: v
            for k, v in run.manifest.to_dict().items()
            if isinstance(v, str | int | float | bool | list | dict)
        },
        groups=table.groups,
        clock=clock,
        match=summary,
        group_rows=group_rows(table, match),
        stragglers=stragglers,
        ranks=ranks,
        mean_step_ns=mean_step_ns(ranks),
        heatmap=step_heatmap(stragglers),
        memory=memory,
        dimensions=dims,
        comm_share_by_dim=share,
        comm_share_total=tuple(float(v) for v in share.sum(axis=1)),
        by_size=by_size,
        timeline=timeline,
        timeline_ns=timeline_ns,
        findings=findings,
        bottlenecks=found,
        rank_analyses=tuple(a for _, a in sorted(analyses.items())),
        pipeline=pipeline,
        kineto=kineto,
        failures=failures,
        what_if=what,
        sampling=sampling,
    )
    return RunAnalysis(report, table, clock, match)


def _monitor_meta(run: LoadedRun, meta: RankMeta) -> tuple[dict[str, Any], Layout | None]:
    """A rank's step-monitor settings and its parallel layout (None when unknown)."""
    return meta.monitor or {}, resolve_layout(meta, run.manifest)


def _releaser(run: LoadedRun) -> Callable[[int], None]:
    """A callback that empties rank r's raw event rows on its second call (table + analysis)."""
    left = dict.fromkeys(run.ranks, 2)
    lock = threading.Lock()

    def done_with(r: int) -> None:
        with lock:
            left[r] -= 1
            if left[r] == 0:
                rd = run.ranks[r]
                rd.events = rd.events[:0].copy()

    return done_with


def rank_analyses(
    run: LoadedRun,
    after_rank: Callable[[int], None] | None = None,
    only: Iterable[int] | None = None,
) -> dict[int, StepAnalysis]:
    """The step monitor's analysis of every loaded rank (:mod:`meshprof.analyze.steps`), or of
    the ranks in ``only``; ``after_rank(r)`` is called once rank r is done."""
    from meshprof.analyze.steps import StepOptions, analyze_recorded

    out: dict[int, StepAnalysis] = {}
    wanted = sorted(run.ranks) if only is None else sorted(set(only) & set(run.ranks))
    for r in wanted:
        rd = run.ranks[r]
        mon, layout = _monitor_meta(run, rd.meta)
        options = StepOptions.from_meta(mon, rank=r, layout=layout)
        names = rd.span_names or list(mon.get("span_names", []))
        out[r] = analyze_recorded(rd.spans, names, rd.events, rd.groups, rd.memory, options)
        if after_rank is not None:
            after_rank(r)
    return out


def _analyses_of(run: LoadedRun, ranks: Sequence[int]) -> dict[int, StepAnalysis]:
    """:func:`rank_analyses` of ``ranks`` (what a worker process runs)."""
    return rank_analyses(run, only=ranks)


def run_pipeline_bubble(run: LoadedRun, clock: ClockAlignment) -> PipelineBubble | None:
    """The bubble of every pipeline group, from its stages' spans on the aligned clock (None
    without pipeline parallelism)."""
    from meshprof.analyze.pipeline import StageTimeline, measure_pipeline_bubble

    mon: dict[str, Any] = {}
    layout = None
    for rd in run.ranks.values():
        mon, layout = _monitor_meta(run, rd.meta)
        if layout is not None:
            break
    if layout is None or layout.pp <= 1:
        return None
    stages = [
        StageTimeline(
            r,
            rd.spans,
            rd.span_names or list((rd.meta.monitor or {}).get("span_names", [])),
            clock.offset(r),
        )
        for r, rd in sorted(run.ranks.items())
    ]
    return measure_pipeline_bubble(
        stages,
        layout,
        str(mon.get("schedule", "") or ""),
        int(mon.get("microbatches", 0) or 0),
        int(mon.get("virtual_stages", 1) or 1),
        warmup_steps=int(mon.get("warmup_steps", 0) or 0),
    )


def run_kineto(run: LoadedRun, *, hta_rounding: bool = False) -> KinetoReport | None:
    """The torch.profiler traces in the run directory (written by ``@performance_monitor``, or
    put there by the user): HTA's GPU breakdown per rank (the host split on CPU-only traces),
    the files not read, the kernel-level straggler; None when there are none."""
    from meshprof.analyze.kineto import KinetoReport, find_traces, kineto_report

    try:
        paths = find_traces(run.path)
        return kineto_report(paths, hta_rounding=hta_rounding) if paths else None
    except Exception as e:  # a damaged trace must not cost the rest of the report
        return KinetoReport((), problems=(f"{type(e).__name__}: {e}",))

"""Text of the cross-rank run report (rich tables for the terminal): the same sections as the
HTML report, formatted from the typed :class:`~meshprof.report.run_report.RunReport`.

:data:`TEXT_SECTIONS` is the text, in order: one function per part, each formatting the
sections it reads."""

from __future__ import annotations

import io
from collections.abc import Callable

from rich.console import Console
from rich.table import Table

from meshprof.analyze.run.conclusions.sampling_error import SamplingInfo
from meshprof.analyze.run.types import RankRow
from meshprof.render.changes import changes_lines
from meshprof.render.failures import FAILURE_COLUMNS, failure_cells, failure_headline
from meshprof.render.format import (
    fmt_bytes,
    fmt_ms,
    fmt_ns,
    fmt_pct,
    fmt_rate,
    fmt_signed_pct,
)
from meshprof.render.serving_text import print_serving
from meshprof.render.verdict import print_ledger, print_verdict
from meshprof.render.what_if import what_if_lines
from meshprof.report.run_report import RunReport
from meshprof.report.stages.captures import CAPTURES
from meshprof.report.stages.changes import CHANGES
from meshprof.report.stages.conclusions import PROBLEMS, SUMMARY
from meshprof.report.stages.matching import CLOCK, COLLECTIVES, FAILURES
from meshprof.report.stages.pipeline import BOTTLENECKS, PIPELINE
from meshprof.report.stages.sampling_error import SAMPLING
from meshprof.report.stages.stragglers import STRAGGLERS
from meshprof.report.stages.tables import COMM_SHARE, RANKS
from meshprof.report.stages.traces import KINETO
from meshprof.report.stages.what_if import WHAT_IF_REPLAY

RANK_COLUMNS = (
    "rank",
    "host",
    "steps",
    "step time",
    "p50",
    "p95",
    "p99",
    "steps/s",
    "compute",
    "comm share",
    "wait share",
    "peak memory",
)
"""The per-rank table's leading columns (terminal and HTML); the score columns follow."""


def rank_cells(row: RankRow) -> list[str]:
    """The texts of :data:`RANK_COLUMNS`, then score and arrived-last share, for one rank."""
    return [
        str(row.rank),
        row.host,
        str(row.steps),
        fmt_ns(row.step_ns),
        fmt_ns(row.step_p50_ns),
        fmt_ns(row.step_p95_ns),
        fmt_ns(row.step_p99_ns),
        fmt_rate(row.steps_per_s),
        fmt_ns(row.compute_ns),
        fmt_pct(row.comm_share),
        fmt_pct(row.wait_share),
        fmt_bytes(row.peak_memory_bytes) if row.peak_memory_bytes >= 0 else "-",
        fmt_signed_pct(row.score),
        fmt_pct(row.last_share),
    ]


def _table(title: str, columns: tuple[str, ...] | list[str], left: tuple[str, ...] = ()) -> Table:
    """A rich table titled on the left, columns right-aligned except those in ``left``."""
    t = Table(title=title, title_justify="left")
    for c in columns:
        t.add_column(c, justify="left" if c in left else "right")
    return t


def sampling_line(sm: SamplingInfo) -> str:
    """One line: the sample a report was computed on and the error of its main figures."""
    why = f" ({sm.reason})" if sm.reason else ""
    return (
        f"sampled: {fmt_pct(sm.fraction)} of the collectives{why}: {sm.events_loaded:,} of "
        f"{sm.events_recorded:,} events, {sm.collectives:,} collectives; p50 latency within "
        f"±{fmt_pct(sm.latency_p50_rel_error)} ({sm.confidence:.0%} interval), communication "
        f"share ±{sm.comm_share_error * 100:.2f} points (standard error)"
    )


def _failures(rep: RunReport, console: Console) -> None:
    """The first failure and one row per rank that did not finish normally."""
    failures = rep[FAILURES]
    if failures:
        console.print(f"[bold red]{failure_headline(failures)}[/]", highlight=False, markup=True)
        ft = _table("failures", FAILURE_COLUMNS, left=("how", "signal", "reason"))
        for f in failures:
            ft.add_row(*failure_cells(f))
        console.print(ft)


def _headline(rep: RunReport, console: Console) -> None:
    """What was analyzed, the sample, the job's state, the what-if's lead sentences and the
    ranks not analyzed."""
    sm, s, m = rep[SUMMARY], rep[STRAGGLERS], rep[COLLECTIVES]
    console.print(
        f"[bold]meshprof report[/] {sm.path}: {len(sm.loaded_ranks)} of {sm.world_size} ranks, "
        f"{len(s.steps)} steps, {m.collectives} collectives matched "
        f"({m.incomplete} incomplete), skew p50 {fmt_ns(m.skew_p50_ns)} p95 {fmt_ns(m.skew_p95_ns)}",
        markup=True,
        highlight=False,
    )
    sampling = rep.get(SAMPLING)
    if sampling is not None:
        console.print(sampling_line(sampling), highlight=False, markup=False)
    for line in changes_lines(rep[CHANGES], limit=10):
        console.print(line, highlight=False, markup=False)
    md = sm.metadata
    if md.get("status"):
        nodes = md.get("nodes") or []
        where = (
            f", {len(nodes)} nodes ({', '.join(md.get('hosts') or [])})" if len(nodes) > 1 else ""
        )
        if md.get("nodes_missing"):  # node-local directories: the others were not read
            where += f"; {md['nodes_missing']} of {md.get('nnodes')} nodes not read"
        console.print(
            f"job: {md['status']}, exit code {md.get('exit_code')}{where}",
            highlight=False,
            markup=False,
        )
    for line in what_if_lines(rep.get(WHAT_IF_REPLAY)):
        console.print(line, highlight=False, markup=False)
    for p in rep[PROBLEMS]:
        console.print(f"[red]{p.label} not analyzed:[/] {p.reason}", highlight=False)


def _ranks(rep: RunReport, console: Console) -> None:
    """The per-rank table."""
    t = _table("per rank", (*RANK_COLUMNS, "score", "arrived last"), left=("host",))
    for row in rep[RANKS]:
        t.add_row(*rank_cells(row))
    console.print(t)


def print_report(rep: RunReport, console: Console) -> None:
    """Every part of :data:`TEXT_SECTIONS`, in order."""
    for part in TEXT_SECTIONS:
        part(rep, console)


def _print_findings(rep: RunReport, console: Console) -> None:
    """Findings, then bottlenecks (or that there are none), then the straggler verdict."""
    s = rep[STRAGGLERS]
    findings, bottlenecks = rep[SUMMARY].findings, rep[BOTTLENECKS]
    if findings or bottlenecks:
        console.print("[bold]Findings[/]")
        for f in findings:
            style = "red" if f.severity == "warning" else "yellow"
            console.print(f"  [{style}]•[/] {f.title}", highlight=False, markup=True)
        for b in bottlenecks:
            bn = b.bottleneck
            console.print(
                f"  • {bn.severity.upper()} {bn.category}: {b.evidence_text}",
                highlight=False,
                markup=False,
            )
            console.print(
                f"      rule: {bn.rule}; fix: {bn.suggestion}", highlight=False, markup=False
            )
    else:
        console.print("[green]No straggler, imbalance or bottleneck found.[/]")
    if s.note:
        console.print(f"stragglers: {s.note}")
    elif not s.stragglers:
        console.print(
            f"No straggler (threshold {s.threshold:.0%} and arrived last in most collectives)."
        )


def _print_tables(rep: RunReport, console: Console) -> None:
    """Compute per phase, communication share by dimension, groups and clocks."""
    s = rep[STRAGGLERS]
    if s.phases:
        pt = _table(
            "compute per phase (median per step, communication excluded)", ("rank", *s.phases)
        )
        for i, r in enumerate(s.ranks):
            pt.add_row(str(r), *(fmt_ns(float(v)) for v in s.phase_ns[i]))
        console.print(pt)
    share = rep[COMM_SHARE]
    if share.dimensions:
        dt = _table("communication share of step time by dimension", ("rank", *share.dimensions))
        for i, r in enumerate(s.ranks):
            dt.add_row(str(r), *(fmt_pct(float(v)) for v in share.share[i]))
        console.print(dt)
    gt = _table(
        "collectives by group",
        ("group", "dim", "size", "matched", "incomplete", "skew p50", "skew max", "total wait"),
        left=("group", "dim"),
    )
    for g in rep[COLLECTIVES].groups:
        gt.add_row(
            f"{g.desc} ({g.name})",
            g.dimension,
            str(g.size),
            str(g.collectives),
            str(g.incomplete),
            fmt_ns(g.skew_p50_ns),
            fmt_ns(g.skew_max_ns),
            fmt_ns(g.wait_ns),
        )
    console.print(gt)
    clock = rep[CLOCK]
    ct = _table(
        f"clock alignment (reference rank {clock.reference_rank})",
        ("rank", "method", "offset", "uncertainty"),
    )
    for rc in clock.ranks:
        ct.add_row(
            str(rc.rank),
            rc.method,
            fmt_ms(rc.offset_ns, digits=3, signed=True),
            fmt_ns(rc.uncertainty_ns) if rc.uncertainty_ns >= 0 else "unknown",
        )
    console.print(ct)


def render_report(rep: RunReport, width: int = 140) -> str:
    """The report as plain text."""
    buf = io.StringIO()
    print_report(rep, Console(file=buf, width=width, force_terminal=False, color_system=None))
    return buf.getvalue()


def _print_pipeline_and_traces(rep: RunReport, console: Console) -> None:
    """The joint pipeline bubble and the torch.profiler trace breakdown, when present."""
    p = rep[PIPELINE]
    if p:
        theory = f", theory {p.bubble_theory:.1%}" if p.bubble_theory is not None else ""
        stages = ", ".join(f"rank {r} {v:.1%}" for r, v in sorted(p.per_stage.items()))
        console.print(
            f"pipeline ({p.schedule}, p={p.stages}, m={p.microbatches}, {p.steps} steps, all stages on "
            f"the aligned clock): bubble {p.bubble:.1%}{theory}, utilization {p.utilization:.1%} ({stages})",
            highlight=False,
            markup=False,
        )
    kineto = rep[KINETO]
    if kineto.found:
        from meshprof.render.kineto_view import print_kineto

        print_kineto(kineto, console)


def _print_captures(rep: RunReport, console: Console) -> None:
    """The run's captures, each with what differs most between its ranks."""
    caps = rep.get(CAPTURES) or ()
    if not caps:
        return
    from meshprof.render.captures import capture_lines

    console.print(f"[bold]Captures[/] ({len(caps)})")
    for c in caps:
        for line in capture_lines(c, top=5):
            console.print(line, highlight=False, markup=False)


TEXT_SECTIONS: tuple[Callable[[RunReport, Console], None], ...] = (
    _failures,
    _headline,
    print_verdict,
    print_ledger,
    print_serving,
    _print_findings,
    _ranks,
    _print_pipeline_and_traces,
    _print_captures,
    _print_tables,
)
"""The text report, part by part: a new section's text is one function added here."""

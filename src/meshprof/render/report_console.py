"""The cross-rank report in the terminal (rich): the same findings as the HTML report."""

from __future__ import annotations

import io
import math

from rich.console import Console
from rich.table import Table

from meshprof.analyze.crossrank import RunReport
from meshprof.render.console import fmt_bytes, fmt_ns


def _ns(x: float) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt_ns(x)


def _pct(x: float) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.1%}"


def print_report(rep: RunReport, console: Console) -> None:
    """Summary, findings and bottlenecks, per-rank table, stragglers, groups and clocks."""
    s = rep.stragglers
    console.print(
        f"[bold]meshprof report[/] {rep.path}: {len(rep.loaded_ranks)} of {rep.world_size} ranks, "
        f"{len(s.steps)} steps, {rep.match.collectives} collectives matched "
        f"({rep.match.incomplete} incomplete), skew p50 {_ns(rep.match.skew_p50_ns)} p95 {_ns(rep.match.skew_p95_ns)}",
        markup=True,
        highlight=False,
    )
    md = rep.metadata
    if md.get("status"):
        nodes = md.get("nodes") or []
        where = (
            f", {len(nodes)} nodes ({', '.join(md.get('hosts') or [])})" if len(nodes) > 1 else ""
        )
        console.print(
            f"job: {md['status']}, exit code {md.get('exit_code')}{where}",
            highlight=False,
            markup=False,
        )
    for r, why in rep.problems:
        console.print(f"[red]rank {r} not analyzed:[/] {why}", highlight=False)
    if rep.findings or rep.bottlenecks:
        console.print("[bold]Findings[/]")
        for f in rep.findings:
            style = "red" if f.severity == "warning" else "yellow"
            console.print(f"  [{style}]•[/] {f.title}", highlight=False, markup=True)
        for b in rep.bottlenecks:
            if "category" in b and "rule" in b:  # a meshprof.monitor Bottleneck
                console.print(
                    f"  • {str(b.get('severity', '')).upper()} {b['category']}: {b.get('evidence', '')}",
                    highlight=False,
                    markup=False,
                )
                console.print(
                    f"      rule: {b['rule']}; fix: {b.get('suggestion', '')}",
                    highlight=False,
                    markup=False,
                )
                continue
            title = b.get("title") or b.get("message") or b.get("kind") or "bottleneck"
            console.print(
                f"  • [{b.get('severity', 'info')}] {title}", highlight=False, markup=False
            )
    else:
        console.print("[green]No straggler, imbalance or bottleneck found.[/]")
    if s.note:
        console.print(f"stragglers: {s.note}")
    elif not s.stragglers:
        console.print(
            f"No straggler (threshold {s.threshold:.0%} and arrived last in most collectives)."
        )
    t = Table(title="per rank", title_justify="left")
    for c in (
        "rank",
        "host",
        "steps",
        "step time",
        "compute",
        "comm share",
        "wait share",
        "peak memory",
        "score",
        "arrived last",
    ):
        t.add_column(c, justify="left" if c == "host" else "right")
    for row in rep.ranks:
        t.add_row(
            str(row.rank),
            row.host,
            str(row.steps),
            _ns(row.step_ns),
            _ns(row.compute_ns),
            _pct(row.comm_share),
            _pct(row.wait_share),
            fmt_bytes(row.peak_memory_bytes) if row.peak_memory_bytes >= 0 else "-",
            f"{row.score:+.1%}",
            _pct(row.last_share),
        )
    console.print(t)
    _print_pipeline_and_traces(rep, console)
    if s.phases:
        pt = Table(
            title="compute per phase (median per step, communication excluded)",
            title_justify="left",
        )
        pt.add_column("rank", justify="right")
        for p in s.phases:
            pt.add_column(p, justify="right")
        for i, r in enumerate(s.ranks):
            pt.add_row(str(r), *(_ns(float(v)) for v in s.phase_ns[i]))
        console.print(pt)
    if rep.dimensions:
        dt = Table(title="communication share of step time by dimension", title_justify="left")
        dt.add_column("rank", justify="right")
        for d in rep.dimensions:
            dt.add_column(d, justify="right")
        for i, r in enumerate(s.ranks):
            dt.add_row(str(r), *(_pct(float(v)) for v in rep.comm_share_by_dim[i]))
        console.print(dt)
    gt = Table(title="collectives by group", title_justify="left")
    for c in (
        "group",
        "dim",
        "size",
        "matched",
        "incomplete",
        "skew p50",
        "skew max",
        "total wait",
    ):
        gt.add_column(c, justify="left" if c in ("group", "dim") else "right")
    for g in rep.group_rows:
        gt.add_row(
            f"{g.desc} ({g.name})",
            g.dimension,
            str(g.size),
            str(g.collectives),
            str(g.incomplete),
            _ns(g.skew_p50_ns),
            _ns(g.skew_max_ns),
            _ns(g.wait_ns),
        )
    console.print(gt)
    ct = Table(
        title=f"clock alignment (reference rank {rep.clock.reference_rank})", title_justify="left"
    )
    for c in ("rank", "method", "offset", "uncertainty"):
        ct.add_column(c, justify="right")
    for rc in rep.clock.ranks:
        ct.add_row(
            str(rc.rank),
            rc.method,
            f"{rc.offset_ns / 1e6:+.3f} ms",
            _ns(rc.uncertainty_ns) if rc.uncertainty_ns >= 0 else "unknown",
        )
    console.print(ct)


def render_report(rep: RunReport, width: int = 140) -> str:
    """The report as plain text."""
    buf = io.StringIO()
    print_report(rep, Console(file=buf, width=width, force_terminal=False, color_system=None))
    return buf.getvalue()


def _print_pipeline_and_traces(rep: RunReport, console: Console) -> None:
    """The joint pipeline bubble and the torch.profiler trace breakdown, when present."""
    p = rep.pipeline
    if p:
        theory = f", theory {p['bubble_theory']:.1%}" if p.get("bubble_theory") is not None else ""
        stages = ", ".join(
            f"rank {r} {v:.1%}"
            for r, v in sorted(p["per_stage"].items(), key=lambda kv: int(kv[0]))
        )
        console.print(
            f"pipeline ({p['schedule']}, p={p['stages']}, m={p['microbatches']}, {p['steps']} steps, all stages on "
            f"the aligned clock): bubble {p['bubble']:.1%}{theory}, utilization {p['utilization']:.1%} ({stages})",
            highlight=False,
            markup=False,
        )
    if rep.kineto is not None:
        from meshprof.render.kineto_view import print_kineto

        print_kineto(rep.kineto, console)

"""The report in a terminal at any scale: the verdict first, then where the time went, the ranks as
spreads and outliers, the groups by kind — never one line per rank, under 40 lines and readable at
80 columns whatever the world size (``meshprof report --full`` prints every table,
:mod:`meshprof.render.report_text`). Formatting only: every figure is a field of a section.

:data:`BRIEF_PARTS` is the view, in order.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console

from meshprof.analyze.run.overview import Spread
from meshprof.render.changes import changes_lines
from meshprof.render.failures import failure_headline
from meshprof.render.format import fmt_bytes, fmt_ns, fmt_pct, fmt_signed_pct
from meshprof.render.report_text import sampling_line
from meshprof.render.serving_text import print_serving_brief
from meshprof.render.verdict import print_ledger, print_verdict, say
from meshprof.report.run_report import RunReport
from meshprof.report.stages.changes import CHANGES
from meshprof.report.stages.conclusions import PROBLEMS, SUMMARY
from meshprof.report.stages.matching import CLOCK, COLLECTIVES, FAILURES
from meshprof.report.stages.overview import OVERVIEW
from meshprof.report.stages.pipeline import BOTTLENECKS
from meshprof.report.stages.sampling_error import SAMPLING
from meshprof.report.stages.stragglers import STRAGGLERS
from meshprof.report.stages.traces import KINETO

MAX_GROUP_KINDS = 3
"""Group kinds shown."""

_SPREAD_NAMES = {
    "step_ns": "step time",
    "compute_ns": "compute",
    "comm_share": "comm share",
    "wait_share": "wait share",
    "peak_memory_bytes": "peak memory",
    "score": "score",
}


def _value(figure: str, v: float) -> str:
    if figure in ("comm_share", "wait_share"):
        return fmt_pct(v)
    if figure == "score":
        return fmt_signed_pct(v)
    if figure == "peak_memory_bytes":
        return fmt_bytes(v) if v == v else "-"
    return fmt_ns(v)


def _headline(rep: RunReport, console: Console) -> None:
    """What was analyzed, the job's state and the sample."""
    sm, s, m = rep[SUMMARY], rep[STRAGGLERS], rep[COLLECTIVES]
    say(
        console,
        f"meshprof report {sm.path}: {len(sm.loaded_ranks):,} of {sm.world_size:,} ranks, "
        f"{len(s.steps):,} steps, {m.collectives:,} collectives matched "
        f"({m.incomplete:,} incomplete), mean step {fmt_ns(sm.mean_step_ns)}",
    )
    md = sm.metadata
    if md.get("status"):
        nodes = md.get("nodes") or []
        where = f", {len(nodes)} nodes" if len(nodes) > 1 else ""
        if md.get("nodes_missing"):  # node-local directories: the others were not read
            where += f"; {md['nodes_missing']} of {md.get('nnodes')} nodes not read"
        say(console, f"job: {md['status']}, exit code {md.get('exit_code')}{where}")
    failures = rep[FAILURES]
    if failures:
        say(console, f"failed: {failure_headline(failures)}")
    problems = rep[PROBLEMS]
    if problems:
        ranks = ", ".join(
            str(p.rank) if p.last is None else f"{p.rank}–{p.last:,}" for p in problems[:8]
        ) + (", …" if len(problems) > 8 else "")
        count = sum(p.count for p in problems)
        say(console, f"not analyzed: {count:,} rank(s) ({ranks}): {problems[0].reason}")
    sampling = rep.get(SAMPLING)
    if sampling is not None:
        say(console, sampling_line(sampling))
    for line in changes_lines(rep[CHANGES], limit=2):
        say(console, line)


def _spread_line(sp: Spread) -> str:
    name = _SPREAD_NAMES.get(sp.figure, sp.figure)
    if sp.max_rank < 0:
        return f"  {name:<12}{'-':>11}"
    cells = "".join(f"{_value(sp.figure, v):>11}" for v in (sp.min, sp.p50, sp.p95, sp.max))
    return f"  {name:<12}{cells}  (rank {sp.max_rank})"


def _ranks(rep: RunReport, console: Console) -> None:
    """Each per-rank figure across ranks, and the outliers."""
    ov = rep[OVERVIEW]
    header = "".join(f"{h:>11}" for h in ("min", "p50", "p95", "max"))
    console.print(f"{'across ranks':<14}{header}  max at", highlight=False, markup=False)
    for sp in ov.spread:
        console.print(_spread_line(sp), highlight=False, markup=False)
    s = rep[STRAGGLERS]
    named_ranks = {x.rank for x in s.stragglers}
    if s.stragglers:
        text = "stragglers: " + "; ".join(
            f"rank {x.rank} ({fmt_signed_pct(x.score)} compute"
            + (f" in {x.phase}" if x.phase else "")
            + f", arrived last {fmt_pct(x.last_share, 0)})"
            for x in s.stragglers[:3]
        )
    elif s.note:
        text = f"stragglers: {s.note}"
    else:
        text = f"stragglers: none (score above {s.threshold:.0%}, arrived last in most)"
    others = [o for o in ov.outliers if o.rank not in named_ranks][:3]
    if others:
        text += "; furthest from the median: " + ", ".join(
            f"{o.rank} ({fmt_signed_pct(o.score)})" for o in others
        )
    say(console, text)


def _groups(rep: RunReport, console: Console) -> None:
    """The process groups by kind, largest total wait first; the clocks."""
    kinds = rep[OVERVIEW].group_kinds
    if kinds:
        console.print(
            f"{'groups':<20}{'count':>6}{'wait':>11}{'skew p50':>11}{'skew max':>11}",
            highlight=False,
            markup=False,
        )
    for k in kinds[:MAX_GROUP_KINDS]:
        name = f"{k.dimension} {k.desc}"
        name = name if len(name) <= 19 else name[:18] + "…"
        console.print(
            f"  {name:<18}{k.groups:>6}{fmt_ns(k.wait_ns):>11}{fmt_ns(k.skew_p50_ns):>11}"
            f"{fmt_ns(k.skew_max_ns):>11}",
            highlight=False,
            markup=False,
        )
    if len(kinds) > MAX_GROUP_KINDS:
        say(console, f"(+{len(kinds) - MAX_GROUP_KINDS} more kinds of groups: --full)", "  ")
    c = rep[CLOCK]
    if c.max_uncertainty_ns >= 0:
        say(
            console,
            f"clocks aligned within {fmt_ns(c.max_uncertainty_ns)} (rank {c.reference_rank})",
        )
    else:
        unaligned = [rc.rank for rc in c.ranks if rc.method == "none"]
        say(console, f"clocks: ranks {', '.join(map(str, unaligned[:8]))} could not be aligned")


def _rest(rep: RunReport, console: Console) -> None:
    """Findings the verdict does not already say, the traces, and where the rest is."""
    said = {"straggler", "memory_imbalance"}
    summary = rep[SUMMARY]
    other = [f for f in summary.findings if f.kind not in said]
    root = summary.path.rstrip("/") + "/"
    for f in other[:3]:  # paths inside the run directory as the reader typed them: shorter
        say(console, f"note: {f.title.replace(root, '')}", indent="  ")
    mem = [f for f in rep[SUMMARY].findings if f.kind == "memory_imbalance"]
    for f in mem[:1]:
        say(console, f"memory: {f.title}", indent="  ")
    rules = {b.bottleneck.kind for b in rep[BOTTLENECKS]}
    if rules:
        say(console, f"rules fired: {', '.join(sorted(rules))} (details: --full)")
    k = rep[KINETO]
    if k.found and (k.ranks or k.problems):
        from meshprof.render.kineto_view import straggler_line

        line = straggler_line(k)
        say(
            console,
            f"torch.profiler traces: {len(k.ranks)} rank(s) read"
            + (f", {len(k.problems)} not read" if k.problems else "")
            + (f"; {line}" if line else ""),
        )
    say(console, "every table: --full; some ranks: --ranks 3,17; JSON: --json")


BRIEF_PARTS: tuple[Callable[[RunReport, Console], None], ...] = (
    _headline,
    print_verdict,
    print_ledger,
    print_serving_brief,
    _ranks,
    _groups,
    _rest,
)
"""The brief view, part by part."""


def print_brief(rep: RunReport, console: Console) -> None:
    """Every part of :data:`BRIEF_PARTS`, in order."""
    for part in BRIEF_PARTS:
        part(rep, console)


def print_rank_rows(rep: RunReport, console: Console, ranks: list[int]) -> None:
    """The per-rank table's rows of ``ranks`` (those the report has; the others are named)."""
    from rich.table import Table

    from meshprof.render.report_text import RANK_COLUMNS, rank_cells
    from meshprof.report.stages.tables import RANKS

    by_rank = {r.rank: r for r in rep[RANKS]}
    missing = [r for r in ranks if r not in by_rank]
    t = Table(title="ranks", title_justify="left")
    for c in (*RANK_COLUMNS, "score", "arrived last"):
        t.add_column(c, justify="left" if c == "host" else "right")
    for r in ranks:
        if r in by_rank:
            t.add_row(*rank_cells(by_rank[r]))
    console.print(t)
    if missing:
        say(console, f"not in this report: ranks {', '.join(map(str, missing))}")

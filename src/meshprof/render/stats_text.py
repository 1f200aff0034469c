"""Text of collective statistics (rich tables): per op, group, rank and message size."""

from __future__ import annotations

import io
from collections.abc import Mapping

from rich.console import Console
from rich.table import Table

from meshprof.render.format import fmt_bytes, fmt_gbps, fmt_ns
from meshprof.stats import OpStats, StatsReport


def stats_table(
    title: str, rows: list[OpStats], first_col: str, labels: Mapping[str, str] | None = None
) -> Table:
    """One table of ``rows``; ``labels`` names their keys (a group's dimension and
    description for its name)."""
    t = Table(title=title, title_justify="left", show_lines=False)
    t.add_column(first_col)
    inflight = any(s.inflight for s in rows)  # the column only when a read caught some
    for name in (
        "count",
        *(("in flight",) if inflight else ()),
        "bytes",
        "total",
        "mean",
        "p50",
        "p95",
        "p99",
        "max",
        "algbw GB/s",
        "busbw GB/s",
        "errors",
    ):
        t.add_column(name, justify="right")
    for s in rows:
        key = fmt_bytes(int(s.key)) if first_col == "size ≤" else s.key
        key = (labels or {}).get(key, key)
        t.add_row(
            key,
            str(s.count),
            *((str(s.inflight),) if inflight else ()),
            fmt_bytes(s.total_bytes),
            fmt_ns(s.total_ns),
            fmt_ns(s.mean_ns),
            fmt_ns(s.p50_ns),
            fmt_ns(s.p95_ns),
            fmt_ns(s.p99_ns),
            fmt_ns(s.max_ns),
            fmt_gbps(s.mean_algbw_gbps),
            fmt_gbps(s.mean_busbw_gbps),
            str(s.errors),
        )
    return t


def render_stats(
    report: StatsReport,
    header: str = "",
    width: int = 140,
    group_labels: Mapping[str, str] | None = None,
) -> str:
    """The per-op, per-group, per-rank and per-size tables as plain text; ``group_labels``
    maps a group's name to what the table shows (:func:`meshprof.layout.group_label`)."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=False, color_system=None)
    print_stats(report, console, header, group_labels)
    return buf.getvalue()


def print_stats(
    report: StatsReport,
    console: Console,
    header: str = "",
    group_labels: Mapping[str, str] | None = None,
) -> None:
    note = (
        "percentiles: exact"
        if report.percentiles == "exact"
        else f"percentiles: sketch (±{report.sketch_relative_error:.0%} relative error)"
    )
    prefix = f"{header} — " if header else ""
    console.print(stats_table(f"{prefix}collectives by op ({note})", report.by_op, "op"))
    console.print(stats_table("by process group", report.by_group, "group", group_labels))
    if len(report.by_rank) > 1:
        console.print(stats_table("by rank", report.by_rank, "rank"))
    console.print(
        stats_table(
            "by message size (nccl-tests S, power-of-two buckets)", report.by_size, "size ≤"
        )
    )

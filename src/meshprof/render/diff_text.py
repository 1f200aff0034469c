"""Text of a run comparison (``meshprof diff A B``) for the terminal: the headline, the notes,
then step, phases, ranks, collectives, communication share, memory, throughput and the
bottlenecks that appeared or vanished, formatted from the typed
:class:`~meshprof.analyze.diff.types.RunDiff`. Long tables show their first rows (the largest
changes); ``--json`` has them all."""

from __future__ import annotations

import io
import math

from rich.console import Console
from rich.table import Table

from meshprof.analyze.diff.types import Headline, RateDiff, RunDiff
from meshprof.render.changes import changes_lines
from meshprof.render.format import (
    fmt_bytes,
    fmt_delta_bytes,
    fmt_delta_ns,
    fmt_gbps,
    fmt_ns,
    fmt_pct,
    fmt_rate,
    fmt_signed_pct,
    is_missing,
)
from meshprof.render.serving_text import print_serving_diff

MAX_ROWS = 10
"""Rows a table shows in the terminal (the largest changes)."""


def _table(title: str, columns: tuple[str, ...], left: tuple[str, ...] = ()) -> Table:
    t = Table(title=title, title_justify="left")
    for c in columns:
        t.add_column(c, justify="left" if c in left else "right")
    return t


def _rel(rel: float) -> str:
    """A relative change as a signed percentage, after a delta in parentheses ("" when
    missing)."""
    return "" if is_missing(rel) else f", {fmt_signed_pct(rel)}"


def _pct(rel: float) -> str:
    """A relative change as a table cell ("-" when missing)."""
    return "-" if is_missing(rel) else fmt_signed_pct(rel)


def _value(x: float, unit: str) -> str:
    if unit == "ns":
        return fmt_ns(x)
    if unit == "bytes":
        return fmt_bytes(x) if not is_missing(x) and x >= 0 else "-"
    if unit == "fraction":
        return fmt_pct(x)
    return fmt_rate(x)


def headline_text(h: Headline) -> str:
    """One headline entry: ``what  A → B  (delta, relative)``."""
    if h.unit == "ns":
        delta = fmt_delta_ns(h.delta)
    elif h.unit == "bytes":
        delta = fmt_delta_bytes(h.delta)
    elif h.unit == "fraction":
        delta = f"{h.delta * 100:+.1f} points"
    else:
        delta = f"{h.delta:+.3g}/s"
    rel = "" if is_missing(h.rel) else f", {fmt_signed_pct(h.rel)}"
    return f"{h.what}: {_value(h.a, h.unit)} → {_value(h.b, h.unit)} ({delta}{rel})"


def _more(console: Console, shown: int, total: int) -> None:
    if total > shown:
        console.print(f"  ({total - shown} more rows in --json)", highlight=False)


def _rate_text(name: str, r: RateDiff) -> str:
    delta = "-" if is_missing(r.delta) else f"{r.delta:+.3g}/s"
    return f"{name} {fmt_rate(r.a)} → {fmt_rate(r.b)} ({delta}{_rel(r.rel)})"


def print_diff(d: RunDiff, console: Console) -> None:
    """The comparison, most significant changes first."""
    console.print(
        f"[bold]meshprof diff[/] A={d.a_path} ({d.a_world_size} ranks) → "
        f"B={d.b_path} ({d.b_world_size} ranks); deltas are B − A",
        highlight=False,
    )
    if d.headline:
        console.print("[bold]Largest changes[/]")
        for h in d.headline:
            console.print(f"  • {headline_text(h)}", highlight=False, markup=False)
    else:
        console.print("No change large enough for the headline (5% and 1% of the step).")
    for n in d.notes:
        console.print(f"note: {n}", highlight=False, markup=False)
    for side, t in (("A", d.a_changes), ("B", d.b_changes)):
        for line in changes_lines(t, limit=2) if t is not None else ():
            console.print(f"{side}: {line}", highlight=False, markup=False)
    if d.step is not None:
        s = d.step
        console.print(
            f"step time (median): {fmt_ns(s.a_ns)} → {fmt_ns(s.b_ns)} "
            f"({fmt_delta_ns(s.delta_ns)}{_rel(s.rel)})",
            highlight=False,
        )
    _print_tables(d, console)
    m = d.memory
    if m.delta_bytes is not None:
        console.print(
            f"peak memory (highest rank): {fmt_bytes(m.a_max_bytes)} (rank {m.a_max_rank}) → "
            f"{fmt_bytes(m.b_max_bytes)} (rank {m.b_max_rank}) "
            f"({fmt_delta_bytes(m.delta_bytes)}{_rel(m.rel)})",
            highlight=False,
        )
    tp = d.throughput
    rates = [_rate_text("steps/s", tp.steps_per_s)]
    if tp.tokens_per_s is not None:
        rates.append(_rate_text("tokens/s", tp.tokens_per_s))
    console.print("throughput: " + "; ".join(rates), highlight=False)
    print_serving_diff(d.serving, console)
    b = d.bottlenecks
    if not b.appeared and not b.vanished:
        console.print("Bottlenecks and findings: the same in both runs.")
    for sign, what, items in (("+", "appeared", b.appeared), ("-", "vanished", b.vanished)):
        for f in items:
            console.print(
                f"  {sign} {what}: {f.severity.upper()} {f.title}", highlight=False, markup=False
            )


def _print_tables(d: RunDiff, console: Console) -> None:
    """Phases, ranks, collectives and communication share, the largest changes first."""
    if d.phases:
        t = _table(
            "phases (median per step)", ("phase", "A", "B", "delta", "change"), left=("phase",)
        )
        for p in d.phases[:MAX_ROWS]:
            t.add_row(
                p.phase, fmt_ns(p.a_ns), fmt_ns(p.b_ns), fmt_delta_ns(p.delta_ns), _pct(p.rel)
            )
        console.print(t)
        _more(console, MAX_ROWS, len(d.phases))
    if d.ranks:
        t = _table(
            "per rank (medians per step)",
            (
                "rank",
                "step A",
                "step B",
                "step delta",
                "compute delta",
                "wait delta",
                "memory delta",
            ),
        )
        for r in d.ranks[:MAX_ROWS]:
            t.add_row(
                str(r.rank),
                fmt_ns(r.a_step_ns),
                fmt_ns(r.b_step_ns),
                fmt_delta_ns(r.step_delta_ns),
                fmt_delta_ns(r.compute_delta_ns),
                fmt_delta_ns(r.wait_delta_ns),
                fmt_delta_bytes(r.memory_delta_bytes),
            )
        console.print(t)
        _more(console, MAX_ROWS, len(d.ranks))
    if d.collectives:
        t = _table(
            "collectives by op and size (median)",
            ("op", "size", "A p50", "B p50", "delta", "change", "A busbw", "B busbw", "A n", "B n"),
            left=("op",),
        )
        for c in d.collectives[:MAX_ROWS]:
            t.add_row(
                c.op,
                fmt_bytes(c.size_bytes),
                fmt_ns(c.a_p50_ns),
                fmt_ns(c.b_p50_ns),
                fmt_delta_ns(c.delta_ns),
                _pct(c.rel),
                _gbps(c.a_busbw_gbps),
                _gbps(c.b_busbw_gbps),
                str(c.a_count),
                str(c.b_count),
            )
        console.print(t)
        _more(console, MAX_ROWS, len(d.collectives))
    if d.comm_share:
        t = _table("communication share of the step by dimension", ("dim", "A", "B", "delta"))
        for s in d.comm_share:
            t.add_row(s.dim, fmt_pct(s.a), fmt_pct(s.b), f"{s.delta * 100:+.1f} points")
        console.print(t)


def _gbps(x: float) -> str:
    return "-" if math.isnan(x) else fmt_gbps(x) + " GB/s"


def render_diff(d: RunDiff, width: int = 120) -> str:
    """The comparison as plain text (no colour, no terminal codes)."""
    buf = io.StringIO()
    print_diff(d, Console(file=buf, width=width, force_terminal=False, color_system=None))
    return buf.getvalue()


__all__ = ["MAX_ROWS", "headline_text", "print_diff", "render_diff"]

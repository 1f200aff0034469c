"""Text of a run comparison (``meshprof diff A B``) for the terminal: the headline, the notes,
then step, phases, ranks, collectives, communication share, memory, throughput and the
bottlenecks that appeared or vanished, formatted from the typed
:class:`~meshprof.analyze.diff.types.RunDiff`. Long tables show their first rows (the largest
changes); ``--json`` has them all."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from meshprof.analyze.diff.types import RunDiff
from meshprof.render.changes import changes_lines
from meshprof.render.diff_tables import (
    DiffTable,
    diff_tables,
    headline_text,
    memory_text,
    rate_texts,
    step_text,
)
from meshprof.render.serving_text import print_serving_diff

MAX_ROWS = 10
"""Rows a table shows in the terminal (the largest changes)."""


def _print_table(console: Console, table: DiffTable) -> None:
    t = Table(title=table.title, title_justify="left")
    for c in table.columns:
        t.add_column(c, justify="left" if c in table.left else "right")
    for row in table.rows[:MAX_ROWS]:
        t.add_row(*(text for text, _ in row))
    console.print(t)
    if len(table.rows) > MAX_ROWS:
        console.print(f"  ({len(table.rows) - MAX_ROWS} more rows in --json)", highlight=False)


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
    step = step_text(d)
    if step is not None:
        console.print(step, highlight=False)
    for table in diff_tables(d):
        _print_table(console, table)
    if d.memory.delta_bytes is not None:
        console.print(memory_text(d), highlight=False)
    console.print("throughput: " + "; ".join(rate_texts(d)), highlight=False)
    print_serving_diff(d.serving, console)
    b = d.bottlenecks
    if not b.appeared and not b.vanished:
        console.print("Bottlenecks and findings: the same in both runs.")
    for sign, what, items in (("+", "appeared", b.appeared), ("-", "vanished", b.vanished)):
        for f in items:
            console.print(
                f"  {sign} {what}: {f.severity.upper()} {f.title}", highlight=False, markup=False
            )


def render_diff(d: RunDiff, width: int = 120) -> str:
    """The comparison as plain text (no colour, no terminal codes)."""
    buf = io.StringIO()
    print_diff(d, Console(file=buf, width=width, force_terminal=False, color_system=None))
    return buf.getvalue()


__all__ = ["MAX_ROWS", "headline_text", "print_diff", "render_diff"]

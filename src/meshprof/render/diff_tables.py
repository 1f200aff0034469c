"""The cells of ``meshprof diff``'s tables and sentences, once for both views: the terminal
(:mod:`meshprof.render.diff_text`) and the HTML page (:mod:`meshprof.render.diff_html`) lay them
out, each its own way. Formatting only: every figure is a field of
:class:`~meshprof.analyze.diff.types.RunDiff`."""

from __future__ import annotations

from dataclasses import dataclass

from meshprof.analyze.diff.types import Headline, RateDiff, RunDiff
from meshprof.render.format import (
    MISSING,
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

Cell = tuple[str, float | int | str | None]
"""A table cell: its text and the value it sorts by."""


@dataclass(frozen=True, slots=True)
class DiffTable:
    """One table of the comparison, rows largest change first."""

    key: str
    """Short name ("phases", "ranks", "collectives", "shares")."""
    title: str
    columns: tuple[str, ...]
    left: tuple[str, ...]
    """Columns of text (aligned left in the terminal)."""
    rows: list[list[Cell]]


def rel_suffix(rel: float) -> str:
    """A relative change after a delta in parentheses (", +5.0%"; "" when missing)."""
    return "" if is_missing(rel) else f", {fmt_signed_pct(rel)}"


def rel_cell(rel: float) -> str:
    """A relative change as a table cell ("-" when missing)."""
    return MISSING if is_missing(rel) else fmt_signed_pct(rel)


def points(delta: float) -> str:
    """A change of a fraction in percentage points ("+2.0 points")."""
    return f"{delta * 100:+.1f} points"


def _gbps(x: float) -> str:
    return MISSING if is_missing(x) else fmt_gbps(x)


def figure_value(x: float, unit: str) -> str:
    """A compared figure for people, by its unit ("ns", "bytes", "fraction", else a rate)."""
    if unit == "ns":
        return fmt_ns(x)
    if unit == "bytes":
        return fmt_bytes(x) if not is_missing(x) and x >= 0 else MISSING
    if unit == "fraction":
        return fmt_pct(x)
    return fmt_rate(x)


def delta_text(delta: float, unit: str) -> str:
    """B − A of a compared figure, by its unit (fractions in percentage points, rates per
    second; "-" when missing)."""
    if unit == "ns":
        return fmt_delta_ns(delta)
    if unit == "bytes":
        return fmt_delta_bytes(delta)
    if is_missing(delta):
        return MISSING
    if unit == "fraction":
        return points(delta)
    return f"{delta:+.3g}/s"


def headline_text(h: Headline) -> str:
    """One headline entry: ``what: A → B (delta, relative)``, and for a collective that grew
    mostly by waiting, how much of it is the members' median wait for late ranks."""
    text = (
        f"{h.what}: {figure_value(h.a, h.unit)} → {figure_value(h.b, h.unit)} "
        f"({delta_text(h.delta, h.unit)}{rel_suffix(h.rel)})"
    )
    if h.mostly_waiting:
        text += f", mostly waiting for late ranks (median wait {fmt_delta_ns(h.wait_delta_ns)})"
    return text


def step_text(d: RunDiff) -> str | None:
    """The median step time, A → B (None: not comparable)."""
    s = d.step
    if s is None:
        return None
    return (
        f"step time (median): {fmt_ns(s.a_ns)} → {fmt_ns(s.b_ns)} "
        f"({fmt_delta_ns(s.delta_ns)}{rel_suffix(s.rel)})"
    )


def memory_text(d: RunDiff) -> str:
    """The highest rank's peak memory, A → B."""
    m = d.memory
    if m.delta_bytes is None:
        return "peak memory: not sampled in both runs"
    return (
        f"peak memory (highest rank): {fmt_bytes(m.a_max_bytes)} (rank {m.a_max_rank}) → "
        f"{fmt_bytes(m.b_max_bytes)} (rank {m.b_max_rank}) "
        f"({fmt_delta_bytes(m.delta_bytes)}{rel_suffix(m.rel)})"
    )


def rate_texts(d: RunDiff) -> list[str]:
    """Steps/s (and tokens/s when both runs counted tokens), A → B."""

    def one(name: str, r: RateDiff) -> str:
        delta = MISSING if is_missing(r.delta) else f"{r.delta:+.3g}/s"
        return f"{name} {fmt_rate(r.a)} → {fmt_rate(r.b)} ({delta}{rel_suffix(r.rel)})"

    tp = d.throughput
    out = [one("steps/s", tp.steps_per_s)]
    if tp.tokens_per_s is not None:
        out.append(one("tokens/s", tp.tokens_per_s))
    return out


def diff_tables(d: RunDiff) -> list[DiffTable]:
    """Phases, ranks, collectives and communication share (empty tables left out)."""
    tables = [
        DiffTable(
            "phases",
            "phases (median per step)",
            ("phase", "A", "B", "delta", "change"),
            ("phase",),
            [
                [
                    (p.phase, p.phase),
                    (fmt_ns(p.a_ns), p.a_ns),
                    (fmt_ns(p.b_ns), p.b_ns),
                    (fmt_delta_ns(p.delta_ns), p.delta_ns),
                    (rel_cell(p.rel), p.rel),
                ]
                for p in d.phases
            ],
        ),
        DiffTable(
            "ranks",
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
            (),
            [
                [
                    (str(r.rank), r.rank),
                    (fmt_ns(r.a_step_ns), r.a_step_ns),
                    (fmt_ns(r.b_step_ns), r.b_step_ns),
                    (fmt_delta_ns(r.step_delta_ns), r.step_delta_ns),
                    (fmt_delta_ns(r.compute_delta_ns), r.compute_delta_ns),
                    (fmt_delta_ns(r.wait_delta_ns), r.wait_delta_ns),
                    (fmt_delta_bytes(r.memory_delta_bytes), r.memory_delta_bytes),
                ]
                for r in d.ranks
            ],
        ),
        DiffTable(
            "collectives",
            "collectives by op and size (median)",
            (
                "op",
                "size",
                "A p50",
                "B p50",
                "delta",
                "change",
                "A busbw GB/s",
                "B busbw GB/s",
                "A n",
                "B n",
            ),
            ("op",),
            [
                [
                    (c.op, c.op),
                    (fmt_bytes(c.size_bytes), c.size_bytes),
                    (fmt_ns(c.a_p50_ns), c.a_p50_ns),
                    (fmt_ns(c.b_p50_ns), c.b_p50_ns),
                    (fmt_delta_ns(c.delta_ns), c.delta_ns),
                    (rel_cell(c.rel), c.rel),
                    (_gbps(c.a_busbw_gbps), c.a_busbw_gbps),
                    (_gbps(c.b_busbw_gbps), c.b_busbw_gbps),
                    (str(c.a_count), c.a_count),
                    (str(c.b_count), c.b_count),
                ]
                for c in d.collectives
            ],
        ),
        DiffTable(
            "shares",
            "communication share of the step by dimension",
            ("dimension", "A", "B", "delta"),
            ("dimension",),
            [
                [
                    (s.dim, s.dim),
                    (fmt_pct(s.a), s.a),
                    (fmt_pct(s.b), s.b),
                    (points(s.delta), s.delta),
                ]
                for s in d.comm_share
            ],
        ),
    ]
    return [t for t in tables if t.rows]


__all__ = [
    "Cell",
    "DiffTable",
    "delta_text",
    "diff_tables",
    "figure_value",
    "headline_text",
    "memory_text",
    "points",
    "rate_texts",
    "rel_cell",
    "rel_suffix",
    "step_text",
]

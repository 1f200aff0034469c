"""The HTML page of a run comparison (``meshprof diff A B --html F``): one self-contained file
built like the run report (:mod:`meshprof.render.html`: inline CSS, sortable tables, nothing
fetched), every table complete (the terminal shows the first rows only).

Every string from the runs (paths, phase, op and dimension names, finding titles) goes through
:func:`html.escape`; numbers go through :mod:`meshprof.render.format`.
"""

from __future__ import annotations

import html
from pathlib import Path

from meshprof.analyze.diff.types import FindingChange, RunDiff
from meshprof.render.changes import changes_lines
from meshprof.render.diff_text import headline_text
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
from meshprof.render.html_parts import html_page, html_table
from meshprof.render.serving_html import serving_diff_html
from meshprof.rundir.atomic import atomic_write_text

_E = html.escape


def _rel(rel: float) -> str:
    return "" if is_missing(rel) else f", {fmt_signed_pct(rel)}"


def _pct(rel: float) -> str:
    return "-" if is_missing(rel) else fmt_signed_pct(rel)


def _summary(d: RunDiff) -> str:
    runs = (
        f"<p>A: <code>{_E(d.a_path)}</code> ({d.a_world_size} ranks)<br>"
        f"B: <code>{_E(d.b_path)}</code> ({d.b_world_size} ranks)<br>"
        '<span class="muted">every delta is B − A</span></p>'
    )
    items = "".join(f"<li>{_E(headline_text(h))}</li>" for h in d.headline)
    head = (
        f"<ol>{items}</ol>"
        if items
        else '<p class="ok">No change large enough for the headline (5% and 1% of the step).</p>'
    )
    notes = "".join(f'<div class="finding">{_E(n)}</div>' for n in d.notes)
    for side, t in (("A", d.a_changes), ("B", d.b_changes)):
        for line in changes_lines(t, limit=3) if t is not None else ():
            notes += f'<div class="finding">{side}: {_E(line)}</div>'

    step = ""
    if d.step is not None:
        s = d.step
        step = (
            f"<p>step time (median): {_E(fmt_ns(s.a_ns))} → {_E(fmt_ns(s.b_ns))} "
            f"(<b>{_E(fmt_delta_ns(s.delta_ns) + _rel(s.rel))}</b>)</p>"
        )
    return runs + head + notes + step


def _phases(d: RunDiff) -> str:
    rows = [
        [
            (_E(p.phase), p.phase),
            (_E(fmt_ns(p.a_ns)), p.a_ns),
            (_E(fmt_ns(p.b_ns)), p.b_ns),
            (_E(fmt_delta_ns(p.delta_ns)), p.delta_ns),
            (_pct(p.rel), p.rel),
        ]
        for p in d.phases
    ]
    return html_table(["phase", "A", "B", "delta", "change"], rows) if rows else _none("phases")


def _ranks(d: RunDiff) -> str:
    rows = [
        [
            (str(r.rank), r.rank),
            (_E(fmt_ns(r.a_step_ns)), r.a_step_ns),
            (_E(fmt_ns(r.b_step_ns)), r.b_step_ns),
            (_E(fmt_delta_ns(r.step_delta_ns)), r.step_delta_ns),
            (_E(fmt_delta_ns(r.compute_delta_ns)), r.compute_delta_ns),
            (_E(fmt_delta_ns(r.wait_delta_ns)), r.wait_delta_ns),
            (_E(fmt_delta_bytes(r.memory_delta_bytes)), r.memory_delta_bytes),
        ]
        for r in d.ranks
    ]
    headers = ["rank", "step A", "step B", "step delta", "compute delta", "wait delta"]
    return html_table([*headers, "memory delta"], rows) if rows else _none("per-rank rows")


def _gbps(x: float) -> str:
    return "-" if is_missing(x) else fmt_gbps(x)


def _collectives(d: RunDiff) -> str:
    rows = [
        [
            (_E(c.op), c.op),
            (_E(fmt_bytes(c.size_bytes)), c.size_bytes),
            (_E(fmt_ns(c.a_p50_ns)), c.a_p50_ns),
            (_E(fmt_ns(c.b_p50_ns)), c.b_p50_ns),
            (_E(fmt_delta_ns(c.delta_ns)), c.delta_ns),
            (_pct(c.rel), c.rel),
            (_gbps(c.a_busbw_gbps), c.a_busbw_gbps),
            (_gbps(c.b_busbw_gbps), c.b_busbw_gbps),
            (str(c.a_count), c.a_count),
            (str(c.b_count), c.b_count),
        ]
        for c in d.collectives
    ]
    headers = ["op", "size", "A p50", "B p50", "delta", "change", "A busbw GB/s", "B busbw GB/s"]
    return html_table([*headers, "A n", "B n"], rows) if rows else _none("collectives")


def _shares(d: RunDiff) -> str:
    rows = [
        [
            (_E(s.dim), s.dim),
            (fmt_pct(s.a), s.a),
            (fmt_pct(s.b), s.b),
            (f"{s.delta * 100:+.1f} points", s.delta),
        ]
        for s in d.comm_share
    ]
    return html_table(["dimension", "A", "B", "delta"], rows) if rows else _none("shares")


def _memory_throughput(d: RunDiff) -> str:
    m = d.memory
    out = []
    if m.delta_bytes is not None:
        out.append(
            f"<p>peak memory (highest rank): {_E(fmt_bytes(m.a_max_bytes))} (rank {m.a_max_rank})"
            f" → {_E(fmt_bytes(m.b_max_bytes))} (rank {m.b_max_rank}): "
            f"<b>{_E(fmt_delta_bytes(m.delta_bytes) + _rel(m.rel))}</b></p>"
        )
    else:
        out.append('<p class="muted">peak memory: not sampled in both runs</p>')
    tp = d.throughput
    rates = [("steps/s", tp.steps_per_s)]
    if tp.tokens_per_s is not None:
        rates.append(("tokens/s", tp.tokens_per_s))
    for name, r in rates:
        delta = "-" if is_missing(r.delta) else f"{r.delta:+.3g}/s"
        out.append(
            f"<p>{name}: {_E(fmt_rate(r.a))} → {_E(fmt_rate(r.b))} ({_E(delta + _rel(r.rel))})</p>"
        )
    return "".join(out)


def _change(sign: str, f: FindingChange) -> str:
    return (
        f'<div class="finding {_E(f.severity)}"><b>{sign} [{_E(f.severity)}] '
        f"{_E(f.title)}</b></div>"
    )


def _bottlenecks(d: RunDiff) -> str:
    b = d.bottlenecks
    out = [_change("appeared:", f) for f in b.appeared]
    out += [_change("vanished:", f) for f in b.vanished]
    return "".join(out) or '<p class="ok">The same bottlenecks and findings in both runs.</p>'


def _none(what: str) -> str:
    return f'<p class="muted">No {_E(what)} to compare (see the notes).</p>'


def render_diff_html(d: RunDiff, title: str = "meshprof diff") -> str:
    """The comparison as one HTML document."""
    sections = [
        ("Largest changes", _summary(d)),
        ("Bottlenecks and findings that appeared or vanished", _bottlenecks(d)),
        ("Phases", _phases(d)),
        ("Per rank", _ranks(d)),
        ("Collectives by op and message size", _collectives(d)),
        ("Communication share by dimension", _shares(d)),
        ("Memory and throughput", _memory_throughput(d)),
        ("Serving", serving_diff_html(d.serving)),
    ]
    subject = f"<code>{_E(d.a_path)}</code> → <code>{_E(d.b_path)}</code>"
    return html_page(title, subject, sections)


def write_diff_html(path: Path, d: RunDiff) -> Path:
    """Write the comparison page atomically."""
    return atomic_write_text(Path(path), render_diff_html(d))


__all__ = ["render_diff_html", "write_diff_html"]

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
from meshprof.render.diff_tables import (
    diff_tables,
    headline_text,
    memory_text,
    rate_texts,
    step_text,
)
from meshprof.render.html_parts import html_page, html_table
from meshprof.render.serving_html import serving_diff_html
from meshprof.rundir.atomic import atomic_write_text

_E = html.escape

#: The section each table of :func:`~meshprof.render.diff_tables.diff_tables` goes in.
_SECTIONS = {
    "phases": "Phases",
    "ranks": "Per rank",
    "collectives": "Collectives by op and message size",
    "shares": "Communication share by dimension",
}


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
    step = step_text(d)
    return runs + head + notes + (f"<p>{_E(step)}</p>" if step is not None else "")


def _memory_throughput(d: RunDiff) -> str:
    muted = ' class="muted"' if d.memory.delta_bytes is None else ""
    out = [f"<p{muted}>{_E(memory_text(d))}</p>"]
    out += [f"<p>{_E(r)}</p>" for r in rate_texts(d)]
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


def render_diff_html(d: RunDiff, title: str = "meshprof diff") -> str:
    """The comparison as one HTML document."""
    tables = {t.key: t for t in diff_tables(d)}
    sections = [
        ("Largest changes", _summary(d)),
        ("Bottlenecks and findings that appeared or vanished", _bottlenecks(d)),
    ]
    for key, name in _SECTIONS.items():
        t = tables.get(key)
        body = (
            html_table(list(t.columns), [[(_E(text), v) for text, v in row] for row in t.rows])
            if t is not None
            else '<p class="muted">Nothing to compare (see the notes).</p>'
        )
        sections.append((name, body))
    sections.append(("Memory and throughput", _memory_throughput(d)))
    sections.append(("Serving", serving_diff_html(d.serving)))
    subject = f"<code>{_E(d.a_path)}</code> → <code>{_E(d.b_path)}</code>"
    return html_page(title, subject, sections)


def write_diff_html(path: Path, d: RunDiff) -> Path:
    """Write the comparison page atomically."""
    return atomic_write_text(Path(path), render_diff_html(d))


__all__ = ["render_diff_html", "write_diff_html"]

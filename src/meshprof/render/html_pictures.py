"""The HTML report's pictures, drawn to stay small at thousands of ranks: the rank × step and
rank × phase heatmaps on canvases (one byte a cell), the arrival-skew histogram, the
communication share by dimension and the straggler scores as bars for at most
:data:`MAX_BARS` ranks (the most interesting: furthest from the median), every rank in tables
behind "show all". Formatting only: every figure is a field of a section.
"""

from __future__ import annotations

import html
import math

from meshprof.render.format import fmt_ns, fmt_pct
from meshprof.render.html_parts import big_table, canvas_heatmap
from meshprof.report.run_report import RunReport
from meshprof.report.stages.stragglers import STRAGGLERS
from meshprof.report.stages.tables import COMM_SHARE, HEATMAP, SKEW

MAX_BARS = 32
"""Ranks drawn as bars at most."""

_E = html.escape
DIM_COLORS = {"dp": "#1f77b4", "tp": "#ff7f0e", "pp": "#2ca02c", "other": "#7f7f7f"}


def _interesting(rep: RunReport, limit: int = MAX_BARS) -> list[int]:
    """Row indices (into the straggler report's ranks) of at most ``limit`` ranks: all of a
    small run, else those furthest from the median compute, in rank order."""
    s = rep[STRAGGLERS]
    n = len(s.ranks)
    if n <= limit:
        return list(range(n))
    by = sorted(
        range(n),
        key=lambda i: -abs(s.scores[i].score) if math.isfinite(s.scores[i].score) else 0.0,
    )
    return sorted(by[:limit])


def step_heatmap(rep: RunReport) -> str:
    """Step time per rank and step (the last steps), white at the median, red at the slowest."""
    hm = rep[HEATMAP]
    if not hm.steps:
        return '<p class="muted">No step spans recorded.</p>'
    med, hi = hm.median_ns, hm.max_ns
    span = hi - med
    ratios = [
        [
            (v - med) / span
            if span > 0 and not math.isnan(v)
            else (0.0 if not math.isnan(v) else v)
            for v in row
        ]
        for row in hm.step_ns
    ]
    canvas = canvas_heatmap(
        "heatmap",
        [f"rank {r}" for r in hm.ranks],
        [f"step {st}" for st in hm.steps],
        ratios,
        med / 1e6,
        hi / 1e6,
        "ms",
    )
    return (
        f'<p class="muted">{len(hm.ranks):,} ranks (rows) × steps {hm.steps[0]}…{hm.steps[-1]} '
        f"(columns); white = the median step ({_E(fmt_ns(med))}), red = the slowest "
        f"({_E(fmt_ns(hi))}), grey = no such step. Hover a cell for its value.</p>" + canvas
    )


def phase_heatmap(rep: RunReport) -> str:
    """Each rank's compute per phase against the phase's median across ranks: white at or below
    the median, red at the phase's slowest rank."""
    s = rep[STRAGGLERS]
    if not s.phases or not len(s.ranks):
        return '<p class="muted">No phases recorded.</p>'
    med = s.phase_median_ns
    top = [max((float(v) for v in s.phase_ns[:, j] if not math.isnan(v)), default=math.nan)
           for j in range(len(s.phases))]  # fmt: skip
    ratios = []
    for i in range(len(s.ranks)):
        row = []
        for j in range(len(s.phases)):
            v, m, t = float(s.phase_ns[i, j]), float(med[j]), top[j]
            row.append(v if math.isnan(v) else ((v - m) / (t - m) if t > m else 0.0))
        ratios.append(row)
    canvas = canvas_heatmap(
        "phase-heatmap",
        [f"rank {r}" for r in s.ranks],
        list(s.phases),
        ratios,
        0.0,
        1.0,
        "of the way from the phase's median to its slowest rank",
        width=min(900, 90 * len(s.phases)),
    )
    return (
        f'<p class="muted">{len(s.ranks):,} ranks × {len(s.phases)} phases '
        f"({_E(', '.join(s.phases))}): compute per step (median), white at the phase's median "
        "rank, red at its slowest.</p>" + canvas
    )


def skew_histogram(rep: RunReport) -> str:
    """How many collectives had each arrival skew (log-spaced bins)."""
    h = rep[SKEW]
    total = sum(h.counts)
    if not total:
        return '<p class="muted">No collective with two members present.</p>'
    last = max(i for i, c in enumerate(h.counts) if c)
    first = min(i for i, c in enumerate(h.counts) if c)
    bins = list(range(first, last + 1))
    top = max(h.counts)
    bw, height = 28, 160
    parts = [f'<svg id="skew-histogram" width="{bw * len(bins) + 20}" height="{height + 40}">']
    for k, i in enumerate(bins):
        c = h.counts[i]
        bh = height * c / top
        lo = h.edges_ns[i]
        label = (
            f"≥ {fmt_ns(lo)}"
            if i == len(h.edges_ns) - 1
            else f"{fmt_ns(lo)}–{fmt_ns(h.edges_ns[i + 1])}"
        )
        parts.append(
            f'<rect x="{10 + k * bw}" y="{height - bh + 4:.1f}" width="{bw - 3}" height="{bh:.1f}" '
            f'fill="#1f77b4"><title>{_E(label)}: {c:,} collectives ({c / total:.1%})</title></rect>'
        )
        if k % 4 == 0:
            parts.append(f'<text x="{10 + k * bw}" y="{height + 20}">{_E(fmt_ns(lo))}</text>')
    parts.append("</svg>")
    return (
        f"<p>Arrival skew (last − first arrival) of {total:,} collectives, log-spaced bins; "
        "a long right tail is waiting that one rank causes.</p>" + "".join(parts)
    )


def comm_dims(rep: RunReport) -> str:
    """Communication share of step time per rank and dimension: bars of the ranks furthest from
    the median compute, every rank in the table."""
    cs = rep[COMM_SHARE]
    if not cs.dimensions:
        return '<p class="muted">No collectives recorded.</p>'
    s = rep[STRAGGLERS]
    shown = _interesting(rep)
    bw, left, bh = 500, 70, 16
    h = 20 + bh * len(shown) + 20
    parts = [f'<svg id="comm-dims" width="{left + bw + 200}" height="{h}">']
    for k, i in enumerate(shown):
        r = s.ranks[i]
        x: float = left
        y = 14 + k * bh
        parts.append(f'<text x="2" y="{y + 12}">rank {r}</text>')
        for j, d in enumerate(cs.dimensions):
            v = float(cs.share[i, j])
            wpx = bw * min(max(v, 0.0), 1.0)
            color = DIM_COLORS.get(d, "#9467bd")
            parts.append(
                f'<rect x="{x:.1f}" y="{y}" width="{wpx:.1f}" height="{bh - 3}" fill="{color}">'
                f"<title>rank {r} {_E(d)}: {v:.1%} of step time</title></rect>"
            )
            x += wpx
        parts.append(f'<text x="{x + 4:.1f}" y="{y + 12}">{fmt_pct(cs.total[i])}</text>')
    legend = " ".join(
        f'<tspan fill="{DIM_COLORS.get(d, "#9467bd")}">■ {_E(d)}</tspan>' for d in cs.dimensions
    )
    parts.append(f'<text x="{left}" y="{h - 4}">{legend} (share of step time)</text></svg>')
    note = (
        f'<p class="muted">Bars: the {len(shown)} ranks furthest from the median compute; the '
        "table has every rank.</p>"
        if len(shown) < len(s.ranks)
        else ""
    )
    rows = [
        [(str(r), r)]
        + [
            (fmt_pct(float(cs.share[i, j])), float(cs.share[i, j]))
            for j in range(len(cs.dimensions))
        ]
        for i, r in enumerate(s.ranks)
    ]
    return note + "".join(parts) + big_table("dims-table", ["rank", *cs.dimensions], rows, shown)


def straggler_view(rep: RunReport) -> str:
    """The straggler verdict, the scores as bars (the ranks furthest from the median) and the
    compute per phase of every rank."""
    s = rep[STRAGGLERS]
    if s.note:
        head = f'<p class="muted">{_E(s.note)}</p>'
    elif s.stragglers:
        head = "".join(
            f'<p class="warn" id="straggler-{x.rank}">Straggler: <b>rank {x.rank}</b>, '
            f"{x.score:+.1%} compute vs median, arrived last in {x.last_share:.0%} of its "
            f"collectives; slow phase <b>{_E(x.phase or '-')}</b> "
            f"(+{_E(fmt_ns(x.phase_excess_ns))} per step over the median "
            f"{_E(fmt_ns(x.phase_median_ns))}).</p>"
            for x in s.stragglers
        )
    else:
        head = (
            f'<p class="ok" id="no-straggler">No straggler: no rank has a score above '
            f"{s.threshold:.0%} while arriving last in most collectives.</p>"
        )
    shown = _interesting(rep)
    scores = [s.scores[i] for i in shown]
    scale = max([abs(x.score) for x in scores if math.isfinite(x.score)] + [s.threshold * 2])
    bh, mid, half = 18, 300, 250
    parts = [f'<svg id="scores" width="{mid + half + 80}" height="{bh * len(scores) + 24}">']
    named = {t.rank for t in s.stragglers}
    for k, x in enumerate(scores):
        v = x.score if math.isfinite(x.score) else 0.0
        w = half * abs(v) / scale
        xpos = mid if v >= 0 else mid - w
        color = "#b00020" if x.rank in named else "#888"
        parts.append(f'<text x="2" y="{k * bh + 13}">rank {x.rank}</text>')
        parts.append(
            f'<rect x="{xpos:.1f}" y="{k * bh + 2}" width="{w:.1f}" height="{bh - 4}" '
            f'fill="{color}"><title>score {v:+.1%}</title></rect>'
        )
        parts.append(f'<text x="{mid + half + 5}" y="{k * bh + 13}">{v:+.1%}</text>')
    tx = mid + half * s.threshold / scale
    parts.append(
        f'<line x1="{tx:.1f}" x2="{tx:.1f}" y1="0" y2="{bh * len(scores)}" stroke="#b00020" '
        'stroke-dasharray="3,3"/>'
    )
    parts.append(
        f'<text x="{mid - 60}" y="{bh * len(scores) + 16}">straggler score (dashed: threshold '
        f"{s.threshold:.0%})</text></svg>"
    )
    table = ""
    if s.phases:
        med = s.phase_median_ns
        rows = []
        for i, r in enumerate(s.ranks):
            cells: list[tuple[str, float | str | None]] = [(str(r), r)]
            for j in range(len(s.phases)):
                v = float(s.phase_ns[i, j])
                ex = v - float(med[j])
                style = ' class="warn"' if med[j] > 0 and ex > s.threshold * med[j] else ""
                cells.append((f"<span{style}>{_E(fmt_ns(v))}</span>", v))
            rows.append(cells)
        table = "<p>Compute time per phase (median per step, communication excluded):</p>" + (
            big_table("phase-table", ["rank", *s.phases], rows, shown)
        )
    return head + "".join(parts) + table


__all__ = [
    "DIM_COLORS",
    "MAX_BARS",
    "comm_dims",
    "phase_heatmap",
    "skew_histogram",
    "step_heatmap",
    "straggler_view",
]

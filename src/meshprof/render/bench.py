"""Text, CSV and SVG of a ``meshprof bench`` result (:class:`~meshprof.tools.bench.BenchResult`):
an nccl-tests-like table, one CSV line per row, and busbw against size as a standalone SVG.
Sizes are bytes, times µs, bandwidths GB/s (1e9 bytes per second); nothing is computed here."""

from __future__ import annotations

import math
from dataclasses import fields

from meshprof.tools.bench import BenchResult, BenchRow


def fmt_size(n: int) -> str:
    """A size in bytes the way ``--minbytes`` takes it: ``4K``, ``16M`` for exact multiples of a
    binary unit, else the plain number (the inverse of :func:`meshprof.tools.bench.parse_size`)."""
    for unit, f in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= f and n % f == 0:
            return f"{n // f}{unit}"
    return str(n)


CSV_FIELDS = [f.name for f in fields(BenchRow)]
"""The CSV columns: :class:`BenchRow`'s fields in order."""


def to_csv(result: BenchResult) -> str:
    """One line per row, the columns named as :class:`BenchRow`'s fields (floats to 6 digits)."""
    lines = [",".join(CSV_FIELDS)]
    for r in result.rows:
        d = r.to_dict()
        lines.append(
            ",".join(f"{d[k]:.6g}" if isinstance(d[k], float) else str(d[k]) for k in CSV_FIELDS)
        )
    return "\n".join(lines) + "\n"


def render_table(result: BenchResult) -> str:
    """An nccl-tests-like text table."""
    head = (
        f"{'op':<15}{'mode':<13}{'size':>8}{'count':>11}{'type':>9}{'time(us)':>11}{'min':>10}{'max':>10}"
        f"{'algbw':>8}{'busbw':>8}{'p99(us)':>10}{'cv%':>6}{'#wrong':>7}"
    )
    lines = [
        f"# meshprof bench: {result.world_size} ranks, backend {result.backend} on {result.device}, "
        f"warm-up {result.meta.get('warmup')}, iterations {result.meta.get('iters')}; bandwidth in GB/s",
        head,
    ]
    for r in result.rows:
        wrong = "n/a" if r.wrong < 0 else str(r.wrong)
        lines.append(
            f"{r.op:<15}{r.mode:<13}{fmt_size(r.size):>8}{r.count:>11}{r.dtype:>9}{r.time_us:>11.1f}"
            f"{r.time_min_us:>10.1f}{r.time_max_us:>10.1f}{r.algbw:>8.2f}{r.busbw:>8.2f}"
            f"{r.iter_p99_us:>10.1f}{r.cv_pct:>6.1f}{wrong:>7}"
        )
    rows = [r for r in result.rows if r.wrong >= 0]
    if rows:
        lines.append(f"# total #wrong: {sum(r.wrong for r in rows)}")
    return "\n".join(lines)


_COLORS = [
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
]


def plot_svg(result: BenchResult, width: int = 720, height: int = 420) -> str:
    """busbw against size (log2 x axis), one line per (op, mode), as a standalone SVG."""
    series: dict[str, list[tuple[int, float]]] = {}
    for r in result.rows:
        series.setdefault(f"{r.op} ({r.mode})", []).append((r.size, r.busbw))
    left, right, top, bottom = 60, 190, 30, 50
    pw, ph = width - left - right, height - top - bottom
    sizes = [s for pts in series.values() for s, _ in pts if s > 0] or [1]
    x0, x1 = math.log2(min(sizes)), math.log2(max(sizes))
    if x1 == x0:
        x1 = x0 + 1
    ymax = max([b for pts in series.values() for _, b in pts] + [1e-9]) * 1.1

    def px(s: int) -> float:
        return left + (math.log2(max(s, 1)) - x0) / (x1 - x0) * pw

    def py(b: float) -> float:
        return top + ph - b / ymax * ph

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">',
        f'<text x="{left}" y="18" font-size="13">busbw vs size: {result.world_size} ranks, {result.backend}</text>',
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>',
    ]
    for k in range(5):
        b = ymax * k / 4
        out.append(f'<text x="{left - 6}" y="{py(b) + 4:.1f}" text-anchor="end">{b:.2f}</text>')
        out.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{py(b):.1f}" y2="{py(b):.1f}" stroke="#ddd"/>'
        )
    for s in sorted(set(sizes)):
        out.append(
            f'<text x="{px(s):.1f}" y="{top + ph + 16}" text-anchor="middle">{fmt_size(s)}</text>'
        )
    out.append(
        f'<text x="{left + pw / 2}" y="{height - 10}" text-anchor="middle">size (bytes)</text>'
    )
    out.append(
        f'<text x="14" y="{top + ph / 2}" transform="rotate(-90 14 {top + ph / 2})" text-anchor="middle">busbw (GB/s)</text>'
    )
    for i, (name, pts) in enumerate(series.items()):
        color = _COLORS[i % len(_COLORS)]
        path = " ".join(f"{px(s):.1f},{py(b):.1f}" for s, b in sorted(pts))
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{path}"/>')
        ly = top + 14 * i + 8
        out.append(
            f'<line x1="{left + pw + 10}" x2="{left + pw + 28}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"/>'
        )
        out.append(f'<text x="{left + pw + 32}" y="{ly + 4}">{name}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


__all__ = ["CSV_FIELDS", "fmt_size", "plot_svg", "render_table", "to_csv"]

"""The serving section of the HTML report: the request latencies drawn (a histogram of TTFT,
TPOT, ITL and E2E each, with p50 and p99 marked) and tabled, the goodput, the steps by kind,
each rank's compute, transfer and wait per step, what each rank costs the requests, the slowest
requests' timelines and the findings. Formatting only: every figure is a field of the section
(the histograms' bins too)."""

from __future__ import annotations

import html
import math

from meshprof.analyze.diff.serving_diff import ServingDiff
from meshprof.analyze.serve.types import Histogram, LatencyStats, ServingReport
from meshprof.render.format import fmt_delta_ns, fmt_ns, fmt_pct
from meshprof.render.html_parts import html_table
from meshprof.render.serving_text import (
    FIGURES,
    figure_delta,
    figure_value,
    goodput_line,
    headline,
    straggler_change,
)
from meshprof.report.run_report import RunReport
from meshprof.report.stages.serving import SERVING

_E = html.escape
_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL (every gap)", "e2e": "E2E"}


def latency_svg(h: Histogram, st: LatencyStats) -> str:
    """One figure's distribution as bars on a log axis, its p50 and p99 as lines."""
    if not h.counts or not sum(h.counts):
        return ""
    w, height, left = 300, 110, 6
    n = len(h.counts)
    bw = (w - 2 * left) / n
    top = max(h.counts)
    lo, hi = math.log(h.edges[0]), math.log(h.edges[-1])

    def x(v: float) -> float:
        if not (v > 0 and hi > lo):
            return left
        return left + (math.log(v) - lo) / (hi - lo) * (w - 2 * left)

    parts = [f'<svg class="latency" data-figure="{_E(h.name)}" width="{w}" height="{height + 34}">']
    for i, c in enumerate(h.counts):
        if not c:
            continue
        bh = height * c / top
        label = f"{fmt_ns(h.edges[i])}–{fmt_ns(h.edges[i + 1])}: {c}"
        parts.append(
            f'<rect x="{left + i * bw:.1f}" y="{height - bh + 4:.1f}" width="{max(bw - 1, 1):.1f}" '
            f'height="{bh:.1f}" fill="#1f77b4"><title>{_E(label)}</title></rect>'
        )
    for q, color in ((st.p50, "#2ca02c"), (st.p99, "#d62728")):
        if math.isfinite(q):
            xx = x(q)
            parts.append(
                f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="2" y2="{height + 4}" stroke="{color}" '
                'stroke-width="1.5" stroke-dasharray="3 2"/>'
            )
    parts.append(f'<text x="{left}" y="{height + 18}">{_E(fmt_ns(h.edges[0]))}</text>')
    parts.append(
        f'<text x="{w - left}" y="{height + 18}" text-anchor="end">{_E(fmt_ns(h.edges[-1]))}</text>'
    )
    parts.append(
        f'<text x="{w / 2:.0f}" y="{height + 32}" text-anchor="middle">{_E(_NAMES[h.name])}: '
        f"p50 {_E(fmt_ns(st.p50))}, p99 {_E(fmt_ns(st.p99))}</text></svg>"
    )
    return "".join(parts)


def serving_html(rep: RunReport) -> str:
    """The section's body (a note for a run that served no requests)."""
    s = rep.get(SERVING)
    if s is None:
        return (
            '<p class="muted">No request recorded: not a serving job (see Serving in the docs).</p>'
        )
    lat = s.latencies
    out = [f"<p>{_E(headline(lat))}</p>"]
    charts = [latency_svg(h, getattr(lat, h.name)) for h in lat.histograms if h.name in _NAMES]
    out.append(
        '<div class="latency-charts" style="display:flex;flex-wrap:wrap;gap:12px">'
        + "".join(charts)
        + '</div><p class="muted">Distributions of the successful requests (log axis; green '
        "p50, red p99).</p>"
    )
    rows = []
    for name, key in FIGURES:
        st: LatencyStats = getattr(lat, key)
        rows.append(
            [(name, None), (str(st.count), st.count)]
            + [(_E(fmt_ns(v)), v) for v in (st.mean, st.p50, st.p90, st.p95, st.p99, st.max)]
        )
    out.append(html_table(["", "count", "mean", "p50", "p90", "p95", "p99", "max"], rows))
    if line := goodput_line(lat):
        out.append(f"<p>{_E(line)}</p>")
    out.append(_steps(s))
    out.append(_costs(s))
    out.append(_slow(s))
    if s.findings:
        items = "".join(f"<li><b>{_E(str(f.severity))}</b> {_E(f.title)}</li>" for f in s.findings)
        out.append(f"<h3>Serving findings</h3><ul>{items}</ul>")
    if s.note:
        out.append(f'<p class="muted">{_E(s.note)}</p>')
    return "".join(out)


def _steps(s: ServingReport) -> str:
    out = []
    if s.kinds:
        rows = [
            [(k.kind, None), (str(k.steps), k.steps), (_E(fmt_ns(k.step.p50)), k.step.p50),
             (_E(fmt_ns(k.step.p99)), k.step.p99), (f"{k.batch.mean:.1f}", k.batch.mean),
             (str(k.prompt_tokens), k.prompt_tokens), (str(k.output_tokens), k.output_tokens)]
            for k in s.kinds
        ]  # fmt: skip
        out.append(
            f"<h3>Serving steps (steps {s.steps_from}–{s.steps_to})</h3>"
            + html_table(
                ["kind", "steps", "p50", "p99", "requests/step", "prompt tokens", "output tokens"],
                rows,
            )
        )
    if s.ranks:
        rows = [
            [(r.kind, None), (str(r.rank), r.rank), (_E(fmt_ns(r.step_ns)), r.step_ns),
             (_E(fmt_ns(r.compute_ns)), r.compute_ns), (_E(fmt_ns(r.transfer_ns)), r.transfer_ns),
             (_E(fmt_ns(r.wait_ns)), r.wait_ns), (str(r.last_arrivals), r.last_arrivals),
             (_E(fmt_ns(r.caused_wait_ns)), r.caused_wait_ns),
             (_E(fmt_delta_ns(r.excess_ns)), r.excess_ns)]
            for r in s.ranks
        ]  # fmt: skip
        out.append(
            "<h3>Each rank per step (means; wait: for the last rank to arrive)</h3>"
            + html_table(
                [
                    "kind",
                    "rank",
                    "step",
                    "compute",
                    "transfer",
                    "wait",
                    "arrived last",
                    "caused wait",
                    "excess over peers",
                ],
                rows,
            )
        )
    for kind, shares in s.dims:
        if shares:
            parts = "; ".join(
                f"{d.dim} {fmt_pct(d.share)} (transfer {fmt_pct(d.share - d.wait_share)}, "
                f"waiting {fmt_pct(d.wait_share)})"
                for d in shares
            )
            out.append(f"<p>{_E(kind)} steps' collectives: {_E(parts)}</p>")
    return "".join(out)


def _costs(s: ServingReport) -> str:
    if not s.costs:
        return ""
    rows = [
        [(str(c.rank), c.rank), (str(c.since_step), c.since_step),
         (_E(fmt_ns(c.decode_step_saving_ns)), c.decode_step_saving_ns),
         (_E(f"{fmt_ns(c.tpot_p50_ns)} → {fmt_ns(c.tpot_p50_after_ns)}"), c.tpot_saving_ns),
         (_E(f"{fmt_ns(c.tpot_p99_ns)} → {fmt_ns(c.tpot_p99_after_ns)}"), None),
         (_E(f"{fmt_ns(c.ttft_p50_ns)} → {fmt_ns(c.ttft_p50_after_ns)}"), c.ttft_saving_ns),
         (_E(f"{fmt_ns(c.ttft_p99_ns)} → {fmt_ns(c.ttft_p99_after_ns)}"), None),
         (str(c.requests), c.requests)]
        for c in s.costs
    ]  # fmt: skip
    return "<h3>What each rank costs the requests (were it as fast as its peers)</h3>" + html_table(
        ["rank", "since step", "decode step saved", "TPOT p50", "TPOT p99", "TTFT p50",
         "TTFT p99", "requests"],
        rows,
    )  # fmt: skip


def _slow(s: ServingReport) -> str:
    if not s.slow:
        return ""
    items = []
    for r in s.slow:
        steps = ", ".join(
            f"step {x.step} {x.kind} {fmt_ns(x.duration_ns)}"
            + (f" (rank {x.last_rank} last)" if x.last_rank >= 0 else "")
            for x in r.steps
        )
        items.append(
            f"<li>request {r.id} ({_E(r.why)}): queue {_E(fmt_ns(r.queue_ns))}, prefill "
            f"{_E(fmt_ns(r.prefill_ns))}, TTFT {_E(fmt_ns(r.ttft_ns))}, decode "
            f"{_E(fmt_ns(r.decode_ns))} over {r.decode_steps} steps, E2E {_E(fmt_ns(r.e2e_ns))}; "
            f"{_E(r.cause)}"
            + (f'<br><span class="muted">{_E(steps)}</span>' if steps else "")
            + "</li>"
        )
    return "<h3>Slowest requests (TTFT or E2E at p99 and above)</h3><ul>" + "".join(items) + "</ul>"


def serving_diff_html(d: ServingDiff | None) -> str:
    """Two serving runs compared (a note when they cannot be)."""
    if d is None:
        return '<p class="muted">Neither run served requests.</p>'
    if d.note:
        return f'<p class="muted">{_E(d.note)}</p>'
    rows = [
        [(_E(f.figure), None), (_E(figure_value(f.a, f.unit)), f.a),
         (_E(figure_value(f.b, f.unit)), f.b), (_E(figure_delta(f)), f.rel)]
        for f in d.figures
    ]  # fmt: skip
    out = [f"<p>{d.a_requests} → {d.b_requests} requests (B − A).</p>"]
    out.append(html_table(["figure", "A", "B", "change"], rows))
    for sign, items in (("appeared", d.appeared), ("vanished", d.vanished)):
        out += [f"<p>{_E(sign)}: {_E(t)}</p>" for t in items]
    out += [f"<p>changed: {_E(straggler_change(c))}</p>" for c in d.changed]
    return "".join(out)


__all__ = ["latency_svg", "serving_diff_html", "serving_html"]

"""The HTML report: one self-contained file (inline CSS, inline SVG, a few lines of inline JS;
nothing fetched from the network), readable offline.

Every string that comes from the run (op labels, group names, host names, phase names, metadata,
paths) goes through :func:`html.escape`. This module only lays out numbers computed by
:mod:`meshprof.report` (every figure is a field of a section of the typed report; numbers go
through :mod:`meshprof.render.format`). :func:`html_sections` is the page, section by section.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshprof.render.changes import changes_html
from meshprof.render.failures import FAILURE_COLUMNS, failure_cells, failure_headline
from meshprof.render.format import (
    fmt_bytes,
    fmt_delta_ns,
    fmt_field,
    fmt_gbps,
    fmt_nested,
    fmt_ns,
    fmt_pct,
)
from meshprof.render.html_parts import (
    PAGE_CSS,
    TOP_K,
    big_table,
    html_page,
    html_table,
)
from meshprof.render.html_pictures import (
    comm_dims,
    phase_heatmap,
    skew_histogram,
    step_heatmap,
    straggler_view,
)
from meshprof.render.report_text import RANK_COLUMNS, rank_cells, sampling_line
from meshprof.render.serving_html import serving_html
from meshprof.render.verdict import ledger_html, verdict_html
from meshprof.render.what_if import what_if_html
from meshprof.report.run_report import RunReport
from meshprof.report.stages.captures import CAPTURES
from meshprof.report.stages.changes import CHANGES
from meshprof.report.stages.conclusions import PROBLEMS, SUMMARY
from meshprof.report.stages.matching import CLOCK, COLLECTIVES, FAILURES
from meshprof.report.stages.pipeline import BOTTLENECKS, PIPELINE
from meshprof.report.stages.sampling_error import SAMPLING
from meshprof.report.stages.stragglers import STRAGGLERS
from meshprof.report.stages.tables import BY_SIZE, MEMORY, RANKS, TIMELINE
from meshprof.report.stages.traces import KINETO
from meshprof.report.stages.waits import WAIT_CAUSES
from meshprof.report.stages.what_if import WHAT_IF_REPLAY
from meshprof.rundir.atomic import atomic_write_text

if TYPE_CHECKING:
    from meshprof.analyze.traces.kineto import KinetoReport


_E = html.escape


def _summary(rep: RunReport) -> str:
    s, sm, m, clock, memory = (
        rep[STRAGGLERS],
        rep[SUMMARY],
        rep[COLLECTIVES],
        rep[CLOCK],
        rep[MEMORY],
    )
    named = (
        ", ".join(f"rank {x.rank}" + (f" ({_E(x.phase)})" if x.phase else "") for x in s.stragglers)
        or "none"
    )
    cards = [
        ("ranks analyzed", f"{len(sm.loaded_ranks)} / {sm.world_size}"),
        ("steps", str(len(s.steps))),
        ("mean step time", fmt_ns(sm.mean_step_ns)),
        ("straggler", named),
        ("collectives matched", f"{m.complete} / {m.collectives}"),
        (
            "arrival skew p50 / p95",
            f"{fmt_ns(m.skew_p50_ns)} / {fmt_ns(m.skew_p95_ns)}",
        ),
        (
            "clock uncertainty",
            fmt_ns(clock.max_uncertainty_ns) if clock.max_uncertainty_ns >= 0 else "unaligned rank",
        ),
        ("memory imbalance", fmt_pct(memory.imbalance) if memory.max_rank >= 0 else "-"),
    ]
    md = sm.metadata
    if md.get("status"):
        nodes = md.get("nodes") or []
        job = f"{md['status']}, exit code {md.get('exit_code')}"
        if len(nodes) > 1:
            job += f", {len(nodes)} nodes"
        cards.insert(0, ("job", _E(job)))
    body = "".join(
        f'<div class="card"><span class="muted">{_E(k)}</span><b>{v}</b></div>' for k, v in cards
    )
    meta = "".join(
        f"<li><code>{_E(str(k))}</code>: {_E(fmt_nested(v, str(k)))}</li>" for k, v in md.items()
    )
    probs = "".join(f'<li class="warn">{p.label}: {_E(p.reason)}</li>' for p in rep[PROBLEMS])
    sampling = rep.get(SAMPLING)
    sampled = (
        f'<p class="warn" id="sampling">{_E(sampling_line(sampling))}</p>'
        if sampling is not None
        else ""
    )
    return (
        sampled
        + f'<div class="cards" id="summary">{body}</div>'
        + (f'<h3>Missing or damaged ranks</h3><ul id="problems">{probs}</ul>' if probs else "")
        + (f"<details><summary>run metadata</summary><ul>{meta}</ul></details>" if meta else "")
    )


def _evidence(ev: Any) -> str:
    if not isinstance(ev, dict) or not ev:
        return ""
    items = []
    for k, v in ev.items():
        txt = fmt_field(str(k), v)
        if txt is None:
            txt = f"{v:.4g}" if isinstance(v, float) else json.dumps(v, default=str)[:200]
        items.append(f"{_E(str(k))}={_E(txt)}")
    return '<div class="muted">' + ", ".join(items) + "</div>"


def _findings(rep: RunReport) -> str:
    out = []
    for f in rep[SUMMARY].findings:
        out.append(
            f'<div class="finding {_E(f.severity)}"><b>{_E(f.title)}</b>{_evidence(f.evidence)}</div>'
        )
    for b in rep[BOTTLENECKS]:
        bn, sev = b.bottleneck, b.bottleneck.severity
        out.append(
            f'<div class="finding {_E(sev)}"><b>[{_E(sev)}] {_E(bn.category)}: {_E(bn.rule)}</b>'
            f"<p>{_E(b.evidence_text)}</p><p><i>fix:</i> {_E(bn.suggestion)}</p></div>"
        )
    return "".join(out) or '<p class="ok">No bottleneck or imbalance found.</p>'


def _ranks_table(rep: RunReport) -> str:
    rows = []
    for r in rep[RANKS]:
        texts = rank_cells(r)
        texts[1] = _E(r.host)
        values = (
            r.rank,
            r.host,
            r.steps,
            r.step_ns,
            r.step_p50_ns,
            r.step_p95_ns,
            r.step_p99_ns,
            r.steps_per_s,
            r.compute_ns,
            r.comm_share,
            r.wait_share,
            r.peak_memory_bytes,
            r.score,
            r.last_share,
        )
        rows.append([*zip(texts, values, strict=True), (str(r.events), r.events)])
    ranks = rep[RANKS]
    named = {x.rank: k for k, x in enumerate(rep[STRAGGLERS].stragglers)}
    keep = sorted(
        range(len(ranks)),
        key=lambda i: (
            named.get(ranks[i].rank, len(named)),
            -abs(ranks[i].score) if math.isfinite(ranks[i].score) else 0.0,
        ),
    )
    note = (
        f'<p class="muted">The stragglers, then the ranks furthest from the median compute '
        f'({TOP_K} in all); "show all" lists the {len(ranks):,}.</p>'
        if len(ranks) > TOP_K
        else ""
    )
    return note + big_table(
        "ranks-table", [*RANK_COLUMNS, "straggler score", "arrived last", "events"], rows, keep
    )


def _sizes(rep: RunReport) -> str:
    by_size = rep[BY_SIZE]
    if not by_size:
        return '<p class="muted">No collectives recorded.</p>'
    rows = [
        [
            (_E(x.op), x.op),
            (fmt_bytes(x.size_bucket), x.size_bucket),
            (str(x.count), x.count),
            (str(x.recorded) if x.recorded >= 0 else "–", x.recorded),
            (fmt_ns(x.p50_ns), x.p50_ns),
            (fmt_ns(x.p95_ns), x.p95_ns),
            (fmt_gbps(x.algbw_gbps), x.algbw_gbps),
            (fmt_gbps(x.busbw_gbps), x.busbw_gbps),
        ]
        for x in by_size
    ]
    top = max((x.p50_ns for x in by_size), default=1.0) or 1.0
    bh, left = 16, 260
    parts = [f'<svg id="latency" width="{left + 420}" height="{bh * len(by_size) + 10}">']
    for i, x in enumerate(by_size):
        w = 400 * math.log10(1 + x.p50_ns) / math.log10(1 + top)
        parts.append(
            f'<text x="2" y="{i * bh + 12}">{_E(x.op)} ≤ {_E(fmt_bytes(x.size_bucket))}</text>'
        )
        parts.append(
            f'<rect x="{left}" y="{i * bh + 2}" width="{w:.1f}" height="{bh - 4}" fill="#1f77b4"><title>{_E(fmt_ns(x.p50_ns))}, busbw {x.busbw_gbps:.3f} GB/s</title></rect>'
        )
    parts.append("</svg>")
    return (
        html_table(
            [
                "op",
                "size ≤",
                "retained",
                "issued (exact)",
                "p50",
                "p95",
                "algbw GB/s",
                "busbw GB/s",
            ],
            rows,
        )
        + '<p class="muted">median latency (log scale)</p>'
        + "".join(parts)
    )


_TRACK_COLORS = {"step": "#cfd8dc", "phase": "#90caf9", "comm": "#ef6c00"}


def _timeline(rep: RunReport) -> str:
    tl = rep[TIMELINE]
    if not tl.items or tl.window_ns <= 0:
        return '<p class="muted">Nothing to show.</p>'
    width, left, rowh = 900, 60, 14
    ranks = sorted({t.rank for t in tl.items})
    tracks = ("step", "phase", "comm")
    h = len(ranks) * rowh * 3 + len(ranks) * 6 + 20
    sc = width / tl.window_ns
    parts = [f'<svg id="timeline" width="{left + width + 10}" height="{h}">']
    for i, r in enumerate(ranks):
        y0 = i * (rowh * 3 + 6)
        parts.append(f'<text x="2" y="{y0 + rowh * 2}">rank {r}</text>')
        for t in tl.items:
            if t.rank != r:
                continue
            y = y0 + tracks.index(t.track) * rowh
            x = left + max(t.start_ns, 0) * sc
            w = max(t.duration_ns * sc, 1.0)
            parts.append(
                f'<rect x="{x:.1f}" y="{y}" width="{min(w, left + width - x):.1f}" height="{rowh - 2}" fill="{_TRACK_COLORS[t.track]}">'
                f"<title>{_E(t.label)}: {_E(fmt_ns(t.duration_ns))}</title></rect>"
            )
    parts.append(
        f'<text x="{left}" y="{h - 4}">{_E(fmt_ns(tl.window_ns))} window on the aligned clock; rows: step, phases, communication</text></svg>'
    )
    return "".join(parts)


def _clock(rep: RunReport) -> str:
    clock = rep[CLOCK]
    rows = [
        [
            (str(c.rank), c.rank),
            (_E(c.method), c.method),
            (_E(fmt_ns(c.offset_ns)), c.offset_ns),
            (fmt_ns(c.uncertainty_ns) if c.uncertainty_ns >= 0 else "unknown", c.uncertainty_ns),
            (
                fmt_ns(c.exchange_rtt_ns / 2) if c.exchange_rtt_ns is not None else "-",
                c.exchange_rtt_ns or 0,
            ),
            (str(c.collective_samples), c.collective_samples),
            (fmt_ns(c.disagreement_ns), c.disagreement_ns),
        ]
        for c in clock.ranks
    ]
    keep = sorted(range(len(clock.ranks)), key=lambda i: -clock.ranks[i].uncertainty_ns)
    return f"<p>Reference: rank {clock.reference_rank}.</p>" + big_table(
        "clock-table",
        [
            "rank",
            "method",
            "offset",
            "uncertainty",
            "exchange RTT/2",
            "collectives used",
            "exchange vs collectives",
        ],
        rows,
        keep,
    )


def _groups(rep: RunReport) -> str:
    m = rep[COLLECTIVES]
    rows = [
        [
            (_E(g.desc or g.name), g.desc),
            (_E(g.name), g.name),
            (_E(g.dimension), g.dimension),
            (str(g.size), g.size),
            (str(g.collectives), g.collectives),
            (str(g.incomplete), g.incomplete),
            (fmt_ns(g.skew_p50_ns), g.skew_p50_ns),
            (fmt_ns(g.skew_max_ns), g.skew_max_ns),
            (fmt_ns(g.wait_ns), g.wait_ns),
        ]
        for g in m.groups
    ]
    keep = sorted(range(len(m.groups)), key=lambda i: -m.groups[i].wait_ns)
    return (
        f"<p>{m.collectives} collectives ({m.complete} complete, {m.incomplete} incomplete), {m.p2p_pairs} send/recv pairs "
        f"({m.unmatched_p2p} unmatched); total wait {_E(fmt_ns(m.total_wait_ns))}.</p>"
        + big_table(
            "groups-table",
            [
                "group",
                "name",
                "dimension",
                "size",
                "collectives",
                "incomplete",
                "skew p50",
                "skew max",
                "total wait",
            ],
            rows,
            keep,
        )
    )


def _pipeline_traces(rep: RunReport) -> str:
    out = []
    p = rep[PIPELINE]
    if p:
        theory = f", theory {p.bubble_theory:.1%}" if p.bubble_theory is not None else ""
        rows = "".join(
            f"<tr><td>{_E(str(r))}</td><td>{v:.1%}</td></tr>"
            for r, v in sorted(p.per_stage.items())
        )
        out.append(
            f"<p>Pipeline {_E(str(p.schedule))}, p={p.stages}, m={p.microbatches}, {p.steps} steps: "
            f"bubble <b>{p.bubble:.1%}</b>{_E(theory)}, utilization {p.utilization:.1%} "
            "(all stages joined on the aligned clock).</p>"
            f"<table><tr><th>rank</th><th>bubble</th></tr>{rows}</table>"
        )
    kineto = rep[KINETO]
    if kineto.found:
        from meshprof.render.kineto_view import kineto_html

        out.append(kineto_html(kineto))
    return (
        "".join(out)
        or '<p class="muted">No pipeline stages and no torch.profiler traces in this run.</p>'
    )


def _failures(rep: RunReport) -> str:
    """The headline (the first failure, then the others) and one row per failed rank."""
    failures = rep[FAILURES]
    head = "".join(f"<th>{_E(c)}</th>" for c in FAILURE_COLUMNS)
    rows = "".join(
        "<tr>" + "".join(f"<td>{_E(c)}</td>" for c in failure_cells(f)) + "</tr>" for f in failures
    )
    return (
        f'<p class="finding warning"><b>{_E(failure_headline(failures))}</b></p>'
        f'<table class="sortable"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'
    )


def _waits(rep: RunReport) -> str:
    causes = rep[WAIT_CAUSES]
    if not causes:
        return '<p class="muted">No rank waited for another in the collectives.</p>'
    rows = [
        [
            (str(c.rank), c.rank),
            (fmt_ns(c.caused_ns), c.caused_ns),
            (fmt_pct(c.share), c.share),
            (str(c.collectives), c.collectives),
            (_E(c.group), c.group),
            (fmt_ns(c.group_ns), c.group_ns),
        ]
        for c in causes
    ]
    return (
        "<p>The ranks the others waited for in the collectives (each member's wait charged to "
        "the rank that arrived last), largest first.</p>"
        + html_table(
            ["rank", "others waited", "share of all waiting", "collectives", "most in", "there"],
            rows,
        )
    )


def _captures(rep: RunReport) -> str:
    caps = rep.get(CAPTURES) or ()
    if not caps:
        return (
            '<p class="muted">No captures (<code>meshprof capture RUN_DIR</code> on a running '
            "job, or <code>meshprof run --capture-on straggler</code>).</p>"
        )
    out = []
    for c in caps:
        trig = "on demand" if c.trigger == "demand" else f"on a {c.trigger} alert"
        out.append(
            f"<h3>{_E(c.id)} ({_E(trig)}): ranks {_E(', '.join(map(str, c.ranks)))}, "
            f"{c.steps} step(s) — {_E(c.state)}</h3>"
        )
        if c.reason:
            out.append(f"<p>{_E(c.reason)}</p>")
        out.append(
            "<ul>"
            + "".join(
                f"<li>rank {r.rank}: {_E(str(r.state))}"
                + (f", {r.steps} step(s), trace <code>{_E(r.trace)}</code>" if r.trace else "")
                + (f" — {_E(r.message)}" if r.message else "")
                + (f"; main thread in {_E(r.where)}" if r.where else "")
                + "</li>"
                for r in c.rank_results
            )
            + "</ul>"
        )
        if c.differences:
            rows = [
                [
                    (_E(d.name), d.name),
                    (_E(d.phase), d.phase),
                    (str(d.a_rank), d.a_rank),
                    (fmt_ns(d.a_ns), d.a_ns),
                    (str(d.b_rank), d.b_rank),
                    (fmt_ns(d.b_ns), d.b_ns),
                    (fmt_delta_ns(d.delta_ns), d.delta_ns),
                    (f"{d.a_calls:.1f} / {d.b_calls:.1f}", d.a_calls - d.b_calls),
                ]
                for d in c.differences
            ]
            out.append(
                "<p>Self time per step of the ops (and kernels) that differ most, "
                "communication left out (the breakdown below has it).</p>"
                + html_table(
                    [
                        "op",
                        "phase",
                        "rank a",
                        "a per step",
                        "rank b",
                        "b per step",
                        "delta",
                        "calls a / b",
                    ],
                    rows,
                )
            )
        if c.breakdown:
            from meshprof.analyze.traces.kineto import KinetoReport as Kineto
            from meshprof.render.kineto_view import kineto_html

            out.append(kineto_html(Kineto(c.breakdown)))
    return "".join(out)


def _what_if(rep: RunReport) -> str:
    return what_if_html(rep.get(WHAT_IF_REPLAY))


def _changes(rep: RunReport) -> str:
    return changes_html(rep[CHANGES])


HTML_SECTIONS: tuple[tuple[str, Callable[[RunReport], str]], ...] = (
    ("Verdict", verdict_html),
    ("Where the time went", ledger_html),
    ("Serving", serving_html),
    ("When things changed", _changes),
    ("Summary", _summary),
    ("What each rank costs", _what_if),
    ("Bottlenecks and findings", _findings),
    ("Per-rank table", _ranks_table),
    ("Step time per rank and step", step_heatmap),
    ("Compute per rank and phase", phase_heatmap),
    ("Communication share by dimension", comm_dims),
    ("Collective latency and bandwidth by message size", _sizes),
    ("Pipeline and profiler traces", _pipeline_traces),
    ("Captures", _captures),
    ("Stragglers", straggler_view),
    ("Arrival skew", skew_histogram),
    ("Timeline excerpt", _timeline),
    ("Collectives matched across ranks", _groups),
    ("Who waits for whom", _waits),
    ("Clock alignment", _clock),
)
"""The page, section by section (heading, body): a new section is one function added here.
Failures, when there are any, come before them all."""


def render_html(rep: RunReport, title: str = "meshprof report") -> str:
    """The report as one HTML document."""
    sections = [("Failures", _failures(rep))] if rep[FAILURES] else []
    sections += [(heading, body(rep)) for heading, body in HTML_SECTIONS]
    return html_page(title, f"<code>{_E(rep[SUMMARY].path)}</code>", sections)


def write_kineto_html(path: Path, folder: str, k: KinetoReport) -> Path:
    """A report of a folder of torch.profiler traces alone (no meshprof rank files), atomically."""
    from meshprof.render.kineto_view import kineto_html

    body = kineto_html(k) or '<p class="muted">No torch.profiler trace could be read.</p>'
    doc = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>meshprof report</title>'
        f"<style>{PAGE_CSS}</style></head><body><h1>meshprof report: <code>{_E(folder)}</code></h1>"
        f'<section id="traces"><h2>torch.profiler traces</h2>{body}</section></body></html>\n'
    )
    return atomic_write_text(Path(path), doc)


def write_html(path: Path, rep: RunReport, title: str = "meshprof report") -> Path:
    """Write the report atomically."""
    return atomic_write_text(Path(path), render_html(rep, title))

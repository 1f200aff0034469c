"""The verdict and the time ledger, for the terminal and the HTML report (formatting only: every
figure is a field of the ``verdict`` and ``ledger`` sections)."""

from __future__ import annotations

import html
import textwrap

from rich.console import Console

from meshprof.analyze.run.conclusions.verdict import MIN_SHARE
from meshprof.render.format import fmt_ns, fmt_pct
from meshprof.report.run_report import RunReport
from meshprof.report.stages.ledger import LEDGER
from meshprof.report.stages.verdict import VERDICT
from meshprof.report.stages.what_if import WHAT_IF_REPLAY

WIDTH = 80
"""Lines are wrapped to this many columns."""
MAX_CAUSES = 4
"""Verdict items shown in the terminal at least; every item of 2 % of the step or more is
shown whatever their number (the verdict never hides what the ledger shows), smaller ones
(``--all-causes``) beyond this many are counted."""

LEDGER_NAMES = {
    "compute": "compute",
    "exposed_comm_dp": "exposed dp",
    "exposed_comm_tp": "exposed tp",
    "exposed_comm_pp": "exposed pp",
    "exposed_comm_other": "exposed other",
    "pipeline_bubble": "bubble",
    "straggler_wait": "straggler wait",
    "data_loading": "data",
    "optimizer": "optimizer",
    "idle": "idle",
}
"""Short names of the ledger's causes."""

_E = html.escape


def say(console: Console, text: str, indent: str = "", first: str = "") -> None:
    """``text`` wrapped to :data:`WIDTH` columns, plain (no markup)."""
    for line in textwrap.wrap(
        text, WIDTH, initial_indent=first or indent, subsequent_indent=indent
    ) or [""]:
        console.print(line, highlight=False, markup=False, soft_wrap=True)


def print_verdict(rep: RunReport, console: Console) -> None:
    """The causes of lost time, largest first, each with why and what next."""
    items = rep[VERDICT]
    w = rep.get(WHAT_IF_REPLAY)
    console.print("Verdict", highlight=False, markup=False)
    if not items:
        note = f" ({w.note})" if w is not None and w.note else ""
        say(console, f"no cause costs 2% of a step or more{note}", indent="  ")
        return
    shown = max(MAX_CAUSES, sum(v.share_of_step >= MIN_SHARE for v in items))
    for i, v in enumerate(items[:shown], 1):
        money = f", {v.money:,.2f} in money" if v.money is not None else ""
        say(
            console,
            f"{v.title}: {fmt_ns(v.ns_per_step)}/step ({fmt_pct(v.share_of_step)}), "
            f"{v.device_hours:,.3g} {v.device}-h{money}",
            indent="     ",
            first=f"  {i}. ",
        )
        say(console, f"why: {v.evidence}", indent="       ", first="     ")
        say(console, f"next: {v.action}", indent="       ", first="     ")
    if len(items) > shown:
        say(console, f"(+{len(items) - shown} more: --json, or --full)", indent="  ")


def print_ledger(rep: RunReport, console: Console) -> None:
    """Where the job's time (summed over its ranks) went, in one line."""
    led = rep[LEDGER]
    j = led.job
    if j.wall_ns <= 0:
        return
    parts = sorted(((v, k) for k, v in j.parts.items() if v > 0), reverse=True)
    text = ", ".join(f"{LEDGER_NAMES.get(k, k)} {fmt_pct(v / j.wall_ns)}" for v, k in parts[:6])
    more = (
        f" (+{len(parts) - 6} under {fmt_pct(parts[6][0] / j.wall_ns)})" if len(parts) > 6 else ""
    )
    say(console, f"time ({led.steps:,} rank-steps analysed): {text}{more}")


def verdict_html(rep: RunReport) -> str:
    """The verdict as HTML: one block per cause, the cost, why and what next."""
    items = rep[VERDICT]
    if not items:
        w = rep.get(WHAT_IF_REPLAY)
        note = f" ({_E(w.note)})" if w is not None and w.note else ""
        return f'<p class="ok" id="verdict-none">No cause costs 2% of a step or more{note}.</p>'
    out = []
    for i, v in enumerate(items, 1):
        money = f", {v.money:,.2f} in money" if v.money is not None else ""
        ranks = f' data-ranks="{_E(",".join(map(str, v.ranks)))}"' if v.ranks else ""
        out.append(
            f'<div class="finding warning verdict" id="verdict-{i}" data-cause="{_E(v.cause)}"{ranks}>'
            f"<b>{i}. {_E(v.title)}: {_E(fmt_ns(v.ns_per_step))} per step "
            f"({_E(fmt_pct(v.share_of_step))}), {v.device_hours:,.3g} {_E(v.device)}-hours{_E(money)}</b>"
            f"<p><i>why:</i> {_E(v.evidence)}</p><p><i>next:</i> {_E(v.action)}</p></div>"
        )
    return "".join(out)


LEDGER_COLORS = {
    "compute": "#2e7d32",
    "exposed_comm_dp": "#1f77b4",
    "exposed_comm_tp": "#ff7f0e",
    "exposed_comm_pp": "#17becf",
    "exposed_comm_other": "#7f7f7f",
    "pipeline_bubble": "#9467bd",
    "straggler_wait": "#b00020",
    "data_loading": "#bcbd22",
    "optimizer": "#8c564b",
    "idle": "#cccccc",
}
"""A color per ledger cause (the HTML bars)."""


def _device(rep: RunReport) -> str:
    """What the job computed on as the verdict says it, with a space ("GPU ", "CPU "); ""
    when it does not say."""
    items = rep.get(VERDICT)
    return f"{items[0].device} " if items and items[0].device != "device" else ""


def ledger_html(rep: RunReport) -> str:
    """The job's ledger as one stacked bar and a table (share of the time of every rank, per
    step)."""
    led = rep[LEDGER]
    j = led.job
    if j.wall_ns <= 0:
        return '<p class="muted">No analysed steps.</p>'
    width = 900
    x = 0.0
    rects = []
    rows = []
    for k, v in sorted(j.parts.items(), key=lambda kv: -kv[1]):
        if v <= 0:
            continue
        share = v / j.wall_ns
        w = width * share
        name = LEDGER_NAMES.get(k, k)
        rects.append(
            f'<rect x="{x:.1f}" y="0" width="{w:.1f}" height="22" fill="{LEDGER_COLORS.get(k, "#999")}">'
            f"<title>{_E(name)}: {_E(fmt_pct(share))}</title></rect>"
        )
        x += w
        per_step = v / max(led.steps, 1)
        rows.append(
            f'<tr><td><span style="color:{LEDGER_COLORS.get(k, "#999")}">■</span> {_E(name)}</td>'
            f"<td>{_E(fmt_pct(share))}</td><td>{_E(fmt_ns(per_step))}</td></tr>"
        )
    bar = f'<svg id="ledger" width="{width}" height="24" role="img" aria-label="time ledger">{"".join(rects)}</svg>'
    table = (
        f"<table><thead><tr><th>cause</th><th>share of the {_E(_device(rep))}time</th><th>per rank and step</th>"
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )
    return (
        f"<p>Every rank's analysed steps ({len(led.ranks):,} ranks, {led.steps:,} rank-steps), "
        "their wall time split into causes that add up.</p>" + bar + table
    )

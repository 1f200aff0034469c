"""The serving section in the terminal: the request figures as ``vllm bench serve`` prints them,
the steps by kind, each rank's time in them, what a slow rank costs the requests, the slowest
requests and the findings (:func:`print_serving`); a few lines for the brief view
(:func:`print_serving_brief`). Formatting only: every figure is a field of the section."""

from __future__ import annotations

import datetime as _dt

from rich.console import Console
from rich.table import Table

from meshprof.analyze.diff.serving_diff import ServingDiff, ServingFigureDiff, StragglerChange
from meshprof.analyze.serve.types import LatencyStats, RequestLatencies, ServingReport
from meshprof.render.diff_tables import delta_text, figure_value, rel_suffix
from meshprof.render.format import fmt_delta_ns, fmt_ns, fmt_pct, fmt_rate
from meshprof.render.verdict import say
from meshprof.report.run_report import RunReport
from meshprof.report.stages.serving import SERVING

FIGURES = (
    ("TTFT", "ttft"),
    ("TPOT", "tpot"),
    ("ITL", "itl"),
    ("E2E", "e2e"),
    ("queue", "queue"),
    ("prefill", "prefill"),
    ("decode", "decode"),
)
"""The latency rows, as named for people and in :class:`RequestLatencies`."""


def _clock(ns: int) -> str:
    return _dt.datetime.fromtimestamp(ns / 1e9).strftime("%H:%M:%S.%f")[:-3]


def headline(lat: RequestLatencies) -> str:
    """One line: requests, reasons, duration, rates."""
    reasons = ", ".join(f"{n} {k}" for k, n in lat.reasons.items() if n)
    more = f", {lat.unfinished} unfinished" if lat.unfinished else ""
    ranks = (
        f" (recorded on ranks {', '.join(map(str, lat.ranks_with_requests))})"
        if len(lat.ranks_with_requests) > 1
        else ""
    )
    return (
        f"{lat.requests} requests on rank {lat.rank}{ranks}: {reasons or 'none finished'}{more}; "
        f"{fmt_ns(lat.duration_ns)}, {fmt_rate(lat.request_rate)} requests, "
        f"{fmt_rate(lat.output_tokens_per_s)} output tokens, error rate "
        f"{fmt_pct(lat.error_rate)}"
    )


def goodput_line(lat: RequestLatencies) -> str:
    """The goodput against the service levels given, "" without."""
    g = lat.goodput
    if g is None:
        return ""
    return (
        f"goodput ({g.slo.text()}): {g.good} of {g.judged} requests met every level, "
        f"{fmt_rate(g.per_s)} ({fmt_pct(g.attainment)} attainment)"
    )


def latency_table(lat: RequestLatencies) -> Table:
    """Count, mean, p50, p90, p95, p99 and max of each figure."""
    t = Table(title="request latencies (successful requests; ITL: every gap)", title_justify="left")
    for c in ("", "count", "mean", "p50", "p90", "p95", "p99", "max"):
        t.add_column(c, justify="left" if not c else "right")
    for name, key in FIGURES:
        st: LatencyStats = getattr(lat, key)
        t.add_row(
            name,
            str(st.count),
            *(fmt_ns(v) for v in (st.mean, st.p50, st.p90, st.p95, st.p99, st.max)),
        )
    for name, st in (("prompt tokens", lat.prompt_tokens), ("output tokens", lat.output_tokens)):
        t.add_row(
            name,
            str(st.count),
            *(f"{v:.0f}" for v in (st.mean, st.p50, st.p90, st.p95, st.p99, st.max)),
        )
    return t


def print_serving(rep: RunReport, console: Console) -> None:
    """The whole serving section (nothing for a run that served no requests)."""
    s = rep.get(SERVING)
    if s is None:
        return
    lat = s.latencies
    console.print("[bold]Serving[/]")
    say(console, headline(lat), "  ")
    console.print(latency_table(lat))
    if line := goodput_line(lat):
        say(console, line, "  ")
    _kinds(s, console)
    _ranks(s, console)
    _costs(s, console)
    _slow(s, console)
    if s.findings:
        console.print("[bold]Serving findings[/]")
        for f in s.findings:
            say(console, f.title, "    ", f"  {f.severity}: ")
    if s.note:
        say(console, f"serving: {s.note}", "  ")


def _kinds(s: ServingReport, console: Console) -> None:
    if not s.kinds:
        return
    t = Table(
        title=f"serving steps (steps {s.steps_from}-{s.steps_to}, rank {s.latencies.rank})",
        title_justify="left",
    )
    for c in ("kind", "steps", "p50", "p99", "requests/step", "prompt tokens", "output tokens"):
        t.add_column(c, justify="left" if c == "kind" else "right")
    for k in s.kinds:
        t.add_row(
            k.kind, str(k.steps), fmt_ns(k.step.p50), fmt_ns(k.step.p99), f"{k.batch.mean:.1f}",
            str(k.prompt_tokens), str(k.output_tokens),
        )  # fmt: skip
    console.print(t)


def _ranks(s: ServingReport, console: Console) -> None:
    if not s.ranks:
        return
    t = Table(
        title="each rank per step (means; wait: for the last rank to arrive)", title_justify="left"
    )
    cols = ("kind", "rank", "step", "compute", "transfer", "wait", "arrived last", "caused wait",
            "excess")  # fmt: skip
    for c in cols:
        t.add_column(c, justify="left" if c == "kind" else "right")
    for r in s.ranks:
        t.add_row(
            r.kind, str(r.rank), fmt_ns(r.step_ns), fmt_ns(r.compute_ns), fmt_ns(r.transfer_ns),
            fmt_ns(r.wait_ns), str(r.last_arrivals), fmt_ns(r.caused_wait_ns),
            fmt_delta_ns(r.excess_ns),
        )  # fmt: skip
    console.print(t)
    for kind, shares in s.dims:
        parts = [
            f"{d.dim} {fmt_pct(d.share)} (transfer {fmt_pct(d.share - d.wait_share)}, waiting "
            f"{fmt_pct(d.wait_share)})"
            for d in shares
        ]
        if parts:
            say(console, f"{kind} steps' collectives: " + "; ".join(parts), "  ")


def _costs(s: ServingReport, console: Console) -> None:
    if not s.costs:
        return
    console.print("[bold]What each rank costs the requests[/] (were it as fast as its peers)")
    for c in s.costs:
        say(
            console,
            f"rank {c.rank} (since step {c.since_step}, {_clock(c.since_ns)}): "
            f"decode step -{fmt_ns(c.decode_step_saving_ns)}, TPOT p50 {fmt_ns(c.tpot_p50_ns)} → "
            f"{fmt_ns(c.tpot_p50_after_ns)}, p99 {fmt_ns(c.tpot_p99_ns)} → "
            f"{fmt_ns(c.tpot_p99_after_ns)}; TTFT p50 {fmt_ns(c.ttft_p50_ns)} → "
            f"{fmt_ns(c.ttft_p50_after_ns)}, p99 {fmt_ns(c.ttft_p99_ns)} → "
            f"{fmt_ns(c.ttft_p99_after_ns)} ({c.requests} requests)",
            "    ",
            "  ",
        )


def _slow(s: ServingReport, console: Console) -> None:
    if not s.slow:
        return
    console.print("[bold]Slowest requests[/] (TTFT or E2E at p99 and above)")
    for r in s.slow:
        steps = "; ".join(
            f"step {x.step} {x.kind} {fmt_ns(x.duration_ns)}"
            + (f" (rank {x.last_rank} last, {fmt_ns(x.caused_wait_ns)} waited)" if x.last_rank >= 0 else "")
            for x in r.steps
        )  # fmt: skip
        say(
            console,
            f"request {r.id} ({r.why}): arrived {_clock(r.arrival_ns)}, queue "
            f"{fmt_ns(r.queue_ns)}, prefill {fmt_ns(r.prefill_ns)}, TTFT {fmt_ns(r.ttft_ns)}, "
            f"decode {fmt_ns(r.decode_ns)} over {r.decode_steps} steps, E2E {fmt_ns(r.e2e_ns)}; "
            f"{r.cause}" + (f". Steps: {steps}" if steps else ""),
            "    ",
            "  ",
        )


def print_serving_brief(rep: RunReport, console: Console) -> None:
    """The serving figures in a few lines (nothing without requests)."""
    s = rep.get(SERVING)
    if s is None:
        return
    lat = s.latencies
    say(console, "Serving: " + headline(lat))
    for name, key in FIGURES[:4]:
        st: LatencyStats = getattr(lat, key)
        say(
            console,
            f"{name:5s} p50 {fmt_ns(st.p50)}, p90 {fmt_ns(st.p90)}, p99 {fmt_ns(st.p99)}, "
            f"max {fmt_ns(st.max)}",
            "  ",
        )
    if line := goodput_line(lat):
        say(console, line, "  ")
    for f in s.findings[:3]:
        say(console, f.title, "    ", f"  {f.severity}: ")


def figure_delta(f: ServingFigureDiff) -> str:
    """B − A of a serving figure, with its relative change."""
    return delta_text(f.delta, f.unit) + rel_suffix(f.rel)


def print_serving_diff(d: ServingDiff | None, console: Console) -> None:
    """Two serving runs compared (nothing when neither served requests)."""
    if d is None or d.note:
        return
    t = Table(
        title=f"serving: {d.a_requests} → {d.b_requests} requests (B − A)", title_justify="left"
    )
    for c in ("figure", "A", "B", "change"):
        t.add_column(c, justify="left" if c == "figure" else "right")
    for f in d.figures:
        t.add_row(f.figure, figure_value(f.a, f.unit), figure_value(f.b, f.unit), figure_delta(f))
    console.print(t)
    for sign, what, items in (("+", "appeared", d.appeared), ("-", "vanished", d.vanished)):
        for title in items:
            say(console, f"{sign} {what}: {title}", "    ", "  ")
    for change in d.changed:
        say(console, f"± changed: {straggler_change(change)}", "    ", "  ")


def straggler_change(c: StragglerChange) -> str:
    """A decode straggler of both runs whose cost changed, in words."""
    return (
        f"rank {c.rank} is slow in decode in both runs; what it costs the TPOT p50: "
        f"{fmt_ns(c.a_tpot_cost_ns)} in A, {fmt_ns(c.b_tpot_cost_ns)} in B"
    )


__all__ = [
    "FIGURES",
    "figure_delta",
    "figure_value",
    "goodput_line",
    "headline",
    "latency_table",
    "print_serving",
    "print_serving_brief",
    "print_serving_diff",
    "straggler_change",
]

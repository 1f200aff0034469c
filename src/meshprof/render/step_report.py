"""Terminal rendering of a :class:`~meshprof.analyze.steps.StepAnalysis` (formatting only:
every figure shown is a field of the analysis; units are converted for people here)."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from meshprof.analyze.steps import StepAnalysis
from meshprof.render.format import fmt_bytes, fmt_ns, fmt_pct

SEVERITY_STYLE = {"critical": "bold red", "high": "red", "medium": "yellow", "low": "cyan"}


def print_analysis(a: StepAnalysis, console: Console) -> None:
    console.print(
        f"[bold]rank {a.rank}[/]: {a.steps} steps analyzed (after {a.warmup_steps} warm-up); "
        f"step {fmt_ns(a.step_time.mean_ns)} mean, {fmt_ns(a.step_time.p50_ns)} p50, {fmt_ns(a.step_time.p95_ns)} p95; "
        f"{a.tokens_per_s:,.0f} tokens/s, {a.samples_per_s:,.1f} samples/s"
    )
    if a.phases:
        t = Table(title="phases (per step)", title_justify="left")
        for c in ("phase", "mean", "p50", "p95", "share of step"):
            t.add_column(c, justify="right" if c != "phase" else "left")
        for p in a.phases:
            t.add_row(
                p.name,
                fmt_ns(p.time.mean_ns),
                fmt_ns(p.time.p50_ns),
                fmt_ns(p.time.p95_ns),
                fmt_pct(p.share_of_step),
            )
        console.print(t)
    if a.comm:
        t = Table(
            title=f"communication per step: {fmt_pct(a.comm_total_share)} of the step, {fmt_pct(a.comm_exposed_share)} exposed",
            title_justify="left",
        )
        for c in (
            "dimension",
            "collectives",
            "bytes",
            "total",
            "exposed",
            "hidden",
            "total share",
            "exposed share",
        ):
            t.add_column(c, justify="right" if c != "dimension" else "left")
        for d in a.comm:
            t.add_row(
                d.dimension,
                str(d.count),
                fmt_bytes(d.bytes),
                fmt_ns(d.total_ns),
                fmt_ns(d.exposed_ns),
                fmt_ns(d.hidden_ns),
                fmt_pct(d.total_share),
                fmt_pct(d.exposed_share),
            )
        console.print(t)
    lines = []
    if a.dp_efficiency is not None:
        lines.append(f"DP efficiency {fmt_pct(a.dp_efficiency)}")
    if a.tp_efficiency is not None:
        lines.append(f"TP efficiency {fmt_pct(a.tp_efficiency)}")
    if a.pipeline is not None:
        pl = a.pipeline
        theory = f" (theory {fmt_pct(pl.bubble_theory)})" if pl.bubble_theory is not None else ""
        lines.append(
            f"pipeline {pl.schedule} p={pl.stages} m={pl.microbatches}: this stage's bubble "
            f"{fmt_pct(pl.bubble)}{theory}, utilization {fmt_pct(pl.utilization)}"
        )
    if a.data_loading_share:
        lines.append(f"data loading {fmt_pct(a.data_loading_share)} of step")
    if a.memory is not None:
        m = a.memory
        cap = (
            f" of {fmt_bytes(m.capacity_bytes)} ({fmt_pct(m.peak_fraction)}), headroom {fmt_bytes(max(m.headroom_bytes, 0))}"
            if m.capacity_bytes > 0
            else ""
        )
        lines.append(
            f"memory ({m.kind}): current {fmt_bytes(m.current_bytes)}, peak {fmt_bytes(m.peak_bytes)}{cap}, mean/peak {fmt_pct(m.mean_over_peak, 0)}"
        )
    if a.flops is not None:
        f = a.flops
        mfu = (
            f", MFU {fmt_pct(f.mfu)} of {f.peak_tflops:g} TFLOP/s"
            if f.mfu is not None
            else " (set peak_tflops for MFU)"
        )
        lines.append(
            f"{f.flops_per_step / 1e12:.4f} TFLOP per step → {f.achieved_tflops:.3f} TFLOP/s{mfu}"
        )
    for line in lines:
        console.print(line)
    if a.bottlenecks:
        console.print("[bold]bottlenecks[/]")
        for b in a.bottlenecks:
            style = SEVERITY_STYLE.get(b.severity, "")
            console.print(f"  [{style}]{b.severity.upper()}[/] {b.category}: {b.evidence}")
            console.print(f"      rule: {b.rule}; fix: {b.suggestion}")
    else:
        console.print("no bottleneck rule fired")


def render_analysis(a: StepAnalysis, width: int = 140) -> str:
    buf = io.StringIO()
    print_analysis(a, Console(file=buf, width=width, force_terminal=False, color_system=None))
    return buf.getvalue()

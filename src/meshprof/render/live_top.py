"""``meshprof top``'s frame: a header with the summary line, the live stragglers, one table row
per rank (:class:`~meshprof.analyze.live.top_table.TopTable`) and the last alerts, as a rich renderable."""

from __future__ import annotations

import datetime as _dt

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from meshprof.analyze.live.top_table import SORT_KEYS, ServingTop, TopRow, TopTable
from meshprof.render.format import MISSING, fmt_bytes, fmt_ns, fmt_pct

BLOCKS = "▁▂▃▄▅▆▇█"
"""Sparkline levels, lowest first."""

SPARK_WIDTH = 16
"""Steps a sparkline shows (the most recent)."""

DECODE_SLOW = 1.1
"""A rank whose decode compute is this many times its peers' is named under the serving
line."""


def sparkline(values: list[int], width: int = SPARK_WIDTH) -> str:
    """The last ``width`` values as unicode blocks scaled between their minimum (▁) and maximum
    (█); all equal values are all ▁."""
    v = values[-width:]
    if not v:
        return ""
    lo, hi = min(v), max(v)
    if hi <= lo:
        return BLOCKS[0] * len(v)
    top = len(BLOCKS) - 1
    return "".join(BLOCKS[round((x - lo) * top / (hi - lo))] for x in v)


def fmt_throughput(rate: float, unit: str) -> str:
    """tokens/s or steps/s with k/M suffixes ("-" when zero)."""
    if rate <= 0:
        return MISSING
    short = "tok/s" if unit == "tokens/s" else "steps/s"
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if rate >= scale:
            return f"{rate / scale:.3g}{suffix} {short}"
    return f"{rate:.3g} {short}"


def _memory(r: TopRow) -> str:
    if r.memory_bytes < 0:
        return MISSING
    if r.memory_capacity_bytes > 0:
        return f"{fmt_bytes(r.memory_bytes)} ({r.memory_bytes / r.memory_capacity_bytes:.0%})"
    return fmt_bytes(r.memory_bytes)


def _state(r: TopRow) -> Text:
    if r.state == "stale":
        return Text(f"STALE {r.record_age_ns / 1e9:.0f}s", style="bold red")
    if r.state == "ended":
        return Text(f"ended {r.exit_how}".strip(), style="dim")
    if r.straggler:
        return Text("straggler", style="bold yellow")
    return Text("running", style="green")


def _inflight(r: TopRow) -> Text:
    if not r.inflight_op:
        return Text("")
    style = (
        "bold red" if r.inflight_age_ns >= 10e9 else ("yellow" if r.inflight_age_ns >= 1e9 else "")
    )
    return Text(f"{r.inflight_op} {fmt_ns(r.inflight_age_ns)}", style=style)


def _header(t: TopTable, run_dir: str) -> Text:
    when = _dt.datetime.fromtimestamp(t.taken_ns / 1e9).strftime("%H:%M:%S")
    state = Text("ENDED", style="bold") if t.ended else Text("running", style="green")
    world = f" of {t.world_size}" if t.world_size > 0 and t.world_size != t.ranks else ""
    line = Text.assemble(
        ("meshprof top ", "bold"),
        run_dir,
        " — ",
        state,
        f" — {t.ranks} ranks{world}, ",
        (f"{t.stale} stale", "bold red" if t.stale else ""),
        f", median step {fmt_ns(t.median_step_ns) if t.median_step_ns else MISSING}",
        f" — {when}",
    )
    return line


def _s(seconds: float) -> str:
    return fmt_ns(seconds * 1e9) if seconds == seconds else MISSING


def serving_lines(s: ServingTop) -> list[Text]:
    """The serving job's lines: requests, latencies over the recent window, tokens/s, errors,
    goodput; the ranks slow in decode."""
    out = []
    x = s.live
    if x is not None:
        w = x.window
        good = ""
        if x.slo is not None:
            good = (
                f" · goodput {w.goodput_per_s:.3g}/s ({fmt_pct(w.slo_attainment)} met "
                f"{x.slo.text()})"
            )
        out.append(
            Text(
                f"serving (rank {s.rank}): {x.requests_running} running, {x.requests_waiting} "
                f"waiting · last {w.window_s:.0f} s: TTFT p50 {_s(w.ttft_p50_s)} p99 "
                f"{_s(w.ttft_p99_s)} · ITL p50 {_s(w.itl_p50_s)} p99 {_s(w.itl_p99_s)} · TPOT "
                f"p50 {_s(w.tpot_p50_s)} p99 {_s(w.tpot_p99_s)} · {w.output_tokens_per_s:.3g} "
                f"tok/s · errors {fmt_pct(w.error_rate)}{good}",
                style="bold",
            )
        )
    slow = sorted(((v, r) for r, v in s.decode_scores.items() if v >= DECODE_SLOW), reverse=True)
    for v, r in slow[:3]:
        out.append(Text(f"decode: rank {r} computes {v:.2f}× its peers per step", style="yellow"))
    return out


def render_top(t: TopTable, run_dir: str, interactive: bool = False) -> RenderableType:
    """One frame of ``meshprof top`` (``interactive`` adds the line of keys)."""
    parts: list[RenderableType] = [_header(t, run_dir)]
    if t.serving is not None:
        parts.extend(serving_lines(t.serving))
    for s in t.stragglers[:3]:
        parts.append(
            Text(
                f"straggler: rank {s.rank} +{fmt_ns(s.excess_ns)} compute per step "
                f"(+{s.excess_ratio:.0%}; {fmt_ns(s.compute_ns)} vs {fmt_ns(s.median_compute_ns)})",
                style="yellow",
            )
        )
    if len(t.stragglers) > 3:
        parts.append(Text(f"… and {len(t.stragglers) - 3} more stragglers", style="yellow"))
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name, justify in (
        ("rank", "right"),
        ("step", "right"),
        ("step p50", "right"),
        ("recent steps", "left"),
        ("throughput", "right"),
        ("comm", "right"),
        ("exposed", "right"),
        ("vs peers", "right"),
        ("memory", "right"),
        ("in flight", "left"),
        ("state", "left"),
    ):
        mark = " ▼" if _sort_column(t.sort) == name else ""
        table.add_column(name + mark, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for r in t.rows:
        table.add_row(
            str(r.rank),
            str(r.step) if r.step >= 0 else MISSING,
            fmt_ns(r.step_ns) if r.step_ns > 0 else MISSING,
            Text(sparkline(r.recent_step_ns), style="cyan"),
            fmt_throughput(r.rate, r.rate_unit),
            fmt_pct(r.comm_share),
            fmt_pct(r.exposed_share),
            f"{r.score:.2f}×" if r.score > 0 else MISSING,
            _memory(r),
            _inflight(r),
            _state(r),
        )
    parts.append(table)
    if t.hidden:
        parts.append(Text(f"… {t.hidden} more ranks (--rows)", style="dim"))
    if t.alerts:
        parts.append(Text("alerts:", style="bold"))
        for a in t.alerts:
            when = _dt.datetime.fromtimestamp(a.t_ns / 1e9).strftime("%H:%M:%S")
            style = "red" if a.severity == "critical" else "yellow"
            parts.append(Text(f"  {when} {a.kind}: {a.message}", style=style))
    if interactive:
        keys = "  ".join(f"{k} {v}" for k, v in SORT_KEYS.items())
        parts.append(Text(f"sort: {keys}  q quit", style="dim"))
    return Group(*parts)


def render_waiting(run_dir: str) -> RenderableType:
    """The frame while a run has no live state yet."""
    return Text.assemble(
        ("meshprof top ", "bold"),
        run_dir,
        " — waiting for live state (RUN_DIR/live/rank*.json) …",
    )


def _sort_column(sort: str) -> str:
    return {
        "cost": "vs peers",
        "step": "step p50",
        "throughput": "throughput",
        "comm": "comm",
        "exposed": "exposed",
        "memory": "memory",
        "inflight": "in flight",
        "rank": "rank",
    }.get(sort, "")


__all__ = [
    "BLOCKS",
    "SPARK_WIDTH",
    "fmt_throughput",
    "render_top",
    "render_waiting",
    "serving_lines",
    "sparkline",
]

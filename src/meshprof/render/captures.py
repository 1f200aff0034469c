"""A capture's comparison (:class:`~meshprof.analyze.traces.capture_diff.CaptureComparison`) as
text: what each rank did, the top differences, the phases, the Kineto breakdown. Used by
``meshprof capture`` and the report's text. Formatting only."""

from __future__ import annotations

from pathlib import Path

from meshprof.analyze.traces.capture_diff import CaptureComparison, CaptureRank
from meshprof.records.captures import CaptureState
from meshprof.render.format import fmt_bytes, fmt_delta_ns, fmt_ns, fmt_pct

#: Differences shown in text.
TEXT_DIFFERENCES = 10


def _pct(pct: float | None) -> str:
    """A figure already in percent (HTA's unit)."""
    return fmt_pct(None if pct is None else pct / 100)


def _calls(x: float) -> str:
    return f"{x:.0f}" if abs(x - round(x)) < 0.05 else f"{x:.1f}"


def _rank_line(r: CaptureRank) -> str:
    if r.state is CaptureState.DONE or r.trace:
        steps = (
            f"step {r.first_step}"
            if r.steps == 1
            else f"steps {r.first_step}–{r.first_step + r.steps - 1}"
        )
        c = r.cost
        before = f" (before: {fmt_ns(c.step_ns_before)})" if c.step_ns_before else ""
        line = (
            f"rank {r.rank}: traced {steps}, step {fmt_ns(c.step_ns_during or r.step_ns)}{before}, "
            f"trace {fmt_bytes(r.trace_bytes)}; cost on the training thread: start "
            f"{fmt_ns(c.start_ns)}, stop {fmt_ns(c.stop_ns)}, annotations {fmt_ns(c.boundary_ns)}; "
            f"writing {fmt_ns(c.write_ns)} off it"
        )
        return line + (f" — {r.message}" if r.message else "")
    line = f"rank {r.rank}: {str(r.state).replace('_', ' ')}" + (
        f": {r.message}" if r.message else ""
    )
    return line + (f"; its main thread is in {r.where}" if r.where else "")


def capture_lines(comp: CaptureComparison, top: int = TEXT_DIFFERENCES) -> list[str]:
    """The comparison as lines of text."""
    trig = "on demand" if comp.trigger == "demand" else f"on a {comp.trigger} alert"
    ranks = (
        f"rank {comp.ranks[0]} vs " + ", ".join(str(r) for r in comp.ranks[1:])
        if len(comp.ranks) > 1
        else f"rank {comp.ranks[0]}"
        if comp.ranks
        else "no rank"
    )
    out = [f"capture {comp.id} ({trig}): {ranks}, {comp.steps} step(s) each — {comp.state}"]
    if comp.reason:
        out.append(f"  why: {comp.reason}")
    out += [f"  {_rank_line(r)}" for r in comp.rank_results]
    if comp.differences:
        out.append("")
        out.append(
            "  What differs most (self time per step; communication left out, see the breakdown):"
        )
        w = max(len(d.name) for d in comp.differences[:top])
        w = min(max(w, 4), 40)
        for d in comp.differences[:top]:
            kind = " [kernel]" if d.kind == "kernel" else ""
            name = d.name if len(d.name) <= w else d.name[: w - 1] + "…"
            out.append(
                f"    {name:<{w}}  {d.phase:<14} rank {d.a_rank} {fmt_ns(d.a_ns):>10}  "
                f"rank {d.b_rank} {fmt_ns(d.b_ns):>10}  {fmt_delta_ns(d.delta_ns):>11}  "
                f"calls {_calls(d.a_calls)} vs {_calls(d.b_calls)}{kind}"
            )
    if comp.phases:
        parts = [
            f"{p.phase} {fmt_delta_ns(p.delta_ns)}"
            + (f" (rank {p.a_rank} vs {p.b_rank})" if len(comp.ranks) > 2 else "")
            for p in comp.phases
            if p.delta_ns
        ]
        if parts:
            out.append("  Per phase (ops' self time per step): " + ", ".join(parts))
    if comp.breakdown:
        out.append("  Kineto breakdown:")
        for b in comp.breakdown:
            g = b.gpu.total if b.gpu is not None else None
            gpu = (
                f"; GPU idle {_pct(g.idle_pct)}, compute {_pct(g.compute_pct)}, "
                f"comm/compute overlap {_pct(g.comm_comp_overlap_pct)}"
                if g is not None
                else ""
            )
            out.append(
                f"    rank {b.rank} ({b.basis}): window {fmt_ns(b.window_ns)}, computation "
                f"{fmt_pct(b.compute_share)}, communication {fmt_pct(b.comm_share)}, other "
                f"{fmt_pct(b.other_share)}{gpu}"
            )
    traced = [r for r in comp.rank_results if r.trace]
    if traced:
        out.append(f"  Traces (Perfetto, chrome://tracing): {Path(comp.path)}/")
    out += [f"  note: {p}" for p in comp.problems]
    return out


def capture_text(comp: CaptureComparison) -> str:
    """:func:`capture_lines` joined."""
    return "\n".join(capture_lines(comp))


__all__ = ["capture_lines", "capture_text"]

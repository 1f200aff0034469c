"""Text of the ``changes`` section: which steps the report analysed, and when things changed."""

from __future__ import annotations

import datetime as _dt
import html

from meshprof.analyze.run.events.changes import Change, Timeline
from meshprof.render.format import fmt_ns


def _when(ns: int) -> str:
    return _dt.datetime.fromtimestamp(ns / 1e9).strftime("%H:%M:%S") if ns > 0 else "?"


def change_text(c: Change) -> str:
    """One change in words: "rank 1's compute rose 5.01 ms → 35.02 ms at step 80 (14:02:11)"."""
    who = "the job's step time" if c.rank is None else f"rank {c.rank}'s compute"
    verb = "rose" if c.after_ns > c.before_ns else "fell"
    return (
        f"{who} {verb} {fmt_ns(c.before_ns)} → {fmt_ns(c.after_ns)} per step at step "
        f"{c.step:,} ({_when(c.t_ns)})"
    )


def window_text(t: Timeline) -> str:
    """Which steps were analysed and why ("" for the whole run)."""
    if not t.windowed:
        return ""
    lo = t.first_step if t.window_lo is None else t.window_lo
    hi = t.last_step if t.window_hi is None else t.window_hi - 1
    span = f"steps {lo:,}–{hi:,} of {t.first_step:,}–{t.last_step:,}"
    if t.reason == "latest_regime":
        return f"analysed {span}, the latest regime (whole run: --steps all)"
    return f"analysed {span} (as asked)"


def changes_lines(t: Timeline, limit: int = 3) -> list[str]:
    """The window, then the changes: the ``limit`` largest (by how much the figure moved; a
    small shift on a loaded host never hides a large one), latest first, and the count of the
    others."""
    out = [x for x in (window_text(t),) if x]
    if t.changes:
        ranked = sorted(
            range(len(t.changes)),
            key=lambda i: (abs(t.changes[i].after_ns - t.changes[i].before_ns), i),
        )
        shown = [t.changes[i] for i in sorted(ranked[-limit:], reverse=True)]
        more = len(t.changes) - len(shown)
        out.append(
            "changed: "
            + "; ".join(change_text(c) for c in shown)
            + (f" (+{more} smaller: --json)" if more else "")
        )
    return out


def changes_html(t: Timeline) -> str:
    """The HTML section's body."""
    parts = [f"<p><b>{html.escape(window_text(t))}</b></p>"] if t.windowed else []
    if not t.changes:
        parts.append('<p class="muted">Nothing changed over the run (no change point in any '
                     "rank's compute per step or in the step time).</p>")  # fmt: skip
    else:
        items = "".join(f"<li>{html.escape(change_text(c))}</li>" for c in t.changes)
        parts.append(f"<ul>{items}</ul>")
    return "".join(parts)


__all__ = ["change_text", "changes_html", "changes_lines", "window_text"]

"""Text of ``meshprof doctor``'s checks (:class:`~meshprof.tools.doctor.Check`) for the terminal."""

from __future__ import annotations

from meshprof.tools.doctor import Check


def render_checks(checks: list[Check]) -> str:
    """One line per check (✓ or ✗, its name, the reporting rank when not 0, the detail), then
    the counts."""
    lines = []
    for c in checks:
        mark = "✓" if c.ok else "✗"
        who = f" [rank {c.rank}]" if c.rank else ""
        lines.append(f"{mark} {c.name}{who}: {c.detail}")
    bad = sum(not c.ok for c in checks)
    lines.append(f"{len(checks) - bad} passed, {bad} failed")
    return "\n".join(lines)


__all__ = ["render_checks"]

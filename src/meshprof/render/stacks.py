"""``meshprof stacks`` as text (:class:`~meshprof.analyze.hang.stacks.StacksSnapshot`): one line
per cluster of identical stacks, the outliers' stacks, the ranks that did not answer.
Formatting only."""

from __future__ import annotations

import os
from collections.abc import Sequence

from meshprof.analyze.hang.stacks import StacksSnapshot, rank_ranges
from meshprof.records.stacks import StackFrame

#: Frames shown per stack, innermost first.
SHOWN_FRAMES = 10


def _frames(frames: Sequence[StackFrame], indent: str, n: int = SHOWN_FRAMES) -> list[str]:
    inner = list(reversed(frames))
    out = [
        f"{indent}{f.function} ({os.path.basename(f.file)}:{f.line})  {f.file}" for f in inner[:n]
    ]
    if len(inner) > n:
        out.append(f"{indent}… {len(inner) - n} outer frame(s)")
    return out


def stacks_text(snap: StacksSnapshot, all_threads: bool = False) -> str:
    """The snapshot for the terminal."""
    cl = snap.clusters
    answered = len(snap.stacks)
    lines = [
        f"meshprof stacks: {answered} of {len(snap.asked)} rank(s) answered "
        f"(in {snap.waited_s:.1f} s; request {snap.id})"
    ]
    lines += [f"  {x}" for x in cl.lines]
    show = [c for c in cl.clusters if c.outlier] or (
        list(cl.clusters) if len(cl.clusters) > 1 else []
    )
    for c in show:
        lines.append("")
        lines.append(f"{rank_ranges(c.ranks)}{' (outlier)' if c.outlier else ''}, innermost first:")
        lines += _frames(c.frames, "    ")
    if cl.missing:
        lines.append("")
        lines.append(
            f"{rank_ranges(cl.missing)}: no answer within the timeout (dead, stopped, stuck "
            "holding the GIL, or started without the capture agent)"
        )
    if all_threads:
        for s in snap.stacks:
            lines.append("")
            lines.append(f"rank {s.rank} (pid {s.pid} on {s.hostname}, step {s.step}):")
            for t in s.threads:
                lines.append(f"  thread {t.name or t.thread_id}{' (main)' if t.main else ''}:")
                lines += _frames(t.frames, "    ", 6)
    return "\n".join(lines)


__all__ = ["stacks_text"]

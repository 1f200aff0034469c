"""Text of a hang diagnosis (:class:`~meshprof.analyze.hang.diagnose.HangDiagnosis`) for the terminal:
the root cause, the findings in causal order (each consequence says which finding it follows
from), then where each rank is. Ages are shown in seconds."""

from __future__ import annotations

from meshprof.analyze.hang.diagnose import HangDiagnosis


def render_hang_text(diag: HangDiagnosis) -> str:
    """The diagnosis in plain words, for the terminal."""
    lines = [
        f"meshprof hang: {len(diag.ranks)} rank dump(s) in {diag.directory} (world size {diag.world_size or '?'})"
    ]
    rc = diag.root_cause
    if rc is not None:
        lines.append(f"Root cause: {rc.message}")
    if not diag.findings:
        lines.append(
            "No hang or desync found: every collective in flight had all members, with matching arguments."
        )
    for i, f in enumerate(diag.findings, 1):
        after = "" if f.consequence_of is None else f" (consequence of {f.consequence_of + 1})"
        lines.append(f"{i}. [{f.kind}]{after} {f.message}")
    lines.append("")
    lines.append("Where each rank is:")
    for st in diag.ranks:
        fl = st.inflight
        doing = (
            ", ".join(f"{c.op} seq {c.seq} of group {c.group} ({c.age_ns / 1e9:.1f} s)" for c in fl)
            or "no collective in flight"
        )
        loc = st.location
        lines.append(
            f"  rank {st.rank}: {doing}; {('at ' + str(loc)) if loc else 'no Python stack'} [{st.source}: {st.reason}]"
        )
    if diag.stacks is not None and diag.stacks.clusters:
        lines.append("")
        lines.append("Stacks, ranks grouped where identical:")
        lines += [f"  {x}" for x in diag.stacks.lines]
    for p in diag.problems:
        lines.append(f"  note: {p}")
    return "\n".join(lines)


__all__ = ["render_hang_text"]

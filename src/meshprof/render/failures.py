"""Text of the ranks that did not finish normally (:class:`~meshprof.analyze.run.failures.RankFailure`):
the headline the console and HTML reports lead with, and one row per rank."""

from __future__ import annotations

from collections.abc import Sequence

from meshprof.analyze.run.failures import RankFailure

FAILURE_COLUMNS = ("rank", "how", "exit code", "signal", "last step", "reason", "first")
"""The failures table's columns (terminal and HTML)."""


def _ranks(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def _what_happened(f: RankFailure) -> str:
    if f.how == "signal":
        text = f"was killed by {f.signal}" if f.signal else "was killed by a signal"
    elif f.how == "exception":
        text = f"failed ({f.reason})"
    elif f.how == "exit":
        text = f"exited with code {f.exit_code}"
    else:
        text = f"left no final record ({f.reason})"
    return text + (f" at step {f.last_step}" if f.last_step is not None else "")


def failure_headline(failures: Sequence[RankFailure]) -> str:
    """ "rank 1 was killed by SIGKILL at step 87; ranks 0, 2 then failed (connection closed by
    peer)": the first failure, then the others grouped by reason. "" when there is none."""
    if not failures:
        return ""
    first = next((f for f in failures if f.first), failures[0])
    parts = [f"rank {first.rank} {_what_happened(first)}"]
    by_reason: dict[str, list[int]] = {}
    for f in failures:
        if f is not first:
            by_reason.setdefault(f.reason, []).append(f.rank)
    for reason, ranks in by_reason.items():
        parts.append(f"{_ranks(sorted(ranks))} then failed ({reason})")
    return "; ".join(parts)


def failure_cells(f: RankFailure) -> list[str]:
    """The texts of :data:`FAILURE_COLUMNS` for one rank."""
    return [
        str(f.rank) if f.last is None else f"{f.rank}–{f.last}",
        f.how + (" (recovered)" if f.recovered else ""),
        "-" if f.exit_code is None else str(f.exit_code),
        f.signal or "-",
        "-" if f.last_step is None else str(f.last_step),
        f.reason,
        "yes" if f.first else "",
    ]


__all__ = ["FAILURE_COLUMNS", "failure_cells", "failure_headline"]

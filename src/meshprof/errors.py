"""The project's exception type for errors a user can cause, and the subclasses a caller tells
apart by type (never by message text)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


class MeshprofError(Exception):
    """Bad input from the user (CLI arguments, files, layouts, configuration).

    The message names the thing that is wrong and how to fix it. The CLI prints it as one line
    on stderr and exits with code 2.
    """


class NoUsableRankFileError(MeshprofError):
    """A directory without one usable meshprof rank file (none there, or every one damaged):
    ``load_run`` raises it; ``meshprof report`` then looks for torch.profiler traces there."""

    def __init__(self, run_dir: Path, problems: Mapping[int, str]) -> None:
        self.run_dir = run_dir
        self.problems = problems
        """Rank → what is wrong with its file (missing, damaged); empty: no rank files at all
        (the loader's :class:`~meshprof.rundir.rank_problems.RankProblems`: missing ranks as
        spans)."""
        entries = getattr(problems, "entries", None)  # (spans: never one line per rank)
        reasons = [e.reason for e in entries()] if entries is not None else list(problems.values())
        shown = reasons[:SHOWN_PROBLEMS]
        more = len(reasons) - len(shown)
        detail = "; ".join(shown) + (f"; and {more:,} more" if more > 0 else "")
        detail = detail if problems else "no rank files (rank*.npz)"
        super().__init__(f"{run_dir}: no usable rank file ({detail})")


SHOWN_PROBLEMS = 3
"""The ranks' problems a :class:`NoUsableRankFileError` message names (the rest counted: at
100,000 ranks every problem on its one line was megabytes); all are in ``.problems``."""


class NotATraceError(MeshprofError):
    """A file that reads as JSON but holds no ``traceEvents`` list (a config, a comm log): no
    torch.profiler trace. Raised where a trace is parsed (``meshprof.analyze.traces.kineto``); callers
    that scan a folder for traces skip such files quietly, unlike damaged traces."""

    def __init__(self, path: Path) -> None:
        self.path = path
        super().__init__(f"{path}: no traceEvents list (not a torch.profiler trace)")

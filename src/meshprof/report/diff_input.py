"""One run's side of a comparison (``meshprof diff``), from the sections of its report."""

from __future__ import annotations

from meshprof.analyze.diff.compare import RunFigures, RunSide, run_side
from meshprof.layout import Layout
from meshprof.report.run_report import RunReport
from meshprof.report.stages.changes import CHANGES
from meshprof.report.stages.conclusions import PROBLEMS, SUMMARY
from meshprof.report.stages.pipeline import BOTTLENECKS
from meshprof.report.stages.rank_analyses import RANK_ANALYSES
from meshprof.report.stages.serving import SERVING
from meshprof.report.stages.stragglers import STRAGGLERS
from meshprof.report.stages.tables import BY_SIZE, COMM_SHARE, MEMORY, RANKS


def side_of(rep: RunReport, layout: Layout | None) -> RunSide:
    """The figures of ``rep`` that :func:`meshprof.analyze.diff.compare.diff_runs` compares."""
    summary = rep[SUMMARY]
    return run_side(
        RunFigures(
            path=summary.path,
            world_size=summary.world_size,
            problems=rep[PROBLEMS],
            stragglers=rep[STRAGGLERS],
            ranks=rep[RANKS],
            rank_analyses=rep[RANK_ANALYSES],
            comm_share=rep[COMM_SHARE],
            by_size=rep[BY_SIZE],
            memory=rep[MEMORY],
            bottlenecks=rep[BOTTLENECKS],
            findings=summary.findings,
            timeline=rep[CHANGES],
            serving=rep.get(SERVING),
        ),
        layout,
    )

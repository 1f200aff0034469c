"""The cross-rank report, stage by stage: :data:`REPORT_STAGES` is the report.

Each module holds one analysis (or a few that belong together): its result keys, and its stages
(functions whose parameters name their inputs, see :mod:`meshprof.report.stage`). The order
below is the order they run in and the order of ``report --json``'s keys; the per-rank step
analyses run beside the rest from the start.
"""

from __future__ import annotations

from typing import Any

from meshprof.report.stage import Stage, check_stages
from meshprof.report.stages import (
    captures,
    changes,
    conclusions,
    ledger,
    matching,
    overview,
    pipeline,
    rank_analyses,
    sampling_error,
    serving,
    stragglers,
    tables,
    traces,
    verdict,
    waits,
    what_if,
)

REPORT_STAGES: tuple[Stage[Any], ...] = (
    *rank_analyses.STAGES[:1],  # beside the others, from the start
    *changes.STAGES,  # found before the stages: the window they run on
    *matching.STAGES,  # table, clock, failures, match, collectives
    *waits.STAGES,
    *stragglers.STAGES,
    *what_if.STAGES,
    *serving.STAGES,  # requests, serving steps across ranks, their what-if
    *tables.STAGES,  # ranks, memory, comm share, timeline, by size, heatmap
    *overview.STAGES,
    *sampling_error.STAGES,
    *conclusions.STAGES,  # problems, findings, summary
    *pipeline.STAGES,  # pipeline bubble, bottlenecks
    *ledger.STAGES,
    *verdict.STAGES,
    *rank_analyses.STAGES[1:],
    *traces.STAGES,
    *captures.STAGES,
)
check_stages(REPORT_STAGES)

"""Run-level bottlenecks: the step monitor's per-rank findings merged across ranks, the pipeline
bubble measured on all stages together, and the cross-rank rules (load and memory imbalance).

A per-rank rule that fires on several ranks becomes one :class:`RunBottleneck`: the instance of
the worst rank (highest severity, lowest rank on ties) with the list of every rank it fired on.
The rule's own evidence stays untouched; :meth:`RunBottleneck.evidence_text` says which rank it
is and where else it fired.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from meshprof.analyze.steps.rules import Bottleneck, evaluate_cross_rank
from meshprof.config import BottleneckThresholds
from meshprof.records.finding import severity_order

if TYPE_CHECKING:
    from meshprof.analyze.compute.pipeline_bubble import PipelineBubble
    from meshprof.analyze.run.stragglers.stragglers import StragglerReport
    from meshprof.analyze.steps.types import StepAnalysis


@dataclass(frozen=True, slots=True)
class RunBottleneck:
    """One bottleneck of the run, with the ranks it concerns."""

    bottleneck: Bottleneck
    """The rule's finding (for a per-rank rule: as it fired on :attr:`rank`)."""
    rank: int | None
    """The rank whose instance is shown (the worst one); None for run-wide findings."""
    ranks: tuple[int, ...] | None
    """Every rank the rule fired on (rank-analysis order), or the pipeline's stages; None for
    cross-rank rules and findings passed in from outside, which name their rank themselves."""

    @property
    def evidence_text(self) -> str:
        """The rule's evidence, prefixed by the rank it is from and followed by the other ranks
        it fired on, e.g. ``rank 3: exposed communication 41% (fired on 2 ranks: 1, 3)``."""
        text = self.bottleneck.title
        if self.rank is not None:
            text = f"rank {self.rank}: {text}"
        ranks = self.ranks or ()
        if len(ranks) > 1 and "fired on" not in text and self.bottleneck.kind != "pipeline":
            text += f" (fired on {len(ranks)} ranks: {', '.join(map(str, sorted(ranks)))})"
        return text

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: the bottleneck's fields, with ``evidence`` as :attr:`evidence_text`
        and ``metrics["ranks"]`` holding :attr:`ranks` when known."""
        d = self.bottleneck.to_dict()
        d["evidence"] = self.evidence_text
        if self.ranks is not None:
            d["metrics"] = dict(d.get("metrics") or {}) | {"ranks": list(self.ranks)}
        return d


def merge_rank_bottlenecks(analyses: Mapping[int, StepAnalysis]) -> dict[str, RunBottleneck]:
    """category -> the worst rank's instance, with every rank the category fired on."""
    fired: dict[str, list[int]] = {}
    worst: dict[str, tuple[int, Bottleneck]] = {}
    for r, a in analyses.items():
        for b in a.bottlenecks:
            fired.setdefault(b.kind, []).append(r)
            cur = worst.get(b.kind)
            if cur is None or severity_order(b.severity) < severity_order(cur[1].severity):
                worst[b.kind] = (r, b)
    return {c: RunBottleneck(b, r, tuple(fired[c])) for c, (r, b) in worst.items()}


def pipeline_bottleneck(pipeline: PipelineBubble) -> RunBottleneck | None:
    """The pipeline rule on the bubble measured from all stages on the aligned clock."""
    from meshprof.analyze.steps.rules import rule_pipeline

    b = rule_pipeline(
        pipeline.utilization,
        pipeline.bubble,
        pipeline.bubble_theory,
        pipeline.stages,
        pipeline.microbatches,
        BottleneckThresholds(),
    )
    return None if b is None else RunBottleneck(b, None, tuple(sorted(pipeline.per_stage)))


def cross_rank_bottlenecks(
    stragglers: StragglerReport, imbalance: float | None, memory_rank: int | None
) -> list[RunBottleneck]:
    """The cross-rank rules: load imbalance (the highest straggler score, blamed on the named
    straggler or else the highest-scoring rank) and memory imbalance."""
    s = stragglers
    scores = [sc.score for sc in s.scores if sc.score == sc.score]
    load = max(scores) if scores else None
    straggler = s.stragglers[0] if s.stragglers else None
    worst = (
        max(s.scores, key=lambda sc: sc.score if sc.score == sc.score else -1e9)
        if s.scores
        else None
    )
    cross = evaluate_cross_rank(
        load,
        straggler.rank if straggler else (worst.rank if worst else None),
        straggler.phase if straggler else None,
        imbalance,
        memory_rank,
    )
    return [RunBottleneck(b, None, None) for b in cross]


def run_bottlenecks(
    stragglers: StragglerReport,
    memory_imbalance: float | None,
    memory_rank: int | None,
    analyses: Mapping[int, StepAnalysis],
    pipeline: PipelineBubble | None = None,
    extra: Iterable[Bottleneck] = (),
) -> tuple[RunBottleneck, ...]:
    """Every bottleneck of the run, most severe first: per-rank rules merged across ranks (the
    pipeline rule replaced by the joint measurement when there is one), the cross-rank rules,
    then ``extra`` (findings from elsewhere, kept as given)."""
    merged = merge_rank_bottlenecks(analyses)
    if pipeline is not None:
        # the stages' joint timeline replaces each stage's local (lower-bound) view
        merged.pop("pipeline", None)
        joint = pipeline_bottleneck(pipeline)
        if joint is not None:
            merged["pipeline"] = joint
    out = list(merged.values()) + cross_rank_bottlenecks(stragglers, memory_imbalance, memory_rank)
    out.sort(key=lambda b: severity_order(b.bottleneck.severity))
    return tuple(out) + tuple(RunBottleneck(b, None, None) for b in extra)

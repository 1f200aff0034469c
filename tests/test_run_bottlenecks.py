"""Run-level bottleneck merging: one entry per category, the worst rank's, with every rank it
fired on as a field (the evidence text is built from it, never edited in place)."""

from __future__ import annotations

from types import SimpleNamespace

from meshprof.analyze.run.conclusions.run_bottlenecks import merge_rank_bottlenecks
from meshprof.analyze.steps.rules import Bottleneck
from meshprof.records.finding import FindingKind, Severity


def _b(category: str, severity: str, evidence: str) -> Bottleneck:
    return Bottleneck(
        kind=FindingKind(category),
        severity=Severity(severity),
        rule="rule",
        value=0.5,
        threshold=0.3,
        title=evidence,
        suggestion="fix",
        metrics={"x": 1},
    )


def test_merge_keeps_worst_rank_and_lists_every_rank() -> None:
    analyses = {
        0: SimpleNamespace(bottlenecks=[_b("communication", "medium", "e0")]),
        1: SimpleNamespace(
            bottlenecks=[_b("communication", "high", "e1"), _b("memory", "low", "m1")]
        ),
        2: SimpleNamespace(bottlenecks=[_b("communication", "high", "e2")]),
    }
    merged = merge_rank_bottlenecks(analyses)  # type: ignore[arg-type]
    comm = merged["communication"]
    assert (comm.rank, comm.ranks, comm.bottleneck.evidence) == (1, (0, 1, 2), "e1")
    assert comm.evidence_text == "rank 1: e1 (fired on 3 ranks: 0, 1, 2)"
    d = comm.to_dict()
    assert d["metrics"] == {"x": 1, "ranks": [0, 1, 2]} and d["evidence"] == comm.evidence_text
    mem = merged["memory"]
    assert (mem.rank, mem.ranks, mem.evidence_text) == (1, (1,), "rank 1: m1")

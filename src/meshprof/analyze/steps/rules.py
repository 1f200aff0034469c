"""Bottleneck rules: each compares one measured number with a documented, configurable threshold.

A rule fires when its value crosses the threshold (strictly: ``>`` for upper limits, ``<`` for
lower limits) and never below it. Severity grows with the distance past the threshold:
for an upper limit t and value v, ratio = v / t (for a lower limit, t / v):
ratio ≤ 1.25 → low, ≤ 1.5 → medium, ≤ 2 → high, otherwise critical. Memory uses its own bands
(:data:`MEMORY_BANDS`: ≤ 93 % low, ≤ 96 % medium, ≤ 98 % high) because its scale ends at 100 %.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from meshprof.analyze.compute.workload import Workload
from meshprof.config import BottleneckThresholds
from meshprof.records.codec import dataclass_to_json, json_key
from meshprof.records.finding import Finding, FindingKind, Severity

SEVERITIES = (Severity.LOW, Severity.MEDIUM, Severity.HIGH, Severity.CRITICAL)
"""A rule's severities, least severe first."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Bottleneck(Finding):
    """One finding of a rule: what is slow (``kind``: communication, memory, pipeline,
    tensor_parallel, data_loading, load_imbalance, memory_imbalance; written ``category`` in
    JSON), how bad (low → critical), the numbers behind it in words (``title``; written
    ``evidence``), and what to do."""

    kind: FindingKind = field(metadata=json_key("category"))
    """What is slow (communication, memory, pipeline, ...)."""
    title: str = field(metadata=json_key("evidence"))
    """The numbers behind the finding, in words."""
    rule: str
    """The rule, e.g. "exposed_comm > 30% of step"."""
    value: float
    """The measured value the rule compared (a fraction)."""
    threshold: float
    """The rule's threshold (a fraction)."""
    suggestion: str
    """A concrete change to try."""
    metrics: dict[str, Any] = field(default_factory=dict)
    """Extra numbers (ranks, dimensions, milliseconds)."""

    @property
    def category(self) -> str:
        """The bottleneck's category (its kind)."""
        return str(self.kind)

    @property
    def evidence(self) -> str:
        """The numbers behind the finding, in words (its title)."""
        return self.title

    def to_dict(self) -> dict[str, Any]:
        """The JSON object (``category``, ``severity``, ``evidence``, ...)."""
        return dataclass_to_json(self)  # type: ignore[no-any-return]


RATIO_BANDS = (1.25, 1.5, 2.0)
"""Upper edges of low, medium and high for the ratio of a value to its threshold."""
MEMORY_BANDS = (0.93, 0.96, 0.98)
"""Upper edges of low, medium and high for peak memory / capacity."""


def severity(x: float, bands: tuple[float, float, float] = RATIO_BANDS) -> Severity:
    """low, medium or high when ``x`` is at most the band's upper edge, else critical."""
    for name, edge in zip(SEVERITIES, bands, strict=False):
        if x <= edge:
            return name
    return Severity.CRITICAL


#: category -> (the rule, formatted with its threshold; the suggestion, formatted with the
#: rule's ``hint`` argument where it has one)
_TEXT: dict[str, tuple[str, str]] = {
    "communication": (
        "exposed communication > {:.0%} of step",
        "{}",
    ),
    "memory": (
        "peak memory > {:.0%} of capacity",
        "turn on activation checkpointing, shard more (FSDP2 / higher memory strategy), lower the micro-batch size, or offload optimizer state to CPU",
    ),
    "pipeline": (
        "pipeline utilization < {:.0%}",
        "raise the number of micro-batches (m ≥ 4·p = {}), use an interleaved 1F1B schedule with virtual stages, or balance layers across stages",
    ),
    "tensor_parallel": (
        "TP efficiency < {:.0%}",
        "lower the TP degree (trade for DP/PP), keep TP groups within a node, or enable sequence parallel / async TP",
    ),
    "data_loading": (
        "data loading > {:.0%} of step",
        "use more DataLoader workers, pin_memory=True with non_blocking copies, prefetch_factor, or pre-tokenized data",
    ),
    "load_imbalance": (
        "load imbalance > {:.0%}",
        "check that rank's host (thermal throttling, other processes, slower GPU/NIC), balance data (sequence lengths) or pipeline stages",
    ),
    "memory_imbalance": (
        "memory imbalance > {:.0%}",
        "balance layers across pipeline stages (the first stage holds the most activations in 1F1B), or shard the embedding/output layers",
    ),
}

_COMM_FIXES = {
    "dp": "overlap gradient reduction with backward (DDP bucket_cap_mb / FSDP2 reshard_after_forward=False, prefetching), accumulate gradients over more micro-batches, or compress gradients (bf16/PowerSGD comm hook)",
    "tp": "keep TP inside a node (NVLink), lower the TP degree, or use sequence parallelism / async TP to overlap TP collectives",
    "pp": "use more micro-batches or an interleaved schedule so P2P transfers hide behind compute",
}
"""What to do about a dimension's exposed communication in a training job."""
_COMM_FIXES_NOT_TRAINING = {
    "dp": "overlap the data-parallel collectives with compute (issue them asynchronously and early, bucket small ones) or send less: fewer, larger collectives",
    "tp": "a forward-only job has no backward to hide TP collectives behind: keep the TP group inside a node (NVLink), lower the TP degree and serve more replicas instead, or batch more requests per forward so each all-reduce's fixed latency is shared",
}
"""The same where the job computes no gradients (inference, or nothing says it trains): no
gradient advice (:mod:`meshprof.analyze.compute.workload`)."""
_COMM_FIX_DEFAULT = (
    "overlap communication with compute (async collectives, bucketing) or reduce its volume"
)


def comm_fix(dim: str, workload: Workload = Workload.TRAINING) -> str:
    """What to do about exposed communication of ``dim`` in a job of ``workload``: gradient
    advice only for a training job."""
    if workload is not Workload.TRAINING and dim in _COMM_FIXES_NOT_TRAINING:
        return _COMM_FIXES_NOT_TRAINING[dim]
    return _COMM_FIXES.get(dim, _COMM_FIX_DEFAULT)


def _finding(
    category: str,
    value: float,
    threshold: float,
    severity: Severity,
    evidence: str,
    hint: object = "",
    metrics: dict[str, Any] | None = None,
) -> Bottleneck:
    """The finding of a rule that fired (texts from :data:`_TEXT`)."""
    rule, suggestion = _TEXT[category]
    return Bottleneck(
        kind=FindingKind(category),
        severity=severity,
        rule=_shared(rule.format(threshold)),
        value=value,
        threshold=threshold,
        title=evidence,
        suggestion=_shared(suggestion.format(hint)),
        metrics=metrics if metrics is not None else {},
    )


_SHARED: dict[str, str] = {}


def _shared(text: str) -> str:
    """One object per distinct rule or suggestion text (a few dozen at most): pickled once
    for all the ranks' findings a worker sends back, not once per rank."""
    return _SHARED.setdefault(text, text)


def rule_exposed_comm(
    exposed_share: float,
    by_dim: dict[str, float],
    th: BottleneckThresholds,
    workload: Workload = Workload.TRAINING,
) -> Bottleneck | None:
    """Exposed communication > threshold of the step (the suggestion: :func:`comm_fix`)."""
    if not exposed_share > th.exposed_comm:
        return None
    worst = max(by_dim.items(), key=lambda kv: kv[1]) if by_dim else ("all", exposed_share)
    dims = ", ".join(
        f"{d} {v:.0%}" for d, v in sorted(by_dim.items(), key=lambda kv: -kv[1]) if v > 0
    )
    evidence = f"{exposed_share:.1%} of the step waits on communication that no compute hides ({dims or 'no dimension data'}); largest: {worst[0]}"
    fix = comm_fix(worst[0], workload)
    sev = severity(exposed_share / th.exposed_comm)
    metrics = {"by_dimension": by_dim}
    return _finding("communication", exposed_share, th.exposed_comm, sev, evidence, fix, metrics)


def rule_memory(
    peak_fraction: float, peak_bytes: int, capacity: int, th: BottleneckThresholds
) -> Bottleneck | None:
    """Peak memory > threshold of capacity."""
    if capacity <= 0 or not peak_fraction > th.memory:
        return None
    evidence = (
        f"peak {peak_bytes / 2**30:.2f} GiB of {capacity / 2**30:.2f} GiB ({peak_fraction:.1%})"
    )
    metrics = {"peak_bytes": peak_bytes, "capacity_bytes": capacity}
    sev = severity(peak_fraction, MEMORY_BANDS)
    return _finding("memory", peak_fraction, th.memory, sev, evidence, metrics=metrics)


def rule_pipeline(
    utilization: float,
    measured_bubble: float,
    theory_bubble: float | None,
    p: int,
    m: int,
    th: BottleneckThresholds,
) -> Bottleneck | None:
    """Pipeline utilization < threshold."""
    limit = th.pipeline_utilization
    if not utilization < limit:
        return None
    theory = f", theory for the schedule {theory_bubble:.1%}" if theory_bubble is not None else ""
    evidence = f"stages are busy {utilization:.1%} of the schedule; bubble {measured_bubble:.1%} with p={p} stages, m={m} micro-batches{theory}"
    metrics = {
        "pp": p,
        "microbatches": m,
        "bubble": measured_bubble,
        "bubble_theory": theory_bubble,
    }
    sev = severity(limit / max(utilization, 1e-9))
    return _finding("pipeline", utilization, limit, sev, evidence, 4 * p, metrics)


def rule_tp(
    tp_efficiency: float, th: BottleneckThresholds, workload: Workload = Workload.TRAINING
) -> Bottleneck | None:
    """Tensor-parallel efficiency < threshold."""
    if not tp_efficiency < th.tp_efficiency:
        return None
    where = "forward+backward" if workload is Workload.TRAINING else "forward"
    evidence = f"TP collectives take {1 - tp_efficiency:.1%} of {where} time"
    sev = severity(th.tp_efficiency / max(tp_efficiency, 1e-9))
    return _finding("tensor_parallel", tp_efficiency, th.tp_efficiency, sev, evidence)


def rule_data_loading(share: float, th: BottleneckThresholds) -> Bottleneck | None:
    """Data loading > threshold of the step."""
    if not share > th.data_loading:
        return None
    evidence = f"{share:.1%} of each step waits for the next batch"
    sev = severity(share / th.data_loading)
    return _finding("data_loading", share, th.data_loading, sev, evidence)


def rule_load_imbalance(
    imbalance: float, straggler: int | None, phase: str | None, th: BottleneckThresholds
) -> Bottleneck | None:
    """Cross-rank: slowest rank's compute > median by more than the threshold."""
    if not imbalance > th.load_imbalance:
        return None
    where = f"rank {straggler}" if straggler is not None else "the slowest rank"
    ph = f", mostly in {phase}" if phase else ""
    evidence = f"{where} computes {imbalance:.1%} longer than the median rank{ph}; the others wait for it in collectives"
    metrics = {"straggler": straggler, "phase": phase}
    sev = severity(imbalance / th.load_imbalance)
    return _finding("load_imbalance", imbalance, th.load_imbalance, sev, evidence, metrics=metrics)


def rule_memory_imbalance(
    imbalance: float, rank: int | None, th: BottleneckThresholds
) -> Bottleneck | None:
    """Cross-rank: largest peak memory > median by more than the threshold."""
    if not imbalance > th.memory_imbalance:
        return None
    evidence = f"rank {rank} peaks {imbalance:.1%} above the median rank's peak memory"
    sev = severity(imbalance / th.memory_imbalance)
    limit = th.memory_imbalance
    return _finding("memory_imbalance", imbalance, limit, sev, evidence, metrics={"rank": rank})


def evaluate_cross_rank(
    load_imbalance: float | None,
    straggler: int | None,
    phase: str | None,
    memory_imbalance: float | None,
    memory_rank: int | None,
    th: BottleneckThresholds | None = None,
) -> list[Bottleneck]:
    """The cross-rank rules (for the run report)."""
    th = th or BottleneckThresholds()
    out = []
    if load_imbalance is not None:
        b = rule_load_imbalance(load_imbalance, straggler, phase, th)
        if b:
            out.append(b)
    if memory_imbalance is not None:
        b = rule_memory_imbalance(memory_imbalance, memory_rank, th)
        if b:
            out.append(b)
    return out

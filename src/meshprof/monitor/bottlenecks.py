"""Bottleneck rules: each compares one measured number with a documented, configurable threshold.

A rule fires when its value crosses the threshold (strictly: ``>`` for upper limits, ``<`` for
lower limits) and never below it. Severity grows with the distance past the threshold:
for an upper limit t and value v, ratio = v / t (for a lower limit, t / v):
ratio ≤ 1.25 → low, ≤ 1.5 → medium, ≤ 2 → high, otherwise critical. Memory uses its own bands
(> 90% low… see :func:`_memory_severity`) because its scale ends at 100%.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SEVERITIES = ("low", "medium", "high", "critical")


@dataclass(kw_only=True, slots=True)
class BottleneckThresholds:
    """Thresholds of the bottleneck rules (fractions in [0, 1])."""

    exposed_comm: float = 0.30
    """Exposed (not hidden) communication above this share of the step time."""
    memory: float = 0.90
    """Peak memory above this share of device capacity."""
    pipeline_utilization: float = 0.70
    """Pipeline utilization (1 − bubble) below this."""
    tp_efficiency: float = 0.80
    """Tensor-parallel efficiency below this."""
    data_loading: float = 0.10
    """Data loading above this share of the step time."""
    load_imbalance: float = 0.10
    """Cross-rank: slowest rank's compute time above the median by more than this fraction."""
    memory_imbalance: float = 0.20
    """Cross-rank: largest peak memory above the median by more than this fraction."""

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Bottleneck:
    """One finding: what is slow, how sure we are (the numbers), and what to do."""

    category: str
    """communication, memory, pipeline, tensor_parallel, data_loading, load_imbalance, memory_imbalance."""
    severity: str
    """low, medium, high or critical."""
    rule: str
    """The rule, e.g. "exposed_comm > 30% of step"."""
    value: float
    """The measured value the rule compared (a fraction)."""
    threshold: float
    evidence: str
    """The numbers behind the finding, in words."""
    suggestion: str
    """A concrete change to try."""
    metrics: dict[str, Any] = field(default_factory=dict)
    """Extra numbers (ranks, dimensions, milliseconds)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _severity(ratio: float) -> str:
    if ratio <= 1.25:
        return "low"
    if ratio <= 1.5:
        return "medium"
    if ratio <= 2.0:
        return "high"
    return "critical"


def _memory_severity(frac: float) -> str:
    if frac <= 0.93:
        return "low"
    if frac <= 0.96:
        return "medium"
    if frac <= 0.98:
        return "high"
    return "critical"


def rule_exposed_comm(
    exposed_share: float, by_dim: dict[str, float], th: BottleneckThresholds
) -> Bottleneck | None:
    """Exposed communication > threshold of the step."""
    if not exposed_share > th.exposed_comm:
        return None
    worst = max(by_dim.items(), key=lambda kv: kv[1]) if by_dim else ("all", exposed_share)
    fixes = {
        "dp": "overlap gradient reduction with backward (DDP bucket_cap_mb / FSDP2 reshard_after_forward=False, prefetching), accumulate gradients over more micro-batches, or compress gradients (bf16/PowerSGD comm hook)",
        "tp": "keep TP inside a node (NVLink), lower the TP degree, or use sequence parallelism / async TP to overlap TP collectives",
        "pp": "use more micro-batches or an interleaved schedule so P2P transfers hide behind compute",
    }
    dims = ", ".join(
        f"{d} {v:.0%}" for d, v in sorted(by_dim.items(), key=lambda kv: -kv[1]) if v > 0
    )
    return Bottleneck(
        category="communication",
        severity=_severity(exposed_share / th.exposed_comm),
        rule=f"exposed communication > {th.exposed_comm:.0%} of step",
        value=exposed_share,
        threshold=th.exposed_comm,
        evidence=f"{exposed_share:.1%} of the step waits on communication that no compute hides ({dims or 'no dimension data'}); largest: {worst[0]}",
        suggestion=fixes.get(
            worst[0],
            "overlap communication with compute (async collectives, bucketing) or reduce its volume",
        ),
        metrics={"by_dimension": by_dim},
    )


def rule_memory(
    peak_fraction: float, peak_bytes: int, capacity: int, th: BottleneckThresholds
) -> Bottleneck | None:
    """Peak memory > threshold of capacity."""
    if capacity <= 0 or not peak_fraction > th.memory:
        return None
    return Bottleneck(
        category="memory",
        severity=_memory_severity(peak_fraction),
        rule=f"peak memory > {th.memory:.0%} of capacity",
        value=peak_fraction,
        threshold=th.memory,
        evidence=f"peak {peak_bytes / 2**30:.2f} GiB of {capacity / 2**30:.2f} GiB ({peak_fraction:.1%})",
        suggestion="turn on activation checkpointing, shard more (FSDP2 / higher memory strategy), lower the micro-batch size, or offload optimizer state to CPU",
        metrics={"peak_bytes": peak_bytes, "capacity_bytes": capacity},
    )


def rule_pipeline(
    utilization: float,
    measured_bubble: float,
    theory_bubble: float | None,
    p: int,
    m: int,
    th: BottleneckThresholds,
) -> Bottleneck | None:
    """Pipeline utilization < threshold."""
    if not utilization < th.pipeline_utilization:
        return None
    theory = f", theory for the schedule {theory_bubble:.1%}" if theory_bubble is not None else ""
    return Bottleneck(
        category="pipeline",
        severity=_severity(th.pipeline_utilization / max(utilization, 1e-9)),
        rule=f"pipeline utilization < {th.pipeline_utilization:.0%}",
        value=utilization,
        threshold=th.pipeline_utilization,
        evidence=f"stages are busy {utilization:.1%} of the schedule; bubble {measured_bubble:.1%} with p={p} stages, m={m} micro-batches{theory}",
        suggestion=f"raise the number of micro-batches (m ≥ 4·p = {4 * p}), use an interleaved 1F1B schedule with virtual stages, or balance layers across stages",
        metrics={
            "pp": p,
            "microbatches": m,
            "bubble": measured_bubble,
            "bubble_theory": theory_bubble,
        },
    )


def rule_tp(tp_efficiency: float, th: BottleneckThresholds) -> Bottleneck | None:
    """Tensor-parallel efficiency < threshold."""
    if not tp_efficiency < th.tp_efficiency:
        return None
    return Bottleneck(
        category="tensor_parallel",
        severity=_severity(th.tp_efficiency / max(tp_efficiency, 1e-9)),
        rule=f"TP efficiency < {th.tp_efficiency:.0%}",
        value=tp_efficiency,
        threshold=th.tp_efficiency,
        evidence=f"TP collectives take {1 - tp_efficiency:.1%} of forward+backward time",
        suggestion="lower the TP degree (trade for DP/PP), keep TP groups within a node, or enable sequence parallel / async TP",
    )


def rule_data_loading(share: float, th: BottleneckThresholds) -> Bottleneck | None:
    """Data loading > threshold of the step."""
    if not share > th.data_loading:
        return None
    return Bottleneck(
        category="data_loading",
        severity=_severity(share / th.data_loading),
        rule=f"data loading > {th.data_loading:.0%} of step",
        value=share,
        threshold=th.data_loading,
        evidence=f"{share:.1%} of each step waits for the next batch",
        suggestion="use more DataLoader workers, pin_memory=True with non_blocking copies, prefetch_factor, or pre-tokenized data",
    )


def rule_load_imbalance(
    imbalance: float, straggler: int | None, phase: str | None, th: BottleneckThresholds
) -> Bottleneck | None:
    """Cross-rank: slowest rank's compute > median by more than the threshold."""
    if not imbalance > th.load_imbalance:
        return None
    where = f"rank {straggler}" if straggler is not None else "the slowest rank"
    ph = f", mostly in {phase}" if phase else ""
    return Bottleneck(
        category="load_imbalance",
        severity=_severity(imbalance / th.load_imbalance),
        rule=f"load imbalance > {th.load_imbalance:.0%}",
        value=imbalance,
        threshold=th.load_imbalance,
        evidence=f"{where} computes {imbalance:.1%} longer than the median rank{ph}; the others wait for it in collectives",
        suggestion="check that rank's host (thermal throttling, other processes, slower GPU/NIC), balance data (sequence lengths) or pipeline stages",
        metrics={"straggler": straggler, "phase": phase},
    )


def rule_memory_imbalance(
    imbalance: float, rank: int | None, th: BottleneckThresholds
) -> Bottleneck | None:
    """Cross-rank: largest peak memory > median by more than the threshold."""
    if not imbalance > th.memory_imbalance:
        return None
    return Bottleneck(
        category="memory_imbalance",
        severity=_severity(imbalance / th.memory_imbalance),
        rule=f"memory imbalance > {th.memory_imbalance:.0%}",
        value=imbalance,
        threshold=th.memory_imbalance,
        evidence=f"rank {rank} peaks {imbalance:.1%} above the median rank's peak memory",
        suggestion="balance layers across pipeline stages (the first stage holds the most activations in 1F1B), or shard the embedding/output layers",
        metrics={"rank": rank},
    )


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

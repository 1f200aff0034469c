"""Training or inference: what a rank's recording says of its job, for advice that depends on it
(gradient advice only for a job that computes gradients).

* **training** — the rank stepped an optimizer (automatic step detection found optimizer steps:
  ``step_detection`` "optimizer") or recorded a backward or optimizer phase
  (:data:`TRAINING_PHASES`: ``StepMonitor.phase("backward")``, the pipeline's backward chunks);
* **inference** — automatic step detection made its steps of forward calls (``step_detection``
  "forward": no optimizer ever stepped, the forwards ran without autograd or the script ended
  without a backward) and no training phase was recorded;
* **unknown** — neither (steps the script marked itself, no phases): advice stays neutral.

A job is training when any rank is, inference when no rank trains and at least one is inference.
"""

from __future__ import annotations

from collections.abc import Iterable

from meshprof.records.finding import StrEnum

TRAINING_PHASES = frozenset(
    {
        "backward",
        "forward_backward",
        "pp_backward",
        "pp_backward_weight",
        "optimizer",
        "optimizer_step",
        "optim",
    }
)
"""Phase (span) names that only a training step has."""


class Workload(StrEnum):
    """What a job does with its forwards."""

    TRAINING = "training"
    INFERENCE = "inference"
    UNKNOWN = "unknown"


def workload_of(step_detection: str | None, phase_names: Iterable[str] = ()) -> Workload:
    """One rank's workload from how its steps were found (``RankMeta.step_detection``) and the
    names of the phases it recorded (``RankMeta.span_names``, or a step analysis' phases)."""
    if any(str(n).lower() in TRAINING_PHASES for n in phase_names):
        return Workload.TRAINING
    mode = str(step_detection or "")
    if mode == "optimizer":
        return Workload.TRAINING
    if mode == "forward":
        return Workload.INFERENCE
    return Workload.UNKNOWN


def job_workload(ranks: Iterable[Workload]) -> Workload:
    """A job's workload from its ranks' (see the module docstring)."""
    seen = set(ranks)
    if Workload.TRAINING in seen:
        return Workload.TRAINING
    if Workload.INFERENCE in seen:
        return Workload.INFERENCE
    return Workload.UNKNOWN


__all__ = ["TRAINING_PHASES", "Workload", "job_workload", "workload_of"]

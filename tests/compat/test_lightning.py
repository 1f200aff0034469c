"""PyTorch Lightning, unmodified, with and without ``meshprof run``: the DDP strategy and
Lightning's FSDP2 strategy (``ModelParallelStrategy``; ``strategy="fsdp"`` refuses a CPU
accelerator), on 2 gloo CPU ranks launched by torchrun."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from harness import (
    JOBS,
    WORLD,
    Pair,
    check_collectives,
    check_step_time,
    check_steps,
    require,
    run_pair,
    step_durations_s,
    write_matrix_row,
)

require("lightning")
pytestmark = pytest.mark.timeout(600)

STEPS = 20


@pytest.fixture(scope="module", params=["ddp", "fsdp2"])
def fit(request: pytest.FixtureRequest, compat_dir: Path) -> Pair:
    job = [str(JOBS / "lightning_train.py"), request.param, str(STEPS)]
    return run_pair(f"Lightning {request.param}", job, compat_dir / f"lightning-{request.param}")


def test_same_losses_and_weights(fit: Pair) -> None:
    for r in range(WORLD):
        plain, profiled = fit.plain.ranks[r], fit.profiled.ranks[r]
        assert len(plain["losses"]) == STEPS
        assert profiled["losses"] == plain["losses"]
        assert profiled["params"] == plain["params"]


def test_figures_match_lightning(fit: Pair) -> None:
    """Steps detected = the Trainer's ``global_step``; each step's collectives = the Flight
    Recorder's (the profiled run's = the plain run's) between two ``on_train_batch_end`` hooks;
    step time = the time between two of them, within 5%."""
    steps = fit.plain.ranks[0]["global_step"]
    assert steps == STEPS
    check_steps(fit, steps)
    flight = [fit.plain.ranks[r]["flight"] for r in range(WORLD)]
    assert [fit.profiled.ranks[r]["flight"] for r in range(WORLD)] == flight
    ops = check_collectives(fit, flight, [(j, j) for j in range(1, steps)])
    ends = [fit.profiled.ranks[r]["step_end_ns"] for r in range(WORLD)]
    between = [[(b - a) / 1e9 for a, b in itertools.pairwise(e)] for e in ends]
    ratios = check_step_time(fit, between)
    write_matrix_row(
        fit,
        steps=steps,
        steps_detected=[fit.meta(r).steps_detected for r in range(WORLD)],
        collectives_per_step=dict(ops),
        step_time_ratio=ratios,
        framework_step_s=sum(between[0]) / len(between[0]),
        meshprof_step_s=sum(step_durations_s(fit.run.ranks[0])[1:]) / (steps - 1),
    )

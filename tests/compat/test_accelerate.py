"""Hugging Face Accelerate, unmodified: a plain training loop (``Accelerator(cpu=True)``, DDP)
launched by torchrun, with and without ``meshprof run``."""

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

require("accelerate")
pytestmark = pytest.mark.timeout(600)

STEPS = 20


@pytest.fixture(scope="module")
def loop(compat_dir: Path) -> Pair:
    job = [str(JOBS / "accelerate_train.py"), str(STEPS)]
    return run_pair("Accelerate (DDP)", job, compat_dir / "accelerate")


def test_same_losses_and_weights(loop: Pair) -> None:
    for r in range(WORLD):
        plain, profiled = loop.plain.ranks[r], loop.profiled.ranks[r]
        assert len(plain["losses"]) == STEPS
        assert profiled["losses"] == plain["losses"]
        assert profiled["params"] == plain["params"]


def test_figures_match_the_loop(loop: Pair) -> None:
    """Steps detected = the loop's optimizer steps; each step's collectives = the Flight Recorder's
    (the profiled run's = the plain run's) between two optimizer steps; step time = the loop's
    own time between them, within 5%."""
    check_steps(loop, STEPS)
    flight = [loop.plain.ranks[r]["flight"] for r in range(WORLD)]
    assert [loop.profiled.ranks[r]["flight"] for r in range(WORLD)] == flight
    ops = check_collectives(loop, flight, [(j, j) for j in range(1, STEPS)])
    ends = [loop.profiled.ranks[r]["step_end_ns"] for r in range(WORLD)]
    between = [[(b - a) / 1e9 for a, b in itertools.pairwise(e)] for e in ends]
    ratios = check_step_time(loop, between)
    write_matrix_row(
        loop,
        steps=STEPS,
        steps_detected=[loop.meta(r).steps_detected for r in range(WORLD)],
        collectives_per_step=dict(ops),
        step_time_ratio=ratios,
        framework_step_s=sum(between[0]) / len(between[0]),
        meshprof_step_s=sum(step_durations_s(loop.run.ranks[0])[1:]) / (STEPS - 1),
    )

"""Hugging Face transformers, unmodified, with and without ``meshprof run``: tensor-parallel
``generate()`` (``DistributedConfig(tp_size=2)``, transformers builds its own DeviceMesh) and the
``Trainer`` (DDP), on a tiny random Llama saved to a folder (no hub access)."""

from __future__ import annotations

import itertools
from collections import Counter
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
    step_ops,
    write_matrix_row,
)

require("transformers", "accelerate")  # the Trainer needs accelerate
pytestmark = pytest.mark.timeout(600)

NEW_TOKENS = 8
TRAIN_STEPS = 20


@pytest.fixture(scope="module")
def generate(compat_dir: Path, tiny_llama: Path) -> Pair:
    job = [str(JOBS / "hf_generate_tp.py"), str(tiny_llama), str(NEW_TOKENS)]
    return run_pair("transformers TP generate", job, compat_dir / "hf-generate")


@pytest.fixture(scope="module")
def trainer(compat_dir: Path, tiny_llama: Path) -> Pair:
    job = [str(JOBS / "hf_trainer.py"), str(tiny_llama), str(TRAIN_STEPS)]
    return run_pair("transformers Trainer (DDP)", job, compat_dir / "hf-trainer")


def test_generate_same_tokens(generate: Pair) -> None:
    for r in range(WORLD):
        tokens = generate.plain.ranks[r]["tokens"]
        assert len(tokens) == 8 + NEW_TOKENS
        assert generate.profiled.ranks[r]["tokens"] == tokens
    assert generate.plain.ranks[0]["tokens"] == generate.plain.ranks[1]["tokens"]


def test_generate_figures(generate: Pair) -> None:
    """An inference job: one step per forward (``--step-detect auto``), as many as the model's
    forward calls; each forward's collectives = the Flight Recorder's over it (the profiled
    run's Flight Recorder = the plain run's); forward time = the script's own timing of each
    forward (hooks on the model), within 5%."""
    forwards = generate.plain.ranks[0]["forwards"]
    assert forwards == NEW_TOKENS  # one forward per generated token
    check_steps(generate, forwards)
    for r in range(WORLD):
        assert generate.meta(r).step_detection == "forward"
    flight = [generate.plain.ranks[r]["flight"] for r in range(WORLD)]
    assert [generate.profiled.ranks[r]["flight"] for r in range(WORLD)] == flight
    # --step-detect auto decides "inference" at the third grad-free forward; the collectives of
    # the two forwards before are labelled with the provisional step 0 when they are issued
    # (a known defect, docs/compatibility.md): from the third forward on each step is checked,
    # and the first two together
    ops = check_collectives(generate, flight, [(j, j) for j in range(2, forwards)])
    for r in range(WORLD):
        rd = generate.run.ranks[r]
        first_two = step_ops(rd, 0) + step_ops(rd, 1)
        assert first_two == Counter(flight[r][0]) + Counter(flight[r][1])
    timed = [
        [ns / 1e9 for ns in generate.profiled.ranks[r]["forward_ns"][1:]] for r in range(WORLD)
    ]
    ratios = check_step_time(generate, timed)
    write_matrix_row(
        generate,
        steps=forwards,
        steps_detected=[generate.meta(r).steps_detected for r in range(WORLD)],
        collectives_per_step=dict(ops),
        step_time_ratio=ratios,
        framework_step_s=sum(timed[0]) / len(timed[0]),
        meshprof_step_s=sum(step_durations_s(generate.run.ranks[0])[1:]) / (forwards - 1),
    )


def test_trainer_same_losses_and_weights(trainer: Pair) -> None:
    for r in range(WORLD):
        plain, profiled = trainer.plain.ranks[r], trainer.profiled.ranks[r]
        assert len(plain["losses"]) == TRAIN_STEPS
        assert profiled["losses"] == plain["losses"]
        assert profiled["params"] == plain["params"]


def test_trainer_figures(trainer: Pair) -> None:
    """Steps detected = the Trainer's ``global_step``; each step's collectives = the Flight
    Recorder's (the profiled run's = the plain run's) between two ``on_step_end`` callbacks;
    step time = the time between two ``on_step_end`` callbacks, within 5%."""
    steps = trainer.plain.ranks[0]["global_step"]
    assert steps == TRAIN_STEPS
    check_steps(trainer, steps)
    flight = [trainer.plain.ranks[r]["flight"] for r in range(WORLD)]
    assert [trainer.profiled.ranks[r]["flight"] for r in range(WORLD)] == flight
    ops = check_collectives(trainer, flight, [(j, j) for j in range(1, steps)])
    ends = [trainer.profiled.ranks[r]["step_end_ns"] for r in range(WORLD)]
    between = [[(b - a) / 1e9 for a, b in itertools.pairwise(e)] for e in ends]
    ratios = check_step_time(trainer, between)
    write_matrix_row(
        trainer,
        steps=steps,
        steps_detected=[trainer.meta(r).steps_detected for r in range(WORLD)],
        collectives_per_step=dict(ops),
        step_time_ratio=ratios,
        framework_step_s=sum(between[0]) / len(between[0]),
        meshprof_step_s=sum(step_durations_s(trainer.run.ranks[0])[1:]) / (steps - 1),
    )

"""Automatic step detection of ``meshprof run`` (meshprof.session.recording, in one process): the auto rule,
the forced modes, and :func:`meshprof.mark_step`."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

import meshprof
from meshprof.api import StepMonitor
from meshprof.session.recording import RecordingSession, SessionConfig, step_detect_mode


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


def _train(m: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    opt.zero_grad()
    m(torch.ones(2, 4)).sum().backward()
    opt.step()


def _infer(m: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    with torch.no_grad():
        m(torch.ones(2, 4))


def _infer_with_grad(m: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    m(torch.ones(2, 4))


def _steps(
    mode: str, loop: list[Callable[[torch.nn.Module, torch.optim.Optimizer], None]]
) -> tuple[RecordingSession, np.ndarray]:
    """Run ``loop`` under a session with step detection ``mode``; its closed step spans
    (step, start, end)."""
    mon = StepMonitor(None, sample_memory_every_step=False)
    session = RecordingSession(
        SessionConfig(step_detection=mode, clock_sync=False), monitor=mon
    ).start()
    m = _model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for fn in loop:
        fn(m, opt)
    session.set_exit("normal", 0)
    session.stop(final_write=False)
    st = [(s[4], s[5], s[5] + s[6]) for s in mon._spans if s[0] == 0]
    return session, np.asarray(st, dtype=np.int64).reshape(-1, 3)


@pytest.mark.parametrize("mode", ["auto", "optimizer"])
def test_training_gets_optimizer_steps(mode: str) -> None:
    session, st = _steps(mode, [_train] * 4)
    assert session.step_mode == "optimizer" and session.meta["step_detection"] == "optimizer"
    # step 0 opens at the first forward; each optimizer step ends one (the last stays open)
    assert st[:, 0].tolist() == [0, 1, 2, 3] and session.steps_detected == 4


@pytest.mark.parametrize("loop", [[_infer] * 5, [_infer_with_grad] * 5])
def test_auto_without_optimizer_gets_one_step_per_forward(loop: list) -> None:
    session, st = _steps("auto", loop)
    assert session.step_mode == "forward" and session.meta["steps_detected"] == 5
    assert st[:, 0].tolist() == [0, 1, 2, 3, 4]
    assert (st[1:, 1] >= st[:-1, 2]).all()  # one step per forward, none overlapping


def test_auto_evaluation_before_training_counts_nothing_twice() -> None:
    session, st = _steps("auto", [_infer] * 3 + [_train] * 3)
    assert session.step_mode == "optimizer"
    # 3 grad-free forwards decide "forward": 3 evaluation steps; the first training forward
    # switches to optimizer steps (it opens the step the first optimizer step ends): 3 closed;
    # no two steps overlap, and every step made is a step recorded
    assert st[:, 0].tolist() == list(range(6))
    assert (st[1:, 1] >= st[:-1, 2]).all()
    assert session.steps_detected == len(st) == 6


def test_auto_grad_free_forwards_inside_a_training_step_decide_nothing() -> None:
    """A training step that runs grad-free forwards after its forward (a metric under
    ``torch.no_grad()``; torch.compile's AOTAutograd runs its graphs as modules with autograd
    off, torchtitan's compiled steps 12 of them) is still a training step: optimizer steps only,
    step 0 from the first forward (before, the third grad-free forward decided "inference")."""
    first: list[int] = []

    def train_with_metric(m: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        import time

        first.append(time.time_ns())
        opt.zero_grad()
        loss = m(torch.ones(2, 4)).sum()
        with torch.no_grad():
            for _ in range(4):
                m(torch.zeros(2, 4))  # the metric's forwards
        loss.backward()
        opt.step()

    session, st = _steps("auto", [train_with_metric] * 3)
    assert session.step_mode == "optimizer" and session.meta["step_detection"] == "optimizer"
    assert st[:, 0].tolist() == [0, 1, 2] and session.steps_detected == len(st) == 3
    assert first[0] <= st[0, 1] <= first[1]  # step 0 starts at the first (training) forward


def test_auto_sanity_check_before_training_is_no_step() -> None:
    """PyTorch Lightning's sanity check: 2 validation batches (grad-free forwards) before
    training. They stay undecided, are dropped at the first optimizer step, and step 0 starts
    again at the first training forward: optimizer steps only, as many made as recorded."""
    import time

    marks: list[int] = []

    def evaluated(m: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        _infer(m, opt)
        time.sleep(0.05)  # (the evaluation takes a while)
        marks.append(time.time_ns())

    session, st = _steps("auto", [evaluated] * 2 + [_train] * 4)
    assert session.step_mode == "optimizer"
    assert st[:, 0].tolist() == [0, 1, 2, 3]
    assert session.steps_detected == len(st) == 4
    assert st[0, 1] >= marks[-1]  # step 0 holds no evaluation


def test_forced_modes() -> None:
    session, st = _steps("forward", [_train] * 3)
    assert session.step_mode == "forward" and len(st) == 3  # forwards, even in training
    session, st = _steps("off", [_train, _infer])
    assert session.step_mode == "off" and len(st) == 0
    assert step_detect_mode(True) == "optimizer" and step_detect_mode(False) == "off"
    with pytest.raises(ValueError, match="expected one of auto, optimizer, forward, off"):
        step_detect_mode("bogus")


def test_mark_step_is_public_and_turns_detection_off() -> None:
    def marked(m: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        _infer(m, opt)
        assert meshprof.mark_step()

    session, st = _steps("auto", [marked] * 4)
    # the user's marks are the steps: step 0 (opened at the first forward) and each mark ends one
    assert session.meta["step_detection"] == "user" and session.step_mode == "off"
    assert len(st) == 4 and st[:, 0].tolist() == [0, 1, 2, 3]


def test_mark_step_without_a_monitor() -> None:
    import meshprof.monitor.step_monitor as mm

    saved, mm._active = mm._active, None
    try:
        assert meshprof.mark_step() is False
    finally:
        mm._active = saved

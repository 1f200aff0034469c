"""Step detection under torch.compile: detecting steps never makes torch.compile compile again.

Code that torch.compile traces through a module call guards on the number of global module hooks;
step detection's hooks going away when the mode is decided (at the first optimizer step, in
training) failed those guards, and every compiled region compiled a second time (torchtitan with
``--compile.enable`` under ``meshprof run``: +16 s on step 2, on this machine). The truth is the
same loop without meshprof: the frames torch.compile compiles (``CompileCounter``, a backend that
counts them and runs the graph as traced) and the results, bit for bit, must be the same; each
mode still gets its steps.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from meshprof.api import StepMonitor
from meshprof.session.recording import RecordingSession, SessionConfig

STEPS = 5


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


def _run(mode: str | None, style: str, train: bool) -> tuple[int, list[float], int, str]:
    """(frames compiled, per-step results, steps recorded, mode in effect) of STEPS steps of a
    3-block model compiled in ``style``: "blocks" (torch.compile of each block, as torchtitan),
    "inplace" (``model.compile()``), "wrap" (``torch.compile(model)``); without meshprof when
    ``mode`` is None."""
    from torch._dynamo.testing import CompileCounter  # (1.8 s to import: not at collection)

    torch._dynamo.reset()
    counter = CompileCounter()
    torch.manual_seed(0)
    model: torch.nn.Module = torch.nn.Sequential(*[_Block() for _ in range(3)])
    if style == "blocks":
        for i, block in enumerate(model):
            model[i] = torch.compile(block, backend=counter)
    elif style == "inplace":
        model.compile(backend=counter)
    else:
        model = torch.compile(model, backend=counter)
    mon = session = None
    if mode is not None:
        mon = StepMonitor(None, sample_memory_every_step=False)
        session = RecordingSession(
            SessionConfig(step_detection=mode, clock_sync=False), monitor=mon
        ).start()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(0)
    results = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.compile(module) with global hooks: a warning
        for _ in range(STEPS):
            x = torch.randn(4, 8, generator=gen)
            if train:
                loss = model(x).sum()
                loss.backward()
                opt.step()
                opt.zero_grad()
                results.append(loss.item())
            else:
                with torch.no_grad():
                    results.append(model(x).sum().item())
    steps, mode_in_effect = 0, "off"
    if session is not None and mon is not None:
        session.set_exit("normal", 0)
        session.stop(final_write=False)
        steps = sum(1 for s in mon._spans if s[0] == 0)
        mode_in_effect = session.step_mode
    return counter.frame_count, results, steps, mode_in_effect


CASES = [
    *(
        (mode, style, True)
        for mode in ("auto", "optimizer")
        for style in ("blocks", "inplace", "wrap")
    ),
    *(
        (mode, style, False)
        for mode in ("auto", "forward")
        for style in ("blocks", "inplace", "wrap")
    ),
]


def test_aot_graphs_run_as_modules_are_no_steps() -> None:
    """A training step with loss terms compiled by the ``aot_eager`` backend: AOTAutograd
    runs their forward graphs as fx GraphModules with autograd off, outermost module calls to
    the hooks; they are part of the training step, never inference forwards (before, 3 of them
    decided "inference" and each became a step)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(_Block(), _Block())
    loss_fn = torch.compile(lambda y: (y * y).mean(), backend="aot_eager")
    penalty = torch.compile(lambda y: y.abs().mean(), backend="aot_eager")
    spread = torch.compile(lambda y: y.std(), backend="aot_eager")
    mon = StepMonitor(None, sample_memory_every_step=False)
    session = RecordingSession(
        SessionConfig(step_detection="auto", clock_sync=False), monitor=mon
    ).start()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(STEPS):
        y = model(torch.ones(4, 8))
        loss = loss_fn(y) + penalty(y) + spread(y)  # 3 forward graphs: 3 grad-free calls
        loss.backward()
        opt.step()
        opt.zero_grad()
    session.set_exit("normal", 0)
    session.stop(final_write=False)
    assert session.step_mode == "optimizer"
    assert session.steps_detected == STEPS
    assert sum(1 for s in mon._spans if s[0] == 0) == STEPS


@pytest.mark.parametrize(("mode", "style", "train"), CASES)
def test_step_detection_compiles_nothing_more(mode: str, style: str, train: bool) -> None:
    frames, results, _, _ = _run(None, style, train)
    got_frames, got_results, steps, in_effect = _run(mode, style, train)
    assert got_frames == frames  # before the fix: auto training compiled every region twice
    assert got_results == results  # bit for bit
    # training: the last optimizer step opens a step that never closes; inference: a forward each
    assert steps == STEPS and in_effect == ("optimizer" if train else "forward")

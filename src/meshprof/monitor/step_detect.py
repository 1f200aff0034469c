"""Automatic step detection inside training: which calls make a training step.

``--step-detect`` (``SessionConfig.step_detection``): "optimizer" (each step of the first
optimizer that steps ends a step), "forward" (each outermost module forward call is a step: an
inference script gets per-request latency), "auto" (optimizer steps when the script steps an
optimizer, else forward steps), "off". The script's own :func:`meshprof.mark_step` calls switch
detection off ("user"). Runs inside the user's process: never raises into training.

torch.compile: code that torch.compile traces through a module call guards on how many global
module hooks there are, so removing one later would recompile every such region (seconds to
minutes each). Hooks no longer needed are therefore removed only while torch.compile has
compiled nothing since they were installed; otherwise they stay, inert, until the session ends
(:meth:`StepDetector.remove_hooks`). torch.compile traces the hooks of nested module calls only
(an outermost call runs them outside the graph); those return before reading anything that
changes, so the mode deciding never fails a compiled graph's guards.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from meshprof.comm.recorder import CommProfiler
    from meshprof.monitor import StepMonitor


#: ``--step-detect`` / ``SessionConfig.step_detection`` values.
STEP_DETECT_MODES = ("auto", "optimizer", "forward", "off")

#: In auto mode, grad-free outermost forwards seen before any optimizer step that decide on
#: forward steps (an inference script); a training script steps its optimizer first. Above
#: PyTorch Lightning's default sanity check (2 validation batches before training), which thus
#: stays undecided and is dropped at the first optimizer step.
AUTO_FORWARD_AFTER = 3


def step_detect_mode(value: str | bool) -> str:
    """The mode of a ``step_detection`` setting (True: "optimizer", False: "off"); ValueError
    for an unknown one."""
    if value is True:
        return "optimizer"
    if value is False:
        return "off"
    if value not in STEP_DETECT_MODES:
        raise ValueError(f"{value!r}: expected one of {', '.join(STEP_DETECT_MODES)}")
    return str(value)


class StepHost(Protocol):
    """What the detector needs from its recording session (read at every call: the monitor may
    be attached after the detector starts)."""

    monitor: StepMonitor | None
    prof: CommProfiler | None
    meta: dict[str, Any]

    def report_internal_error(self, e: BaseException) -> None: ...


class StepDetector:
    """Marks steps on the host's step monitor from optimizer steps or forward calls."""

    def __init__(self, host: StepHost) -> None:
        self.host = host
        self.steps_detected = 0
        """Steps made so far (optimizer steps, or forward calls)."""
        self.mode = "off"
        """Mode in effect: "optimizer", "forward", "off", or "auto" while undecided."""
        self._primary_optimizer: int | None = None
        self._step_open = False
        self._hooks: list[Any] = []
        self._forward_hook: Any = None
        self._forward_hooks: list[Any] = []  # pre and post hooks of forward steps
        self._tls = threading.local()  # depth of module forward calls; the open forward step
        self._pending: list[tuple[int, int, int]] = []  # auto: undecided forwards (t0, t1, cpu)
        self._grad_free_forwards = 0
        self._decided_forward = False  # auto decided "forward": a training forward can undo it
        self._restarted = False  # auto: step 0 restarted at the first forward that may train
        self._grad_forward_seen = False  # auto: a forward with autograd came (a training step?)
        self._retired: list[Any] = []  # hooks no longer needed, kept for compiled code's guards
        self._frames_at_start = 0  # torch.compile's compiled frames when the hooks went in

    @property
    def monitor(self) -> StepMonitor | None:
        return self.host.monitor

    @property
    def meta(self) -> dict[str, Any]:
        return self.host.meta

    def start(self, setting: str | bool) -> None:
        """Install the hooks of ``setting``'s mode (ValueError for an unknown one)."""
        mode = step_detect_mode(setting)
        if mode == "off":
            return
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._frames_at_start = _compiled_frames()
        if mode in ("auto", "optimizer"):
            self._hooks.append(register_optimizer_step_post_hook(self._on_optimizer_step))
        if mode == "optimizer":
            self._forward_hook = register_module_forward_pre_hook(self._on_first_forward)
        else:
            self._forward_hooks = [
                register_module_forward_pre_hook(self._on_forward_pre),
                register_module_forward_hook(self._on_forward_post, always_call=True),
            ]
        self._set_mode(mode)

    def settle(self) -> None:
        """The script has ended: auto detection still undecided after forwards and no optimizer
        step makes those forwards steps (an inference script that kept autograd on)."""
        if self.mode == "auto" and self._pending:
            try:
                self._commit_forward_mode()
            except Exception as e:
                self._internal_error(e)

    def decide_inference(self) -> None:
        """The script serves (a Hugging Face ``generate()`` call, a request monitor): in auto
        mode, decide on forward steps now rather than after a few grad-free forwards (the
        forwards seen so far become steps)."""
        if self.mode == "auto":
            try:
                self._commit_forward_mode()
            except Exception as e:
                self._internal_error(e)

    def remove_hooks(self) -> None:
        """Remove every hook this detector installed (the retired ones too)."""
        for h in [*self._hooks, self._forward_hook, *self._forward_hooks, *self._retired]:
            if h is not None:
                with contextlib.suppress(Exception):
                    h.remove()
        self._hooks, self._forward_hook, self._forward_hooks = [], None, []
        self._retired = []

    def _retire(self, hooks: list[Any]) -> None:
        """Global module hooks no longer needed: removed, unless torch.compile compiled code
        since they went in (its guards count the global hooks: removing one would recompile
        it); then they stay until :meth:`remove_hooks`, inert (the mode no longer uses them)."""
        if _compiled_frames() > self._frames_at_start:
            self._retired.extend(hooks)
            return
        for h in hooks:
            with contextlib.suppress(Exception):
                h.remove()

    def _open_first_step(self) -> None:
        if self._step_open:
            return
        self._step_open = True
        if self._forward_hook is not None:
            self._retire([self._forward_hook])
            self._forward_hook = None
        if self.monitor is not None:
            self.monitor.mark_step()

    def _on_first_forward(self, module: Any, args: Any) -> None:
        """Step 0 starts at the first forward of any module (model building is not a step)."""
        if self._step_open:
            return
        try:
            self._open_first_step()
        except Exception as e:
            self._internal_error(e)

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Each step of the first optimizer that steps ends a step and starts the next one (the
        step left open after the last optimizer step is never closed: it is not a step)."""
        try:
            if self._user_marks_steps():
                return
            # With several optimizers (GANs, per-module optimizers) one of them marks the step.
            if self._primary_optimizer is None:
                self._primary_optimizer = id(optimizer)
            if id(optimizer) != self._primary_optimizer:
                return
            if self.mode in ("auto", "forward"):
                # auto: the script trains. Undecided forwards are dropped (step 0, opened at the
                # first forward, is today's optimizer step 0); forward steps already made (a
                # grad-free evaluation before training) stay, and optimizer steps follow.
                self._pending = []
                self._remove_forward_hooks()
                self._set_mode("optimizer")
            self.steps_detected += 1
            self.meta["steps_detected"] = self.steps_detected
            if not self._step_open:  # no forward seen: the step starts now, with its optimizer
                self._open_first_step()
                return
            if self.monitor is not None:
                self.monitor.mark_step()
            elif self.host.prof is not None:
                self.host.prof.step = self.steps_detected
        except Exception as e:
            self._internal_error(e)

    # forward steps: each outermost module forward call is a step ("forward" mode, and "auto"
    # once it decides the script does not train).
    def _on_forward_pre(self, module: Any, args: Any) -> None:
        """The start of a module forward call; an outermost one starts a step.

        auto: the first outermost forward opens step 0 as in optimizer mode, and outermost
        forwards are only timed (kept pending) until the script decides: its first optimizer
        step makes it a training script (pending forwards dropped: optimizer steps, exactly as
        "optimizer" mode), while the :data:`AUTO_FORWARD_AFTER`-th grad-free outermost forward
        before any optimizer step and any forward with autograd, or the end of the script, makes
        it an inference script: step 0 is dropped unrecorded, the pending forwards become steps,
        and every outermost forward from then on is a step as it runs. A forward is thus a step
        in one mode only. Grad-free forwards after a forward with autograd are part of a
        training step (a metric under ``torch.no_grad()``; the graphs torch.compile's
        AOTAutograd runs as modules, with autograd off, in the forward and the backward): they
        decide nothing."""
        tls = self._tls
        depth = getattr(tls, "depth", 0)
        tls.depth = depth + 1
        # A nested call is all that torch.compile traces of these hooks (an outermost call runs
        # them outside the compiled graph): it must read nothing that changes, or the graph's
        # guards would fail when it does.
        if depth or self.mode in ("optimizer", "off"):
            return  # nested, or retired
        try:
            if self._user_marks_steps():
                return
            if self.mode == "forward" and self._decided_forward and _grad_enabled():
                # auto took an evaluation (grad-free forwards) for an inference script, and
                # training begins: optimizer steps from this forward on (it opens the step the
                # first optimizer step ends; it is no forward step)
                self._decided_forward = False
                self._remove_forward_hooks()
                self._set_mode("optimizer")
                self._step_open = False
                self._open_first_step()
                return
            if self.mode == "auto":
                if not self._step_open:
                    self._open_first_step()
                elif self._grad_free_forwards and not self._restarted and _grad_enabled():
                    # an evaluation (grad-free forwards) before the first forward that may
                    # train: step 0 starts again here, without the evaluation
                    self._restarted = True
                    if self.monitor is not None:
                        self.monitor.discard_implicit_step()
                        self.monitor.mark_step()
                if _grad_enabled():
                    self._grad_forward_seen = True
                elif not self._grad_forward_seen:
                    self._grad_free_forwards += 1
                    if self._grad_free_forwards >= AUTO_FORWARD_AFTER:
                        self._commit_forward_mode()
            mon = self.monitor
            if self.mode == "auto":
                tls.t0, tls.cpu0 = time.perf_counter_ns(), time.thread_time_ns()
            elif self.mode == "forward" and mon is not None and not mon.in_step:
                span = mon.step()
                span.__enter__()
                tls.span = span
        except Exception as e:
            self._internal_error(e)

    def _on_forward_post(self, module: Any, args: Any, output: Any) -> None:
        """The end of a module forward call; an outermost one ends its step."""
        tls = self._tls
        depth = getattr(tls, "depth", 1) - 1
        tls.depth = max(depth, 0)
        if depth > 0:
            return  # nested (see _on_forward_pre)
        span = getattr(tls, "span", None)
        if span is None and self.mode in ("optimizer", "off"):
            return  # retired (a forward step still open closes all the same)
        try:
            if span is not None:
                tls.span = None
                span.__exit__(None, None, None)
                self.steps_detected += 1
                self.meta["steps_detected"] = self.steps_detected
            elif self.mode == "auto" and getattr(tls, "t0", None) is not None:
                t1, cpu1 = time.perf_counter_ns(), time.thread_time_ns()
                self._pending.append((tls.t0, t1, cpu1 - tls.cpu0))
            tls.t0 = None
        except Exception as e:
            self._internal_error(e)

    def _commit_forward_mode(self) -> None:
        """auto decided the script does not train: its pending forwards become steps."""
        self._set_mode("forward")
        self._decided_forward = True
        mon = self.monitor
        if mon is not None:
            mon.discard_implicit_step()
            for t0, t1, cpu in self._pending:
                mon.add_step(t0, t1, cpu)
        self.steps_detected += len(self._pending)
        self.meta["steps_detected"] = self.steps_detected
        self._pending = []

    def _remove_forward_hooks(self) -> None:
        self._retire(self._forward_hooks)
        self._forward_hooks = []

    def _user_marks_steps(self) -> bool:
        """The script called :func:`meshprof.mark_step`: its marks are the steps, detection
        stops (pending forwards are dropped)."""
        mon = self.monitor
        if mon is None or not mon.user_marks:
            return False
        if self.mode != "off":
            self._pending = []
            self._remove_forward_hooks()
            for h in self._hooks:
                with contextlib.suppress(Exception):
                    h.remove()
            self._hooks = []
            self._set_mode("off")
            self.meta["step_detection"] = "user"
        return True

    def _set_mode(self, mode: str) -> None:
        self.mode = mode
        self.meta["step_detection"] = mode

    def _internal_error(self, e: BaseException) -> None:
        with contextlib.suppress(Exception):
            self.host.report_internal_error(e)


def _compiled_frames() -> int:
    """How many frames torch.compile has compiled in this process (0 before it is first used;
    a large number when the count cannot be read, so that hooks are kept, never removed under
    compiled code)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return 0
    try:
        return int(utils.counters["frames"]["ok"])
    except Exception:
        return 1 << 62


def _grad_enabled() -> bool:
    try:
        import torch

        return bool(torch.is_grad_enabled())
    except Exception:
        return True

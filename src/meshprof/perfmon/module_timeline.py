"""Which module and phase issued a collective: forward intervals and backward start times of a
model's modules during one step (wall clock, ns), matched against a collective's start time.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any


class ModuleTimeline:
    """Forward intervals and backward start times of a model's modules during one step, to
    attribute collectives to the module and phase that issued them (by their start time).

    Forward: pre/post forward hooks give [start, end] per call. Backward: a pre-hook on the
    autograd node that produced a module's output fires when the backward of that module begins;
    a callback queued on the autograd engine marks the end of the backward pass. No full
    backward hooks are used, so the model's autograd graph (in-place ops included) is unchanged.
    """

    def __init__(self, model: Any) -> None:
        self.forward: list[tuple[str, int, int]] = []
        """(module name, start_ns, end_ns) per forward call (wall clock)."""
        self.backward: list[tuple[str, int]] = []
        """(module name, start_ns) when each module's backward began."""
        self.backward_end_ns: int | None = None
        """When the backward pass ended (an autograd engine callback)."""
        self.errors = 0
        """Hook errors swallowed (attribution may be incomplete when > 0)."""
        self._open: dict[int, list[int]] = {}
        self._handles: list[Any] = []
        self._lock = threading.Lock()
        for name, mod in model.named_modules():
            label = name or type(model).__name__
            self._handles.append(mod.register_forward_pre_hook(functools.partial(self._pre, label)))
            self._handles.append(mod.register_forward_hook(functools.partial(self._post, label)))

    def _pre(self, name: str, mod: Any, args: Any) -> None:
        self._open.setdefault(id(mod), []).append(time.time_ns())

    def _post(self, name: str, mod: Any, args: Any, out: Any) -> None:
        try:
            t1 = time.time_ns()
            starts = self._open.get(id(mod))
            t0 = starts.pop() if starts else t1
            self.forward.append((name, t0, t1))
            import torch

            seq = out if isinstance(out, (tuple, list)) else [out]
            first = next(
                (o for o in seq if isinstance(o, torch.Tensor) and o.grad_fn is not None), None
            )
            node = first.grad_fn if first is not None else None
            if node is not None:
                node.register_prehook(functools.partial(self._bw_start, name))
        except Exception:
            self.errors += 1

    def _bw_start(self, name: str, grad_outputs: Any) -> None:
        try:
            with self._lock:
                first = not self.backward
                self.backward.append((name, time.time_ns()))
            if first:
                from torch.autograd import Variable

                Variable._execution_engine.queue_callback(self._bw_end)
        except Exception:
            self.errors += 1

    def _bw_end(self) -> None:
        self.backward_end_ns = time.time_ns()

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def attribute(self, start_ns: int) -> tuple[str, str]:
        """(module, phase) of a collective issued at ``start_ns``: phase "forward", "backward"
        or "other"; module "" when none applies."""
        best: tuple[int, int, str] | None = None
        for name, t0, t1 in self.forward:
            if t0 <= start_ns <= t1:
                key = (t0, -(t1 - t0), name)
                if best is None or key[:2] > best[:2]:
                    best = key
        if best is not None:
            return best[2], "forward"
        bw = [b for b in self.backward if b[1] <= start_ns]
        end = self.backward_end_ns
        if bw and (end is None or start_ns <= end):
            latest = max(b[1] for b in bw)
            names = [n for n, t in bw if t == latest] or [bw[-1][0]]
            return max(names, key=lambda n: n.count(".")), "backward"
        return "", "other"

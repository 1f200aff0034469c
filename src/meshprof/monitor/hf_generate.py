"""Hugging Face ``generate()`` recognized as serving, unmodified (``meshprof run``).

:func:`install` wraps ``transformers.generation.utils.GenerationMixin.generate`` as soon as that
module is imported (now, or later through an import hook). Each call of the wrapped
``generate`` on a batch is a set of requests, one per batch row:

- the call is every row's arrival and schedule (``generate`` starts computing at once), its
  prompt tokens the row's attention mask (else the prompt's length);
- the forwards before the first token are steps named ``prefill``, the later ones ``decode``
  (the step monitor's :attr:`~meshprof.monitor.step_monitor.StepMonitor.step_name`, which
  automatic forward steps take), and the script is an inference script from the first call
  (automatic step detection decides on forward steps at once);
- each time ``generate`` checks its stopping criteria (after every forward that produced a
  token) every unfinished row emits one token, observed by a stopping criterion that never
  stops anything; a row finishes ``stop`` at its end-of-sequence token, and the rows still
  running when ``generate`` returns finish ``length`` (``error`` when it raised).

Beam search and several sequences per prompt (their rows are not requests) and assisted
generation are left alone. Nothing changes what ``generate`` computes: the criterion only reads
the tokens, and every error inside the integration is counted, never raised.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from meshprof.monitor.request_monitor import requests

TARGET = "transformers.generation.utils"
"""The module whose ``GenerationMixin.generate`` is wrapped."""
_WRAPPED = "__meshprof_wrapped__"

_hooks: Hooks | None = None
_lock = threading.Lock()


class Hooks:
    """What the integration tells the recording session: the monitor whose steps it names, and
    how to decide that the script serves (forward steps)."""

    def __init__(
        self, monitor: Callable[[], Any], inference: Callable[[], None] | None = None
    ) -> None:
        self.monitor = monitor
        """Returns the step monitor (or None)."""
        self.inference = inference
        """Called at each ``generate`` call (automatic step detection: forward steps)."""
        self.errors = 0
        """Errors caught inside the integration."""


def install(monitor: Callable[[], Any], inference: Callable[[], None] | None = None) -> None:
    """Wrap ``generate`` now if transformers is imported, else as soon as it is."""
    global _hooks
    with _lock:
        _hooks = Hooks(monitor, inference)
        mod = sys.modules.get(TARGET)
        if mod is not None:
            _patch(mod)
        elif not any(isinstance(f, _Finder) for f in sys.meta_path):
            sys.meta_path.insert(0, _Finder())


def uninstall() -> None:
    """Stop recording ``generate`` calls (the wrapper stays, and passes through)."""
    global _hooks
    with _lock:
        _hooks = None
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]


class _Finder(importlib.abc.MetaPathFinder):
    """Patches :data:`TARGET` right after it is executed."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                loader = spec.loader
                run = getattr(loader, "exec_module", None)
                if run is None:
                    return spec

                def exec_module(module: ModuleType, _run: Any = run) -> None:
                    _run(module)
                    with contextlib.suppress(Exception):
                        _patch(module)

                with contextlib.suppress(Exception):
                    loader.exec_module = exec_module  # type: ignore[method-assign]
                return spec
        return None


def _patch(mod: ModuleType) -> None:
    cls = getattr(mod, "GenerationMixin", None)
    original = getattr(cls, "generate", None)
    if cls is None or original is None or getattr(original, _WRAPPED, False):
        return

    @functools.wraps(original)
    def generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        hooks = _hooks
        if hooks is None:
            return original(self, *args, **kwargs)
        try:
            tracker = _Tracker.start(hooks, self, args, kwargs)
        except Exception:
            hooks.errors += 1
            tracker = None
        if tracker is None:
            return original(self, *args, **kwargs)
        try:
            out = original(self, *args, **kwargs)
        except BaseException:
            tracker.end("error")
            raise
        tracker.end("length")
        return out

    setattr(generate, _WRAPPED, True)
    cls.generate = generate


class _Tracker:
    """One ``generate`` call's rows as requests."""

    def __init__(self, hooks: Hooks, rids: list[int], eos: frozenset[int]) -> None:
        self.hooks = hooks
        self.rids = rids
        self.eos = eos
        self.live = [True] * len(rids)
        self.first = True

    @classmethod
    def start(
        cls, hooks: Hooks, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> _Tracker | None:
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        gc = kwargs.get("generation_config") or getattr(model, "generation_config", None)

        def setting(name: str, default: Any) -> Any:
            if name in kwargs:
                return kwargs[name]
            return getattr(gc, name, default) if gc is not None else default

        if (setting("num_beams", 1) or 1) > 1 or (setting("num_return_sequences", 1) or 1) > 1:
            return None
        if kwargs.get("assistant_model") is not None:
            return None
        ids = args[0] if args else kwargs.get("input_ids", kwargs.get("inputs"))
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
            return None
        mask = kwargs.get("attention_mask")
        if isinstance(mask, torch.Tensor) and mask.shape == ids.shape:
            prompts = [int(x) for x in mask.sum(dim=1).tolist()]
        else:
            prompts = [int(ids.shape[1])] * int(ids.shape[0])
        eos_setting = setting("eos_token_id", None)
        if isinstance(eos_setting, torch.Tensor):
            eos_setting = eos_setting.tolist()
        if isinstance(eos_setting, int):
            eos_setting = [eos_setting]
        eos = frozenset(int(e) for e in (eos_setting or ()))
        if hooks.inference is not None:
            hooks.inference()
        mon = hooks.monitor()
        if mon is not None:
            mon.step_name = "prefill"
        rm = requests()
        rids = [rm.begin(p) for p in prompts]
        for rid in rids:
            rm.scheduled(rid)
        tracker = cls(hooks, rids, eos)

        class _Observe(StoppingCriteria):  # type: ignore[misc]
            """Reads each new token; never stops a row."""

            def __call__(self, input_ids: Any, scores: Any, **kw: Any) -> Any:
                tracker.observe(input_ids)
                return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

        given = kwargs.get("stopping_criteria")
        kwargs["stopping_criteria"] = StoppingCriteriaList([*(given or []), _Observe()])
        return tracker

    def observe(self, input_ids: Any) -> None:
        """After a forward: a token for every unfinished row."""
        try:
            rm = requests()
            live = [rid for rid, on in zip(self.rids, self.live, strict=True) if on]
            rm.tokens(live)
            if self.first:
                self.first = False
                mon = self.hooks.monitor()
                if mon is not None:
                    mon.step_name = "decode"
            if self.eos:
                last = input_ids[:, -1].tolist()
                for i, tok in enumerate(last):
                    if self.live[i] and int(tok) in self.eos:
                        self.live[i] = False
                        rm.finish(self.rids[i], "stop")
        except Exception:
            self.hooks.errors += 1

    def end(self, reason: str) -> None:
        """``generate`` returned (or raised): the rows still running finish."""
        try:
            rm = requests()
            for rid, on in zip(self.rids, self.live, strict=True):
                if on:
                    rm.finish(rid, reason)
            mon = self.hooks.monitor()
            if mon is not None:
                mon.step_name = "step"
        except Exception:
            self.hooks.errors += 1


__all__ = ["TARGET", "Hooks", "install", "uninstall"]

"""Stage timelines for torch.distributed.pipelining.

``_PipelineStageBase.forward_one_chunk`` / ``backward_one_chunk`` / ``backward_weight_one_chunk``
are wrapped (once per process) so every micro-batch a stage computes becomes a phase span
("pp_forward", "pp_backward", "pp_backward_weight") of the active StepMonitor. The pipeline
bubble is measured from these spans.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from types import ModuleType
from typing import Any, Protocol

from meshprof.events import CHUNK_PHASES

_STAGE = "torch.distributed.pipelining.stage"
_installed = False


class PhaseOpener(Protocol):
    """What a chunk is recorded into (the active step monitor)."""

    def phase(self, name: str) -> AbstractContextManager[Any]: ...


_current: Callable[[], PhaseOpener | None] = lambda: None  # noqa: E731


def install_pipeline_hooks(current_monitor: Callable[[], PhaseOpener | None]) -> bool:
    """Wrap the stage methods: now when torch.distributed.pipelining is imported, else as soon as
    it is (an import hook: importing pipelining pulls in DTensor, dynamo and sympy, seconds that a
    script which never pipelines should not pay). Each chunk becomes a phase of the monitor
    ``current_monitor()`` returns at that moment. Returns False when it cannot be done."""
    global _installed, _current
    _current = current_monitor
    if _installed:
        return True
    mod = sys.modules.get(_STAGE)
    if mod is not None:
        return _patch(mod)
    if not any(isinstance(f, _StageImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _StageImportHook())
    return True


def _patch(stage_mod: ModuleType) -> bool:
    global _installed
    base = getattr(stage_mod, "_PipelineStageBase", None)
    if base is None:
        return False
    for method, span in CHUNK_PHASES.items():
        original = getattr(base, method, None)
        if original is None or getattr(original, "__meshprof__", False):
            continue
        setattr(base, method, _wrap(original, span))
    _installed = True
    return True


class _StageImportHook(importlib.abc.MetaPathFinder):
    """Patches the pipelining stage module right after it is first imported, then leaves."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != _STAGE:
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module: ModuleType) -> None:
            exec_module(module)
            with contextlib.suppress(Exception):  # never break the user's import
                _patch(module)

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


def _wrap(original: Any, span_name: str) -> Any:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        mon = _current()
        if mon is None:
            return original(*args, **kwargs)
        with mon.phase(span_name):
            return original(*args, **kwargs)

    wrapper.__meshprof__ = True  # type: ignore[attr-defined]
    return wrapper

"""The process-wide recorder: enable, disable, get_profiler, profile."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from meshprof.comm.recorder import CommProfiler
from meshprof.config import ProfilerConfig
from meshprof.events import CommEvent
from meshprof.stats import StatsReport

F = TypeVar("F", bound=Callable[..., Any])

_lock = threading.Lock()
_profiler: CommProfiler | None = None


def enable(config: ProfilerConfig | None = None) -> CommProfiler:
    """Install the collective recorder in this process and return the global ``CommProfiler``.

    Calling it again returns the same profiler (with ``config`` applied when given).
    Enable it at the same point of the program on every rank, so that sequence numbers agree.
    """
    global _profiler
    with _lock:
        if _profiler is not None and _profiler.installed:
            if config is not None:
                _profiler.update_config(**config.to_dict() | {"ops": config.ops})
            return _profiler
        prof = _profiler if _profiler is not None else CommProfiler(config)
        if config is not None and prof.config is not config:
            prof.update_config(**config.to_dict() | {"ops": config.ops})
        prof.install()
        _profiler = prof
        return prof


def disable() -> CommProfiler | None:
    """Remove the recorder from PyTorch (no cost afterwards). Recorded data stays readable."""
    with _lock:
        prof = _profiler
        if prof is not None:
            prof.uninstall()
        return prof


def get_profiler() -> CommProfiler | None:
    """The global profiler, or None if :func:`enable` was never called."""
    return _profiler


def mark_step(tokens: int = 0, samples: int = 0) -> bool:
    """End the current step and start the next one on the active step monitor
    (:func:`meshprof.monitor.get_monitor`), e.g. once per request of a serving loop. Under
    ``meshprof run`` the first call turns automatic step detection off: your marks are the steps.
    ``tokens``/``samples`` are credited to the step that ends. False when no monitor is active."""
    from meshprof.monitor import get_monitor

    mon = get_monitor()
    if mon is None:
        return False
    mon.user_marks += 1
    mon.mark_step(tokens, samples)
    return True


def reset() -> None:
    """Disable and forget the global profiler (tests use it)."""
    global _profiler
    disable()
    with _lock:
        _profiler = None


class profile:
    """Record the collectives issued inside a ``with`` block or a decorated function.

    ``with meshprof.profile() as window: ...`` then ``window.events()``, ``window.summary()``,
    ``window.stats()`` and ``window.export_json(path)`` see only that window. The recorder is
    enabled on entry if it was not, and disabled again on exit in that case.
    """

    def __init__(self, config: ProfilerConfig | None = None) -> None:
        self.config = config
        self.profiler: CommProfiler | None = None
        self.start_id = 0
        self.end_id: int | None = None
        self._enabled_here = False

    def __enter__(self) -> profile:
        prof = get_profiler()
        self._enabled_here = prof is None or not prof.installed
        self.profiler = enable(self.config)
        self.profiler.flush()
        self.start_id = self.profiler.log.total
        self.end_id = None
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self.profiler is not None
        self.profiler.flush()
        self.end_id = self.profiler.log.total
        if self._enabled_here:
            disable()

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    def _prof(self) -> CommProfiler:
        if self.profiler is None:
            raise RuntimeError("profile window was never entered")
        return self.profiler

    def events(self) -> list[CommEvent]:
        return self._prof().events(self.start_id, self.end_id)

    def stats(self) -> StatsReport:
        return self._prof().stats(self.start_id, self.end_id)

    def summary(self) -> str:
        return self._prof().summary(self.start_id, self.end_id)

    def export_json(self, path: str) -> Any:
        return self._prof().export_json(path, self.start_id, self.end_id)

"""The process's active recorder: the one :class:`CommProfiler` that is installed in PyTorch.

Collection code (the step monitor, clock sync, the benchmark) finds the recorder here;
:mod:`meshprof.api` (``meshprof.enable()``) decides which class it is built as.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from meshprof.comm.recorder import CommProfiler
from meshprof.config import ProfilerConfig

_lock = threading.Lock()
_profiler: CommProfiler | None = None


def enable(
    config: ProfilerConfig | None = None,
    factory: Callable[[ProfilerConfig | None], CommProfiler] = CommProfiler,
) -> CommProfiler:
    """Install the recorder and return it: the existing one (with ``config`` applied when
    given), else a new one built by ``factory``."""
    global _profiler
    with _lock:
        prof = _profiler
        if prof is not None and prof.installed:
            if config is not None:
                prof.update_config(**config.to_dict() | {"ops": config.ops})
            return prof
        if prof is None:
            prof = factory(config)
        elif config is not None and prof.config is not config:
            prof.update_config(**config.to_dict() | {"ops": config.ops})
        prof.install()
        _profiler = prof
        return prof


def disable() -> CommProfiler | None:
    """Remove the recorder from PyTorch (no cost afterwards); its data stays readable."""
    with _lock:
        prof = _profiler
        if prof is not None:
            prof.uninstall()
        return prof


def get_profiler() -> CommProfiler | None:
    """The active recorder, or None if none was ever enabled (or it was forgotten)."""
    return _profiler


def forget() -> None:
    """Disable and forget the recorder (the next :func:`enable` builds a new one)."""
    global _profiler
    disable()
    with _lock:
        _profiler = None

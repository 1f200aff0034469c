"""The public API: ``meshprof.enable()`` and friends, and the two objects users hold.

:class:`CommProfiler` and :class:`StepMonitor` are the collectors of :mod:`meshprof.comm` and
:mod:`meshprof.monitor` with the conveniences that need the layers above collection: a
profiler's ``summary()`` (rendered by :mod:`meshprof.render.stats_text`) and ``export_json()``
(written by :mod:`meshprof.rundir.json_export`), a monitor's ``analysis()``
(:mod:`meshprof.analyze.steps`) and ``report()``. Collection code never imports this module;
``meshprof.enable()`` builds the recorder as this class, so the recorder a user gets back has
them.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

from meshprof.analyze.steps import StepAnalysis, StepOptions, analyze_recorded
from meshprof.comm import active, recorder
from meshprof.config import ProfilerConfig
from meshprof.events import CommEvent
from meshprof.layout import group_label
from meshprof.monitor import request_monitor, step_monitor
from meshprof.records.rank_meta import MonitorSettings
from meshprof.render.stats_text import render_stats
from meshprof.render.step_report import render_analysis
from meshprof.rundir.json_export import write_export
from meshprof.stats import StatsReport

F = TypeVar("F", bound=Callable[..., Any])


class CommProfiler(recorder.CommProfiler):
    """The collective recorder (:class:`meshprof.comm.recorder.CommProfiler`) with its
    statistics as text and its JSON export."""

    def summary(self, since_id: int = 0, until_id: int | None = None, layout: object = None) -> str:
        """The statistics (per op, group, rank and message size) as a text table; groups are
        named by dimension and description (``layout``: the job's, see
        :func:`meshprof.layout.dimension_of`)."""
        labels = {
            g.name: group_label(g.name, g.ranks, layout, g.desc, self.mesh_names.of(g.name))
            for g in self.log.groups
        }
        return render_stats(
            self.stats(since_id, until_id),
            header=f"rank {self.ensure_rank()}",
            group_labels=labels,
        )

    def export_json(
        self, path: str | os.PathLike[str], since_id: int = 0, until_id: int | None = None
    ) -> Path:
        """Write ``{"meta", "events", "stats"}`` to ``path`` atomically; returns the path."""
        return write_export(self, path, since_id, until_id)


class StepMonitor(step_monitor.StepMonitor):
    """The step monitor (:class:`meshprof.monitor.step_monitor.StepMonitor`) with the step
    analysis of what it recorded, as data and as text."""

    def analysis(self) -> StepAnalysis:
        """Analyze the recorded steps with this monitor's settings (:meth:`to_meta`), as the
        run report analyzes its rank file (:mod:`meshprof.analyze.steps`)."""
        rec = self.recorded()
        options = StepOptions.from_meta(
            MonitorSettings.from_dict(self.to_meta()), rank=rec.rank, layout=self.layout
        )
        return analyze_recorded(
            rec.spans, rec.span_names, rec.events, rec.groups, rec.memory, options
        )

    def report(self) -> str:
        """The analysis as text."""
        return render_analysis(self.analysis())


def enable(config: ProfilerConfig | None = None) -> CommProfiler:
    """Install the collective recorder in this process and return the global ``CommProfiler``.

    Calling it again returns the same profiler (with ``config`` applied when given).
    Enable it at the same point of the program on every rank, so that sequence numbers agree.
    """
    return cast(CommProfiler, active.enable(config, factory=CommProfiler))


def disable() -> CommProfiler | None:
    """Remove the recorder from PyTorch (no cost afterwards). Recorded data stays readable."""
    return cast("CommProfiler | None", active.disable())


def get_profiler() -> CommProfiler | None:
    """The global profiler, or None if :func:`enable` was never called."""
    return cast("CommProfiler | None", active.get_profiler())


def mark_step(tokens: int = 0, samples: int = 0) -> bool:
    """End the current step and start the next one on the active step monitor
    (:func:`meshprof.monitor.get_monitor`), e.g. once per request of a serving loop. Under
    ``meshprof run`` the first call turns automatic step detection off: your marks are the steps.
    ``tokens``/``samples`` are credited to the step that ends. False when no monitor is active."""
    mon = step_monitor.get_monitor()
    if mon is None:
        return False
    mon.user_marks += 1
    mon.mark_step(tokens, samples)
    return True


def reset() -> None:
    """Disable and forget the global profiler, the active step monitor and the request monitor
    (tests use it)."""
    active.forget()
    step_monitor.forget_active()
    request_monitor.forget_request_monitor()


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

    def export_json(self, path: str) -> Path:
        return self._prof().export_json(path, self.start_id, self.end_id)

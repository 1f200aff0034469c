"""When things changed, and which steps the report analyses (:mod:`meshprof.analyze.run.events.changes`):
found by :func:`meshprof.report.analysis.analyze_run` before the other stages, since they run on
the window it chooses."""

from __future__ import annotations

from meshprof.analyze.run.events.changes import Timeline
from meshprof.report.stage import Key, ReportOptions, stage

CHANGES: Key[Timeline] = Key("changes")


@stage(CHANGES)
def changes(options: ReportOptions) -> Timeline:
    """The change points and the window of steps analysed."""
    if options.timeline is not None:
        return options.timeline
    return Timeline((), -1, -1, None, None, "")


STAGES = (changes,)

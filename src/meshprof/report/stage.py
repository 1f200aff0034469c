"""A report stage: one analysis step of the cross-rank report, with its inputs and its result.

A stage is a function whose parameters name its inputs: ``run`` (the loaded run), ``options``
(:class:`ReportOptions`) or the key of an earlier stage's result. Its return value is its
result, stored under its :class:`Key`. A *section* is a result the report keeps
(:class:`~meshprof.report.run_report.RunReport`, ``--json`` and the renderers); the others are
intermediates (the event table, the match) that the executor lets go once no later stage needs
them. :data:`meshprof.report.stages.REPORT_STAGES` lists the stages in order;
:func:`check_stages` proves every input is produced earlier, under the type the stage expects.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from meshprof.analyze.run.events.changes import Timeline
from meshprof.analyze.run.events.window import StepWindow
from meshprof.analyze.run.stragglers.stragglers import DEFAULT_THRESHOLD
from meshprof.errors import MeshprofError
from meshprof.records.serving import ServiceLevels

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Key(Generic[T]):
    """The name of a stage's result, typed: ``report[STRAGGLERS]`` is a ``StragglerReport``."""

    name: str
    """The result's name: the stages that take it as input name a parameter so, and a section
    is written under it in ``report --json``."""


@dataclass(frozen=True, slots=True)
class ReportOptions:
    """How the report is computed (``meshprof report``'s options)."""

    threshold: float = DEFAULT_THRESHOLD
    """Straggler score threshold (fraction)."""
    hta_rounding: bool = False
    """Read torch.profiler traces with HTA 0.5's whole-µs rounding."""
    bottlenecks: tuple[Any, ...] = ()
    """Extra :class:`~meshprof.analyze.steps.rules.Bottleneck` findings to show as given."""
    release_events: bool = False
    """Let each rank's raw event rows go once every stage that reads them is done with that
    rank (lower peak memory for a caller that needs only the report)."""
    workers: int = 1
    """Processes for the stages that run beside the others (the per-rank step analyses); 1:
    in this process, on a second thread."""
    device_hour_price: float | None = None
    """Price of one device-hour (any currency): a GPU-hour on a GPU job, a CPU-hour (a rank's
    process for an hour) on a CPU job; the verdict gives each cause's cost in it."""
    gpu_hour_price: float | None = None
    """The former name of ``device_hour_price`` (read when that is not given)."""
    all_causes: bool = False
    """The verdict lists every cause, also those under 2% of the step."""
    window: StepWindow | None = None
    """Analyse these steps only (``--steps``, ``--since``, ``--until``)."""
    regime: bool = True
    """Without a window: when something changed mid-run, analyse the latest regime (the steps
    since the latest change point; ``--steps all`` turns it off)."""
    slo: ServiceLevels | None = None
    """Service levels of a serving run (``--slo ttft=200ms,tpot=50ms``): the goodput counts
    the requests that met them."""
    timeline: Timeline | None = None
    """Set by :func:`meshprof.report.analysis.analyze_run`: the change points and the window
    it chose (the ``changes`` section)."""


INPUTS = frozenset({"run", "options"})
"""Parameter names every stage may take besides earlier results."""
_EXECUTOR_ARGS = frozenset({"after_rank", "only_ranks"})
"""Parameters the executor fills itself (see :attr:`Stage.reads_events`, :attr:`Stage.per_rank`)."""


@dataclass(frozen=True, slots=True)
class Stage(Generic[T]):
    """One step of the report."""

    key: Key[T]
    """What it produces."""
    compute: Callable[..., T]
    """The analysis: its parameters are named after its inputs (see the module docstring);
    ``after_rank`` is the executor's, for stages with :attr:`reads_events`."""
    section: bool = True
    """Kept in the report (else an intermediate, dropped once no later stage needs it)."""
    json: bool = True
    """A section written by ``report --json`` (under :attr:`key`)."""
    json_if_none: bool = True
    """Written as null when the result is None (else the key is left out)."""
    lead: int = 0
    """Written first in ``report --json`` when > 0, smallest first (the sections a reader needs
    before the rest: the verdict, the sample the report rests on, what it is about)."""
    beside: bool = False
    """Independent of the cross-rank stages (it takes only ``run`` and ``options``): the executor
    starts it first, on worker processes or a second thread, and waits for it where needed."""
    per_rank: bool = False
    """Its result is a dict by rank and ``compute`` takes an ``only_ranks`` keyword (the ranks to do;
    None: all): the executor may split it over worker processes."""
    reads_events: bool = False
    """It reads the ranks' raw event rows and calls ``after_rank(r)`` when done with rank r (so
    that, with :attr:`ReportOptions.release_events`, the rows can go as early as possible)."""
    release_after: bool = False
    """Hand freed heap memory back to the system after it (large temporaries)."""
    inputs: tuple[str, ...] = field(init=False)
    """Its parameters, in order (``after_rank`` excluded)."""

    def __post_init__(self) -> None:
        params = tuple(inspect.signature(self.compute).parameters)
        object.__setattr__(self, "inputs", tuple(p for p in params if p not in _EXECUTOR_ARGS))
        if self.reads_events and "after_rank" not in params:
            raise MeshprofError(f"stage {self.name}: reads_events needs an after_rank parameter")
        if self.per_rank and "only_ranks" not in params:
            raise MeshprofError(f"stage {self.name}: per_rank needs an only_ranks parameter")

    @property
    def name(self) -> str:
        return self.key.name


def stage(
    key: Key[T],
    *,
    section: bool = True,
    json: bool = True,
    json_if_none: bool = True,
    lead: int = 0,
    beside: bool = False,
    per_rank: bool = False,
    reads_events: bool = False,
    release_after: bool = False,
) -> Callable[[Callable[..., T]], Stage[T]]:
    """Decorator: the function as the :class:`Stage` producing ``key``."""

    def make(fn: Callable[..., T]) -> Stage[T]:
        return Stage(
            key,
            fn,
            section=section,
            json=json and section,
            json_if_none=json_if_none,
            lead=lead,
            beside=beside,
            per_rank=per_rank,
            reads_events=reads_events,
            release_after=release_after,
        )

    return make


def check_stages(stages: Sequence[Stage[Any]]) -> None:
    """Raise :class:`MeshprofError` unless every stage's inputs are ``run``, ``options`` or an
    earlier stage's result, no two stages share a key, and a stage that runs beside the others
    takes only ``run`` and ``options``."""
    made: set[str] = set()
    for s in stages:
        if s.name in made or s.name in INPUTS:
            raise MeshprofError(f"stage {s.name}: the key is taken")
        missing = [i for i in s.inputs if i not in made and i not in INPUTS]
        if missing:
            raise MeshprofError(f"stage {s.name}: no earlier stage produces {missing}")
        if s.beside and set(s.inputs) - INPUTS:
            raise MeshprofError(f"stage {s.name}: runs beside the others but needs {s.inputs}")
        made.add(s.name)


def result_types(stages: Iterable[Stage[Any]]) -> dict[str, Any]:
    """Each stage's declared return type (for the check that the types line up)."""
    return {s.name: typing.get_type_hints(s.compute).get("return") for s in stages}


def needed(stages: Sequence[Stage[Any]], wanted: Iterable[str]) -> list[Stage[Any]]:
    """The stages ``wanted`` depends on (themselves included), in order."""
    by_name = {s.name: s for s in stages}
    want = set(wanted)
    unknown = want - set(by_name)
    if unknown:
        raise MeshprofError(f"no report stage produces {sorted(unknown)}")
    for s in reversed(stages):
        if s.name in want:
            want.update(i for i in s.inputs if i in by_name)
    return [s for s in stages if s.name in want]

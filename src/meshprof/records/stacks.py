"""Python stacks taken from a running job (``meshprof stacks``, a capture of a rank that does not
step): the request every rank's agent answers (:class:`StacksRequest`) and each rank's answer
(:class:`RankStacks`). The files are read and written by :mod:`meshprof.rundir.stacks`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from meshprof.records.codec import CodedRecord, RecordError
from meshprof.records.members import check_ranks
from meshprof.records.names import check_id

STACKS_FORMAT = "meshprof-stacks/1"


@dataclass(frozen=True, slots=True)
class StackFrame:
    """One Python frame."""

    file: str
    """Source file."""
    line: int
    """Line number (0 when unknown)."""
    function: str
    """Function name (``<module>`` for a module's top level)."""

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


@dataclass(frozen=True, slots=True)
class ThreadStack:
    """One thread's Python stack."""

    thread_id: int
    """``threading.get_ident()`` of the thread."""
    name: str
    """The thread's name ("MainThread", "meshprof-live", ...; "" when unknown)."""
    main: bool
    """The process's main thread (the one that runs the training script)."""
    frames: tuple[StackFrame, ...]
    """Outermost frame first."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StacksRequest(CodedRecord):
    """A request for every named rank's Python stacks now (``RUN_DIR/requests/stacks-<id>.json``)."""

    format: str = STACKS_FORMAT
    """``"meshprof-stacks/1"``."""
    kind: str = "stacks"
    """``"stacks"``: what the agent reads the file as."""
    id: str
    """The request's id (a folder name: ``RUN_DIR/stacks/<id>/``)."""
    ranks: tuple[int, ...] = ()
    """The ranks asked; empty: every rank."""
    requested_ns: int
    """When it was asked (wall clock of the asking host)."""
    timeout_s: float = 5.0
    """The asker waits this long; a rank that sees the request later does not answer."""

    def __post_init__(self) -> None:
        """A request read from a file is checked here: its id is a name (it becomes a folder)."""
        check_id(self.id, "stacks request.id")
        check_ranks(self.ranks, "stacks request.ranks")
        if not 0 < self.timeout_s <= 3600.0:  # (NaN fails too)
            raise RecordError(f"stacks request.timeout_s: {self.timeout_s}, expected 0 to 3600 s")

    JSON_WHAT: ClassVar[str] = "stacks request"


@dataclass(frozen=True, slots=True, kw_only=True)
class RankStacks(CodedRecord):
    """One rank's answer: every thread's stack (``RUN_DIR/stacks/<id>/rank{R}.json``, also a
    capture's ``where`` when the rank did not reach a step boundary)."""

    format: str = STACKS_FORMAT
    """``"meshprof-stacks/1"``."""
    id: str = ""
    """The request answered ("" when taken for another reason)."""
    rank: int
    """Global rank."""
    taken_ns: int
    """When the stacks were taken (wall clock of the rank's host)."""
    pid: int = -1
    """The rank's process id."""
    hostname: str = ""
    """The rank's host."""
    step: int = -1
    """The step the rank was in (-1: unknown)."""
    threads: tuple[ThreadStack, ...] = ()
    """Every thread's stack, the main thread first."""

    def __post_init__(self) -> None:
        if self.id:
            check_id(self.id, "rank stacks.id")
        check_ranks((self.rank,), "rank stacks.rank")

    @property
    def main(self) -> ThreadStack | None:
        """The main thread's stack (None when it was not seen)."""
        return next((t for t in self.threads if t.main), None)

    JSON_WHAT: ClassVar[str] = "rank stacks"


__all__ = ["STACKS_FORMAT", "RankStacks", "StackFrame", "StacksRequest", "ThreadStack"]

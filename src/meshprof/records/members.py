"""A process group's members, described compactly: the world group and every DeviceMesh
dimension's group are arithmetic progressions of global ranks, written as
``{"start": s, "stop": e, "step": k}`` (``stop`` exclusive, as Python's ``range``); only an
irregular group (``new_group`` with arbitrary ranks) lists its members, and so does a group of
at most :data:`LISTED_UP_TO` (no longer that way). A rank's meta is then
O(groups) bytes whatever the world size: at 16,384 ranks the explicit lists were 268 million
numbers across the run, at 100,000 ten billion (issue 31).

Files of earlier versions list every group's members; they read as the same :class:`Members`
(a list that is a progression becomes one).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

from meshprof.records.codec import RecordError

_RANGE_KEYS = ("start", "stop", "step")
MAX_WORLD_SIZE = 1 << 24
"""The most ranks a job may have (16,777,216): a world size or rank past it in a file is damage,
not a job (the largest jobs today have a few hundred thousand ranks). It keeps every number a
file claims about ranks in int32 and ``len()`` range."""
LISTED_UP_TO = 8
"""Groups of up to this many members are written as their list even when they are a
progression: ``[8, 9, 10, 11]`` is no longer than ``{"start": 8, "stop": 12, "step": 1}``."""


class Members(Sequence[int]):
    """Global ranks of a group's members, in group-rank order: a ``range`` when they are an
    arithmetic progression, else a tuple. A sequence of ints (``len``, indexing, iteration,
    ``in``), equal to any sequence of the same ranks (``Members.of([0, 1]) == [0, 1]``).
    Never expanded unless iterated: the world group of 100,000 ranks is three numbers."""

    __slots__ = ("_seq",)
    _seq: range | tuple[int, ...]

    def __init__(self, ranks: Iterable[int] = ()) -> None:
        self._seq = _compact(ranks)

    @classmethod
    def of(cls, ranks: Iterable[int] | Members) -> Members:
        """``ranks`` as :class:`Members` (itself when it already is)."""
        return ranks if isinstance(ranks, Members) else cls(ranks)

    @classmethod
    def span(cls, start: int, stop: int, step: int = 1) -> Members:
        """The progression ``start, start + step, ...`` below ``stop`` (``range``'s rule)."""
        m = cls.__new__(cls)
        m._seq = _canonical(range(start, stop, step))
        return m

    @property
    def as_range(self) -> range | None:
        """The members as a ``range`` when they are a progression, else None."""
        return self._seq if isinstance(self._seq, range) else None

    # -- JSON ---------------------------------------------------------------------------------
    def to_json_data(self) -> dict[str, int] | list[int]:
        """The JSON value: ``{"start", "stop", "step"}`` for a progression of more than
        :data:`LISTED_UP_TO` members, else the list (as short, and as files of earlier
        versions wrote it)."""
        r = self._seq
        if isinstance(r, range) and len(r) > LISTED_UP_TO:
            return {"start": r.start, "stop": r.stop, "step": r.step}
        return list(r)

    @classmethod
    def from_json_data(cls, data: Any, where: str) -> Members:
        """The codec's hook: a ``{"start", "stop", "step"}`` object or a list of ranks."""
        if isinstance(data, Members):
            return data
        if isinstance(data, dict):
            if set(data) - {*_RANGE_KEYS} or "stop" not in data:
                raise RecordError(
                    f"{where}: expected {{start, stop, step}} or a list of ranks, got "
                    f"{sorted(data)}"
                )
            vals = [data.get("start", 0), data["stop"], data.get("step", 1)]
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
                raise RecordError(f"{where}: start, stop and step must be integers")
            if vals[2] == 0:
                raise RecordError(f"{where}: step must not be 0")
            if (
                not all(-1 <= v <= MAX_WORLD_SIZE for v in vals[:2])
                or abs(vals[2]) > MAX_WORLD_SIZE
            ):
                raise RecordError(f"{where}: ranks outside 0 to {MAX_WORLD_SIZE:,}")
            return cls.span(*vals)
        if isinstance(data, list | tuple | range):
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in data):
                raise RecordError(f"{where}: expected a list of integer ranks")
            check_ranks(data, where)
            return cls(data)
        raise RecordError(f"{where}: expected {{start, stop, step}} or a list of ranks")

    # -- sequence -----------------------------------------------------------------------------
    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[int]: ...
    def __getitem__(self, i: int | slice) -> int | Sequence[int]:
        return self._seq[i]

    def __len__(self) -> int:
        return len(self._seq)

    def __iter__(self) -> Iterator[int]:
        return iter(self._seq)

    def __contains__(self, x: object) -> bool:
        return x in self._seq

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Members):
            return self._seq == other._seq
        if isinstance(other, list | tuple | range):
            return len(other) == len(self._seq) and all(
                a == b for a, b in zip(self._seq, other, strict=True)
            )
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._seq)

    def __repr__(self) -> str:
        r = self._seq
        if isinstance(r, range):
            return f"Members.span({r.start}, {r.stop}, {r.step})"
        return f"Members({list(r)!r})"


MAX_NAMED_RANKS = 1 << 17
"""The most ranks a live view or a hang diagnosis enumerates from a claimed world size (131,072:
past the largest jobs meshprof is measured on), to name the ranks that did not answer: a live
record or a dump claiming 16 million ranks costs this, not one entry per claimed rank."""


def named_world(world: int) -> range:
    """The ranks of a claimed ``world`` that may be enumerated one by one
    (``range(min(world, MAX_NAMED_RANKS))``)."""
    return range(max(0, min(int(world), MAX_NAMED_RANKS)))


def check_ranks(ranks: Iterable[object], where: str) -> None:
    """:class:`RecordError` naming ``where`` unless every one of ``ranks`` is an int rank in
    [0, :data:`MAX_WORLD_SIZE`)."""
    for r in ranks:
        if not (isinstance(r, int) and not isinstance(r, bool) and 0 <= r < MAX_WORLD_SIZE):
            shown = repr(r) if len(repr(r)) <= 40 else repr(r)[:37] + "..."
            raise RecordError(f"{where}: {shown} is not a rank (0 to {MAX_WORLD_SIZE - 1:,})")


def check_world(value: object, where: str, low: int = -1) -> None:
    """:class:`RecordError` naming ``where`` unless ``value`` is None or an int in [``low``,
    :data:`MAX_WORLD_SIZE`] (a world size, a rank, a count of ranks or nodes read from a file:
    -1 is "unknown")."""
    if value is None or (
        isinstance(value, int) and not isinstance(value, bool) and low <= value <= MAX_WORLD_SIZE
    ):
        return
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    raise RecordError(f"{where}: {shown} is not a number of ranks ({low} to {MAX_WORLD_SIZE:,})")


def _canonical(r: range) -> range:
    """One ``range`` per set of members (``range(0, 10, 3)`` and ``range(0, 12, 3)`` are
    equal ranges but differ in ``stop``): stop = start + len × step, step 1 below two."""
    n = len(r)
    if n == 0:
        return range(0)
    if n == 1:
        return range(r.start, r.start + 1)
    return range(r.start, r.start + n * r.step, r.step)


def _compact(ranks: Iterable[int]) -> range | tuple[int, ...]:
    """A range when ``ranks`` is an arithmetic progression (with a non-zero step), else the
    tuple of them. O(n) once, in C (one tuple comparison)."""
    if isinstance(ranks, range):
        return _canonical(ranks)
    t = tuple(int(x) for x in ranks)
    n = len(t)
    if n < 2:
        return _canonical(range(t[0], t[0] + 1)) if n else range(0)
    step = t[1] - t[0]
    if step != 0 and t[-1] == t[0] + (n - 1) * step:
        r = range(t[0], t[0] + n * step, step)
        if tuple(r) == t:
            return r
    return t


__all__ = [
    "LISTED_UP_TO",
    "MAX_NAMED_RANKS",
    "MAX_WORLD_SIZE",
    "Members",
    "check_ranks",
    "check_world",
    "named_world",
]

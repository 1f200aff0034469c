"""The ranks of a run that were not analysed, and why, in memory bounded by what is present.

A manifest (or a rank's meta, or a node record) claims a world size; the ranks it claims and
the run directory does not hold are missing. The claim is input like any other: a manifest of
``world_size`` 10⁸ beside four rank folders must not cost one entry per missing rank (that was
15–20 GB, issue 39). :class:`RankProblems` keeps one entry per rank whose file is there but
could not be used (bounded by the files present) and the missing ranks as spans of consecutive
ranks (bounded by the ranks present: the gaps between them), while reading as the mapping
``rank -> why`` it always was (``problems.get(r)``, ``r in problems``, ``len(problems)``).

Walk it with :meth:`RankProblems.entries` (a span is one entry); iterating it rank by rank costs
the number of ranks it holds, which only a caller that bounded that number may do."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

MISSING = "missing"
"""A span kind: no file for these ranks in the directories read."""
ELSEWHERE = "elsewhere"
"""A span kind: the ranks ran on a node whose directory was not read."""


def rank_reason(kind: str, rank: int) -> str:
    """Why rank ``rank`` of a span of ``kind`` was not analysed, in words."""
    if kind == ELSEWHERE:
        return (
            f"rank{rank:05d}: on another node, whose run directory was not read "
            "(meshprof report DIR1 DIR2 ..., or meshprof collect)"
        )
    return f"rank{rank:05d}.npz: missing"


@dataclass(frozen=True, slots=True)
class RankSpan:
    """Consecutive ranks missing for one reason."""

    first: int
    """The first rank."""
    last: int
    """The last rank (inclusive)."""
    kind: str
    """:data:`MISSING` or :data:`ELSEWHERE`."""

    @property
    def count(self) -> int:
        """How many ranks."""
        return self.last - self.first + 1

    @property
    def reason(self) -> str:
        """Why, in words (the rank's own reason for a span of one)."""
        if self.count == 1:
            return rank_reason(self.kind, self.first)
        if self.kind == ELSEWHERE:
            return (
                f"rank{self.first:05d} … rank{self.last:05d} ({self.count:,} ranks): on other "
                "nodes, whose run directories were not read (meshprof report DIR1 DIR2 ..., or "
                "meshprof collect)"
            )
        return f"rank{self.first:05d} … rank{self.last:05d} ({self.count:,} ranks): missing"


@dataclass(frozen=True, slots=True)
class ProblemEntry:
    """One entry of :meth:`RankProblems.entries`: a rank, or a span of ranks."""

    first: int
    """The (first) rank."""
    last: int
    """The last rank (``first`` for one rank)."""
    reason: str
    """Why, in words."""


class RankProblems(Mapping[int, str]):
    """rank -> why it was not analysed (see the module docstring). Immutable."""

    __slots__ = ("_each", "_firsts", "_len", "_spans")

    def __init__(
        self, each: Mapping[int, str] | None = None, spans: Iterable[RankSpan] = ()
    ) -> None:
        """``each``: ranks with their own reason (a damaged file); ``spans``: missing ranks,
        disjoint from ``each`` and from one another."""
        self._each = dict(sorted((each or {}).items()))
        self._spans = tuple(sorted(spans, key=lambda s: s.first))
        self._firsts = [s.first for s in self._spans]
        self._len = len(self._each) + sum(s.count for s in self._spans)

    @classmethod
    def of(cls, problems: Mapping[int, str]) -> RankProblems:
        """``problems`` as :class:`RankProblems` (itself when it already is)."""
        return problems if isinstance(problems, RankProblems) else cls(problems)

    @property
    def each(self) -> Mapping[int, str]:
        """The ranks with a reason of their own (files present but unusable), by rank."""
        return self._each

    @property
    def spans(self) -> tuple[RankSpan, ...]:
        """The missing ranks, by first rank."""
        return self._spans

    def span_of(self, rank: int) -> RankSpan | None:
        """The span that holds ``rank`` (None when none does)."""
        i = bisect.bisect_right(self._firsts, rank) - 1
        if i >= 0 and self._spans[i].first <= rank <= self._spans[i].last:
            return self._spans[i]
        return None

    def entries(self) -> Iterator[ProblemEntry]:
        """Every rank with its own reason and every span, by rank: O(entries), not O(ranks)."""
        each = iter(self._each.items())
        spans = iter(self._spans)
        e, s = next(each, None), next(spans, None)
        while e is not None or s is not None:
            if s is None or (e is not None and e[0] < s.first):
                assert e is not None
                yield ProblemEntry(e[0], e[0], e[1])
                e = next(each, None)
            else:
                yield ProblemEntry(s.first, s.last, s.reason)
                s = next(spans, None)

    def ranks_text(self, limit: int = 8) -> str:
        """The ranks in a few words: ``0, 3, 5–99,999,999`` (at most ``limit`` entries)."""
        parts = []
        for i, en in enumerate(self.entries()):
            if i == limit:
                parts.append("…")
                break
            parts.append(str(en.first) if en.first == en.last else f"{en.first}–{en.last:,}")
        return ", ".join(parts)

    # -- the mapping --------------------------------------------------------------------------
    def __getitem__(self, rank: int) -> str:
        got = self._each.get(rank)
        if got is not None:
            return got
        span = self.span_of(rank) if isinstance(rank, int) else None
        if span is None:
            raise KeyError(rank)
        return rank_reason(span.kind, rank)

    def __contains__(self, rank: object) -> bool:
        return rank in self._each or (isinstance(rank, int) and self.span_of(rank) is not None)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[int]:
        for en in self.entries():
            yield from range(en.first, en.last + 1)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RankProblems):
            return self._each == other._each and self._spans == other._spans
        if isinstance(other, Mapping):
            return len(self) == len(other) and all(
                k in self and self[k] == v for k, v in other.items()
            )
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RankProblems({self._each!r}, spans={list(self._spans)!r})"


def missing_spans(world: int, present: Iterable[int]) -> list[RankSpan]:
    """The ranks of ``range(world)`` not in ``present``, as :data:`MISSING` spans
    (O(len(present)), whatever ``world``)."""
    out: list[RankSpan] = []
    nxt = 0
    for r in sorted(set(present)):
        if r >= world:
            break
        if r > nxt:
            out.append(RankSpan(nxt, r - 1, MISSING))
        nxt = max(nxt, r + 1)
    if nxt < world:
        out.append(RankSpan(nxt, world - 1, MISSING))
    return out


def split_elsewhere(spans: list[RankSpan], listed: Iterable[int]) -> list[RankSpan]:
    """``spans`` with every rank not in ``listed`` (the ranks the node records read list)
    marked :data:`ELSEWHERE`: it ran on a node whose directory was not read. O(spans +
    listed)."""
    keep = sorted(set(listed))
    out: list[RankSpan] = []
    for s in spans:
        lo = bisect.bisect_left(keep, s.first)
        hi = bisect.bisect_right(keep, s.last)
        start = s.first
        for r in keep[lo:hi]:
            if r > start:
                out.append(RankSpan(start, r - 1, ELSEWHERE))
            out.append(RankSpan(r, r, MISSING))
            start = r + 1
        if start <= s.last:
            out.append(RankSpan(start, s.last, ELSEWHERE))
    return _merged(out)


def _merged(spans: list[RankSpan]) -> list[RankSpan]:
    out: list[RankSpan] = []
    for s in spans:
        if out and out[-1].kind == s.kind and out[-1].last + 1 == s.first:
            out[-1] = RankSpan(out[-1].first, s.last, s.kind)
        else:
            out.append(s)
    return out


__all__ = [
    "ELSEWHERE",
    "MISSING",
    "ProblemEntry",
    "RankProblems",
    "RankSpan",
    "missing_spans",
    "rank_reason",
    "split_elsewhere",
]

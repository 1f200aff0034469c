"""The cross-rank run report: the sections of :data:`~meshprof.report.stages.REPORT_STAGES`, in
stage order, each a typed value read with its key (``report[STRAGGLERS]``).

Its JSON (``meshprof report --json``) is derived from the sections' types by
:func:`meshprof.records.codec.to_json`: one key per section written to JSON, the leading
sections first (``Stage.lead``), the others in stage order.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TextIO, TypeVar

from meshprof.gc_pause import paused_gc
from meshprof.records.codec import to_json
from meshprof.report.stage import Key, Stage

T = TypeVar("T")

RANK_ANALYSES_KEY = "rank_analyses"
"""The JSON key of every rank's step analysis (:data:`meshprof.report.stages.RANK_ANALYSES`)."""
PER_STEP_JSON_RANKS = 1024
"""``meshprof report --json`` writes each rank's per-step rows up to this many ranks (``--full``:
always)."""


class RunReport:
    """The report's sections by key (read-only)."""

    __slots__ = ("_json", "_values")

    def __init__(self, values: Mapping[str, Any], stages: Sequence[Stage[Any]]) -> None:
        self._values = dict(values)
        written = [
            s
            for s in stages
            if s.json
            and s.name in self._values
            and (s.json_if_none or self._values[s.name] is not None)
        ]
        # the leading sections first (by their rank), then the others, each in stage order
        self._json = tuple(s.name for s in sorted(written, key=lambda s: s.lead or 1 << 30))

    def __getitem__(self, key: Key[T]) -> T:
        """The section ``key`` (KeyError when the report has none)."""
        return self._values[key.name]  # type: ignore[no-any-return]

    def get(self, key: Key[T]) -> T | None:
        """The section ``key``, None when the report has none."""
        return self._values.get(key.name)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, Key) and key.name in self._values

    def names(self) -> tuple[str, ...]:
        """The sections' keys, in stage order."""
        return tuple(self._values)

    def json_sections(self) -> Iterator[tuple[str, Any]]:
        """(key, value) of every section ``--json`` writes, in order."""
        for name in self._json:
            yield name, self._values[name]

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready report (the ``--json`` object)."""
        return {name: to_json(v) for name, v in self.json_sections()}

    @paused_gc()
    def write_json(self, out: TextIO, per_step_ranks: int | None = None) -> None:
        """Write ``json.dumps(self.to_dict(), default=str)``, byte for byte, one section (and one
        item of a list section) at a time: the whole dict of a report at thousands of ranks
        holds millions of objects (~100 MiB at 4,096 ranks), more than the rest of the report.

        ``per_step_ranks``: above this many rank analyses their ``per_step`` rows (one per rank
        and step: 3/4 of the JSON at 16,384 ranks) are left out, and a last key ``omitted`` says
        so and where they are; None: always written."""
        out.write("{")
        trim = (
            per_step_ranks is not None and len(self.get_named(RANK_ANALYSES_KEY)) > per_step_ranks
        )
        for i, (name, value) in enumerate(self.json_sections()):
            out.write((", " if i else "") + json.dumps(name) + ": ")
            if isinstance(value, tuple | list):
                out.write("[")
                for j, item in enumerate(value):
                    data = to_json(item)
                    if trim and name == RANK_ANALYSES_KEY and isinstance(data, dict):
                        data.pop("per_step", None)
                    out.write((", " if j else "") + json.dumps(data, default=str))
                out.write("]")
            else:
                out.write(json.dumps(to_json(value), default=str))
        if trim:
            n = len(self.get_named(RANK_ANALYSES_KEY))
            note = (
                f"rank_analyses[].per_step: {n:,} ranks, more than {per_step_ranks:,}; "
                "meshprof report --json --full writes them, meshprof query DIR --rank R has "
                "each rank's steps"
            )
            out.write(", " + json.dumps("omitted") + ": " + json.dumps([note]))
        out.write("}")

    def get_named(self, name: str) -> Any:
        """The section written under the JSON key ``name`` (an empty tuple when absent)."""
        return self._values.get(name, ())

"""Reading a recorder's JSON export (``CommProfiler.export_json``: ``{"meta", "events",
"stats"}``) back, with clear errors (``meshprof summary FILE`` uses it)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from meshprof.errors import MeshprofError
from meshprof.events import CommEvent
from meshprof.records.codec import RecordError
from meshprof.records.rank_meta import RankMeta
from meshprof.rundir.atomic import atomic_write_text
from meshprof.stats import OpStats, StatsReport

if TYPE_CHECKING:
    from meshprof.comm.recorder import CommProfiler


@dataclass(frozen=True, slots=True)
class Export:
    """A loaded export file."""

    meta: RankMeta
    """Who recorded (the fields of a rank file's meta that the recorder knows)."""
    events: list[CommEvent]
    """The recorded events."""
    stats: StatsReport
    """The statistics at the export."""


def _stats_from_dict(d: dict[str, Any]) -> StatsReport:
    def rows(key: str) -> list[OpStats]:
        out = []
        for r in d.get(key, []):
            r = {
                k: (
                    float("nan")
                    if v is None and k in ("mean_ns", "p50_ns", "p95_ns", "p99_ns")
                    else v
                )
                for k, v in r.items()
            }
            out.append(OpStats(**r))
        return out

    return StatsReport(
        by_op=rows("by_op"),
        by_rank=rows("by_rank"),
        by_group=rows("by_group"),
        by_size=rows("by_size"),
        percentiles=str(d.get("percentiles", "exact")),
        sketch_relative_error=float(d.get("sketch_relative_error", 0.01)),
    )


def load_export(path: Path) -> Export:
    """Load and validate an export file; any problem raises :class:`MeshprofError`."""
    if not path.exists():
        raise MeshprofError(f"{path}: no such file")
    if path.is_dir():
        raise MeshprofError(
            f"{path}: is a directory, expected a JSON file from export_json() (for a run directory use `meshprof report`)"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise MeshprofError(f"{path}: not a text file ({e.reason})") from None
    except json.JSONDecodeError as e:
        raise MeshprofError(
            f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})"
        ) from None
    if not isinstance(data, dict) or not {"meta", "events", "stats"} <= set(data):
        raise MeshprofError(
            f"{path}: not a meshprof export (expected an object with 'meta', 'events' and 'stats')"
        )
    try:
        events = [CommEvent.from_dict(e) for e in data["events"]]
        stats = _stats_from_dict(data["stats"])
    except (TypeError, KeyError, ValueError, AttributeError) as e:
        raise MeshprofError(
            f"{path}: malformed meshprof export ({type(e).__name__}: {e})"
        ) from None
    if not isinstance(data["meta"], dict):
        raise MeshprofError(f"{path}: malformed meshprof export ('meta' is not an object)")
    try:
        meta = RankMeta.from_dict(data["meta"], "meta")
    except RecordError as e:
        raise MeshprofError(f"{path}: malformed meshprof export ({e})") from None
    return Export(meta=meta, events=events, stats=stats)


def write_export(
    prof: CommProfiler,
    path: str | os.PathLike[str],
    since_id: int = 0,
    until_id: int | None = None,
) -> Path:
    """Write the recorder's ``{"meta", "events", "stats"}`` (events with ids in
    [since_id, until_id)) to ``path`` atomically; returns the path."""
    data = prof.to_json_dict(since_id, until_id)
    return atomic_write_text(Path(path), json.dumps(data, default=_json_default))


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    return str(o)

"""The answers to a stacks request (:mod:`meshprof.rundir.requests`): ``RUN_DIR/stacks/<id>/
rank{R:05d}.json``, one :class:`~meshprof.records.stacks.RankStacks` per rank that answered."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from meshprof.records.codec import RecordError
from meshprof.records.stacks import RankStacks
from meshprof.rundir.confine import confined_write
from meshprof.rundir.json_file import read_json

STACKS_DIR = "stacks"
_RANK_RE = re.compile(r"^rank(\d+)\.json$")


def stacks_dir(run_dir: str | os.PathLike[str], request_id: str) -> Path:
    """``RUN_DIR/stacks/<id>``."""
    return Path(run_dir) / STACKS_DIR / request_id


def rank_stacks_path(run_dir: str | os.PathLike[str], request_id: str, rank: int) -> Path:
    """Where rank ``rank`` answers the request ``request_id``."""
    return stacks_dir(run_dir, request_id) / f"rank{int(rank):05d}.json"


def write_rank_stacks(run_dir: str | os.PathLike[str], stacks: RankStacks) -> Path:
    """Write a rank's answer atomically, inside the run directory whatever links it holds
    (:mod:`meshprof.rundir.confine`)."""
    data = json.dumps(stacks.to_dict()).encode("utf-8")
    name = rank_stacks_path(run_dir, stacks.id, stacks.rank).name
    return confined_write(run_dir, (STACKS_DIR, stacks.id), name, data)


def read_rank_stacks(run_dir: str | os.PathLike[str], request_id: str) -> dict[int, RankStacks]:
    """The answers so far, by rank (unreadable files are skipped: a reader may race a write)."""
    out: dict[int, RankStacks] = {}
    d = stacks_dir(run_dir, request_id)
    try:
        names = os.listdir(d)
    except OSError:
        return out
    for name in names:
        m = _RANK_RE.match(name)
        if not m:
            continue
        try:
            rec = RankStacks.from_dict(read_json(d / name, 16 << 20))
        except (OSError, ValueError, TypeError, RecordError):
            continue
        out[rec.rank] = rec
    return dict(sorted(out.items()))


__all__ = ["STACKS_DIR", "rank_stacks_path", "read_rank_stacks", "stacks_dir", "write_rank_stacks"]

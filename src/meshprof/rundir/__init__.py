"""The run directory: the on-disk format of a recorded run (see :mod:`meshprof.rundir.schema`).

- :mod:`~meshprof.rundir.schema`: file names, format versions, :class:`RankMeta`,
  :class:`Manifest`, the layout resolver, the device a rank computed on;
- :mod:`~meshprof.rundir.atomic`: atomic file writes;
- :mod:`~meshprof.rundir.rankfile`: one rank's ``.npz`` file (:class:`RankData`);
- :mod:`~meshprof.rundir.manifest`: ``manifest.json`` and the per-node records;
- :mod:`~meshprof.rundir.loader`: :func:`load_run` -> :class:`LoadedRun`;
- :mod:`~meshprof.rundir.writer`: :class:`RankWriter`, the in-training periodic writer;
- :mod:`~meshprof.rundir.json_export`: reading a recorder's JSON export back;
- :mod:`~meshprof.rundir.hang_dumps`: reading the watchdog's and Flight Recorder's hang dumps.

The names below are the package's public interface (the writer, which needs the recorder, is
imported from its module).
"""

from __future__ import annotations

from meshprof.rundir.loader import LoadedRun, load_run
from meshprof.rundir.manifest import write_manifest
from meshprof.rundir.rankfile import RankData, load_rank_file, write_rank_file
from meshprof.rundir.schema import (
    Manifest,
    RankMeta,
    device_kind,
    job_device_kind,
    rank_file,
    resolve_layout,
)

__all__ = [
    "LoadedRun",
    "Manifest",
    "RankData",
    "RankMeta",
    "device_kind",
    "job_device_kind",
    "load_rank_file",
    "load_run",
    "rank_file",
    "resolve_layout",
    "write_manifest",
    "write_rank_file",
]

"""The run directory's schema: where each file is, and the typed JSON records it holds.

::

    DIR/manifest.json          Manifest: written by the launcher (or rank 0 of the decorator /
                               the demo); with several nodes each launcher rewrites it merged with
                               every node record
    DIR/nodes/NODE.json        one record per launcher (node), merged into the manifest on load
    DIR/rank00000/ ...         one folder per rank: append-only segments + RankMeta as JSON
                               (:mod:`meshprof.rundir.segments`)
    DIR/rank00000.npz ...      one file per rank (the format before segments; still read)
    DIR/traces/                torch.profiler traces (optional)
    DIR/hang/                  watchdog dumps (optional)

:class:`RankMeta` (a rank file's ``meta``) and :class:`Manifest` (``manifest.json``) are frozen
records with ``from_dict`` / ``to_dict``: every key meshprof knows is a typed attribute, keys it
does not know are kept in ``extra``, and the key order read is kept, so
``Manifest.from_dict(d).to_dict() == d`` key for key (a file rewritten by this version loses
nothing a newer one added). ``record["key"]`` reads the JSON value under an on-disk key.

:func:`resolve_layout` is the one place that decides a rank's dp/tp/pp layout, and
:func:`device_kind` what a rank computed on.
Times are integers in ns since the epoch (``*_ns``) unless a name says otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from meshprof.layout import Layout, names_refute_pure_dp
from meshprof.records.json_record import JsonRecord
from meshprof.records.manifest import RUN_FORMAT, Manifest
from meshprof.records.members import MAX_WORLD_SIZE
from meshprof.records.rank_meta import RANK_FORMAT, ExitStatus, RankMeta

MANIFEST = "manifest.json"
NODES_DIR = "nodes"
HANG_DIR = "hang"
TRACES_DIR = "traces"
RANK_FILE_RE = re.compile(r"^rank(\d+)\.npz$")
"""Names of rank files; group 1 is the rank."""
RANK_DIR_RE = re.compile(r"^rank(\d+)$")
"""Names of rank folders (segments); group 1 is the rank."""
_RANK_DIGITS = 9
"""A rank in a name has at most this many digits (``rank99999999999999999999`` is no rank:
names past :data:`~meshprof.records.members.MAX_WORLD_SIZE` are not a rank's)."""


def rank_file(run_dir: str | Path, rank: int) -> Path:
    """Where rank ``rank``'s file is: ``DIR/rank00003.npz``."""
    return Path(run_dir) / f"rank{rank:05d}.npz"


def rank_dir(run_dir: str | Path, rank: int) -> Path:
    """Where rank ``rank`` keeps its segments: ``DIR/rank00003/``."""
    return Path(run_dir) / f"rank{rank:05d}"


def rank_entries(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Every rank's data in ``run_dir``, by rank: its folder of segments, else its rank file
    (an empty list when the directory cannot be listed)."""
    found: dict[int, Path] = {}
    try:
        entries = sorted(Path(run_dir).iterdir())
    except OSError:
        return []
    for p in entries:
        folder = RANK_DIR_RE.match(p.name)
        m = folder or RANK_FILE_RE.match(p.name)
        r = rank_of_name(m.group(1)) if m is not None else None
        if r is None:
            continue
        if folder is not None and p.is_dir():
            found[r] = p
        elif folder is None:
            found.setdefault(r, p)
    return sorted(found.items())


def rank_of_name(digits: str) -> int | None:
    """The rank a file name's digits say (``"00003"`` -> 3); None for a number no rank can
    be (past :data:`~meshprof.records.members.MAX_WORLD_SIZE`)."""
    if len(digits) > _RANK_DIGITS or int(digits) >= MAX_WORLD_SIZE:
        return None
    return int(digits)


def launcher_exit(
    exits: dict[int, ExitStatus] | None,
    pids: dict[int, int] | None,
    rank: int,
    meta_pid: int | None,
) -> ExitStatus | None:
    """The exit the launcher saw for ``rank`` (``exits``) when it is the exit of the process a
    rank's record is from (``meta_pid``): None when none was seen, or when ``pids`` (rank -> the
    pid the exit belongs to) names another process (a restarted worker is not given its
    predecessor's exit)."""
    pid = (pids or {}).get(rank)
    if pid is not None and meta_pid is not None and pid != meta_pid:
        return None
    return (exits or {}).get(rank)


def node_record_path(run_dir: str | Path, node_id: str) -> Path:
    """Where the launcher ``node_id`` keeps its node record (``DIR/nodes/<safe id>.json``)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", node_id) or "node"
    return Path(run_dir) / NODES_DIR / f"{safe}.json"


def resolve_layout(meta: RankMeta | None, manifest: Manifest | None = None) -> Layout | None:
    """The dp/tp/pp layout a rank ran with: its step monitor's, else its meta's, else the
    manifest's; None when none says.

    A layout nobody gave (``meshprof run`` without ``--layout`` assumed pure data parallelism:
    the meta's ``layout_assumed``, and the monitor holds that same layout) comes back with
    :attr:`~meshprof.layout.Layout.assumed` set: the job's DeviceMesh names then name the
    groups they cover. When those names show a dimension other than data parallelism over
    several ranks, the assumption is known to be wrong and None comes back (no layout)."""
    mon = meta.monitor if meta is not None else None
    given = (
        (mon.layout if mon is not None else None)
        or (meta.layout if meta is not None else None)
        or (manifest.layout if manifest is not None else None)
    )
    try:
        lay = Layout.from_any(given)
    except (TypeError, ValueError):
        return None
    if lay is None or meta is None or meta.layout_assumed is not True:
        return lay
    try:
        if Layout.from_any(meta.layout) != lay:
            return lay  # the monitor was given another layout: the user's
    except (TypeError, ValueError):
        return lay
    named = ((len(g.ranks or ()), g.mesh_dims or ()) for g in meta.groups or ())
    if names_refute_pure_dp(named):
        return None
    return Layout(lay.dp, lay.tp, lay.pp, assumed=True)


GPU_DEVICES = ("cuda", "xpu")
"""``RankMeta.device`` values that are GPUs."""
GPU_BACKENDS = ("nccl", "xccl", "rccl", "hccl", "cuda")
"""Backends (or parts of a ``"cpu:gloo,cuda:nccl"`` backend) that run on GPUs: what tells the
device in files that do not record it."""


def device_kind(meta: RankMeta | None) -> str:
    """What a rank computed on, for people: ``"GPU"`` or ``"CPU"`` (its meta's ``device``;
    in files of earlier versions its backend: NCCL and its kin mean GPUs, gloo alone a CPU
    job), ``"device"`` when nothing says."""
    if meta is None:
        return "device"
    dev = str(meta.device or "").lower()
    if dev:
        return "GPU" if dev in GPU_DEVICES else "CPU"
    backend = str(meta.backend or "").lower()
    if not backend:
        return "device"
    if any(b in backend for b in GPU_BACKENDS):
        return "GPU"
    return "CPU" if "gloo" in backend or "mpi" in backend else "device"


def job_device_kind(metas: Iterable[RankMeta | None]) -> str:
    """What a job computed on (:func:`device_kind` of its ranks): ``"GPU"`` when any rank
    did, ``"CPU"`` when every rank that says was a CPU, else ``"device"``."""
    kinds = {device_kind(m) for m in metas}
    if "GPU" in kinds:
        return "GPU"
    return "CPU" if kinds == {"CPU"} else "device"


__all__ = [
    "GPU_BACKENDS",
    "GPU_DEVICES",
    "HANG_DIR",
    "MANIFEST",
    "NODES_DIR",
    "RANK_DIR_RE",
    "RANK_FILE_RE",
    "RANK_FORMAT",
    "RUN_FORMAT",
    "TRACES_DIR",
    "ExitStatus",
    "JsonRecord",
    "Manifest",
    "RankMeta",
    "device_kind",
    "job_device_kind",
    "launcher_exit",
    "node_record_path",
    "rank_dir",
    "rank_entries",
    "rank_file",
    "rank_of_name",
    "resolve_layout",
]

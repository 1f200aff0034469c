"""``manifest.json`` and the per-node records it is merged from.

Each launcher (one per node) keeps ``DIR/nodes/NODE.json``: its ranks, their exit codes, hosts,
torchrun's exit code and status. The job-level fields of the manifest are derived from all node
records (:func:`merge_node_records`), so a run copied together from per-node directories (no
shared file system) reads the same as one written on a shared one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from meshprof.errors import MeshprofError
from meshprof.records.codec import RecordError, decode
from meshprof.records.manifest import NodeSummary
from meshprof.records.members import check_ranks
from meshprof.rundir.atomic import atomic_write_text
from meshprof.rundir.json_file import read_json
from meshprof.rundir.schema import MANIFEST, NODES_DIR, RUN_FORMAT, Manifest, node_record_path

#: How a job ended, worst first: the merged status is the worst node's.
STATUS_ORDER = ("hang", "failed", "stale", "running", "ok")
#: A node "running" whose launcher has not refreshed its heartbeat for this many intervals (and
#: at least :data:`STALE_MIN_S` seconds) is "stale": its launcher is gone.
STALE_INTERVALS = 4
STALE_MIN_S = 2.0
#: The fields of a node record summarized in the manifest's ``nodes`` list.
NODE_SUMMARY_KEYS = (
    "node_id",
    "node_rank",
    "host",
    "ranks",
    "status",
    "exit_code",
    "torchrun_exit_code",
    "start_ns",
    "end_ns",
)
#: Summarized only when the record has them (records of older versions do not).
NODE_OPTIONAL_KEYS = ("heartbeat_ns", "heartbeat_s", "cause_ns")


def as_manifest(manifest: Manifest | Mapping[str, Any]) -> Manifest:
    """``manifest`` as a :class:`Manifest` (a plain JSON object is read with from_dict)."""
    return manifest if isinstance(manifest, Manifest) else Manifest.from_dict(dict(manifest))


def write_manifest(run_dir: str | Path, manifest: Manifest | Mapping[str, Any]) -> Path:
    """Write ``DIR/manifest.json`` atomically, ``format`` first (set to :data:`RUN_FORMAT`)."""
    body = {"format": RUN_FORMAT, **as_manifest(manifest).to_dict()}
    return atomic_write_text(Path(run_dir) / MANIFEST, json.dumps(body, indent=2, default=str))


def read_manifest(run_dir: str | Path, strict: bool = True) -> Manifest:
    """``DIR/manifest.json`` (an empty Manifest when there is none). A damaged one raises
    :class:`MeshprofError`, or reads as empty when not ``strict``."""
    path = Path(run_dir) / MANIFEST
    try:
        raw = read_json(path)
    except FileNotFoundError:
        return Manifest()
    except (OSError, ValueError) as e:
        if not strict:
            return Manifest()
        raise MeshprofError(f"{path}: damaged manifest ({e})") from None
    if not isinstance(raw, dict):
        if not strict:
            return Manifest()
        raise MeshprofError(f"{path}: damaged manifest (not a JSON object)")
    try:
        return Manifest.from_dict(raw, "manifest")
    except RecordError as e:
        if not strict:
            return Manifest()
        raise MeshprofError(f"{path}: damaged manifest ({e})") from None


def write_node_record(run_dir: str | Path, node_id: str, record: Mapping[str, Any]) -> Path:
    """Write the launcher ``node_id``'s record atomically."""
    return atomic_write_text(
        node_record_path(run_dir, node_id), json.dumps(dict(record), indent=2, default=str)
    )


def read_node_records(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every readable node record, ordered by node rank then id (a damaged one is skipped: the
    manifest still has what that launcher wrote into it)."""
    out: list[dict[str, Any]] = []
    d = Path(run_dir) / NODES_DIR
    if not d.is_dir():
        return out
    for f in sorted(d.glob("*.json")):
        try:
            rec = read_json(f)
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and node_record_ok(rec):
            out.append(rec)
    out.sort(key=lambda r: (int(r.get("node_rank") or 0), str(r.get("node_id", ""))))
    return out


_NODE_TYPES: dict[str, Any] = {
    "hosts": list[str],
    "rank_exit_codes": dict[str, int | None],
    "rank_signals": dict[str, str],
    "hang": dict[str, Any],
}


def node_record_ok(rec: Mapping[str, Any]) -> bool:
    """Every key of a node record that the merge reads has its type (a record with ``end_ns``
    an object, or ``hosts`` a list of lists, is damaged and skipped)."""
    try:
        NodeSummary.from_dict(dict(rec), "node")
        for key, tp in _NODE_TYPES.items():
            if rec.get(key) is not None:
                decode(tp, rec[key], key)
        ranks = rec.get("ranks")
        if ranks is not None:
            check_ranks(ranks, "ranks")
    except (RecordError, RecursionError):
        return False
    return True


def node_status(rec: Mapping[str, Any], now_ns: int | None = None) -> str:
    """A node record's status, "stale" for a "running" one whose heartbeat stopped."""
    status = str(rec.get("status") or "running")
    beat = rec.get("heartbeat_ns")
    if status != "running" or not isinstance(beat, int):
        return status
    every = float(rec.get("heartbeat_s") or 10.0)
    now = time.time_ns() if now_ns is None else now_ns
    if now - beat > max(STALE_INTERVALS * every, STALE_MIN_S) * 1e9:
        return "stale"
    return status


def _first_failing(failing: list[dict[str, Any]]) -> dict[str, Any]:
    """The failing node whose own failure came first (``cause_ns``), else the first by node
    rank: a node whose ranks torchrun ended because another node's rank died is not the
    cause."""
    timed = [rec for rec in failing if isinstance(rec.get("cause_ns"), int)]
    if timed:
        return min(timed, key=lambda rec: int(rec["cause_ns"]))
    return failing[0]


def merge_node_records(
    manifest: Manifest | Mapping[str, Any], records: list[dict[str, Any]]
) -> Manifest:
    """The manifest with the job-level fields derived from the node records: ``nodes`` (one
    summary per node), ``hosts`` (union), ``rank_exit_codes`` and ``rank_signals`` (unions),
    ``status`` (the worst node's: hang, failed, stale, running, ok), ``exit_code`` (the failing
    node's whose own failure came first, else the first failing node's by node rank),
    ``torchrun_exit_code`` (likewise), ``end_ns`` (the last node's; None while one runs),
    ``start_ns`` (the first), ``hang`` (the first node's, unless the manifest has one),
    ``nodes_missing`` (how many fewer records than ``nnodes``; None when none are missing,
    whatever the manifest said)."""
    m = as_manifest(manifest)
    if not records:
        return m
    hosts = set(m.hosts or [])
    codes: dict[str, Any] = dict(m.rank_exit_codes or {})
    signals: dict[str, Any] = dict(m.rank_signals or {})
    for rec in records:
        hosts |= set(rec.get("hosts") or [])
        codes.update({str(k): v for k, v in (rec.get("rank_exit_codes") or {}).items()})
        signals.update({str(k): v for k, v in (rec.get("rank_signals") or {}).items()})
    now = time.time_ns()
    statuses = [node_status(rec, now) for rec in records]
    failing = [rec for rec in records if rec.get("exit_code") not in (0, None)]
    first = _first_failing(failing) if failing else records[0]
    ends = [rec.get("end_ns") for rec in records]
    nodes = []
    for rec, status in zip(records, statuses, strict=True):
        node = {k: rec.get(k) for k in NODE_SUMMARY_KEYS}
        if status == "stale":
            node["status"] = status
        node.update({k: rec[k] for k in NODE_OPTIONAL_KEYS if rec.get(k) is not None})
        nodes.append(node)
    changes: dict[str, Any] = {
        "nodes": nodes,
        "hosts": sorted(hosts),
        "rank_exit_codes": dict(sorted(codes.items(), key=lambda kv: int(kv[0]))),
        "status": min(statuses, key=lambda s: STATUS_ORDER.index(s) if s in STATUS_ORDER else 0),
        "exit_code": first.get("exit_code"),
        "torchrun_exit_code": first.get("torchrun_exit_code"),
        "end_ns": None if None in ends else max(int(e) for e in ends if e is not None),
    }
    if signals or m.rank_signals is not None:
        changes["rank_signals"] = dict(sorted(signals.items(), key=lambda kv: int(kv[0])))
    starts = [int(rec["start_ns"]) for rec in records if rec.get("start_ns")]
    if starts:
        changes["start_ns"] = min([*starts, *([m.start_ns] if m.start_ns else [])])
    hangs = [rec["hang"] for rec in records if rec.get("hang")]
    if hangs and not m.hang:
        changes["hang"] = hangs[0]
    nnodes = str(m.nnodes or "")
    if nnodes.isdigit():
        # recounted from the records read: a manifest written on one node (which saw only its
        # own record) says the others are missing, which its directory read beside theirs, or
        # gathered with them, no longer is
        changes["nodes_missing"] = max(int(nnodes) - len(records), 0) or None
    return m.updated(**changes)


__all__ = [
    "NODE_OPTIONAL_KEYS",
    "NODE_SUMMARY_KEYS",
    "STATUS_ORDER",
    "as_manifest",
    "merge_node_records",
    "node_status",
    "read_manifest",
    "read_node_records",
    "write_manifest",
    "write_node_record",
]

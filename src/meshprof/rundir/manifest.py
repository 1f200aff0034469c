"""``manifest.json`` and the per-node records it is merged from.

Each launcher (one per node) keeps ``DIR/nodes/NODE.json``: its ranks, their exit codes, hosts,
torchrun's exit code and status. The job-level fields of the manifest are derived from all node
records (:func:`merge_node_records`), so a run copied together from per-node directories (no
shared file system) reads the same as one written on a shared one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from meshprof.errors import MeshprofError
from meshprof.records.codec import RecordError
from meshprof.rundir.atomic import atomic_write_text
from meshprof.rundir.schema import MANIFEST, NODES_DIR, RUN_FORMAT, Manifest, node_record_path

#: How a job ended, worst first: the merged status is the worst node's.
STATUS_ORDER = ("hang", "failed", "running", "ok")
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
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return Manifest()
    except (OSError, ValueError, UnicodeDecodeError) as e:
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
            rec = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError):
            continue
        if isinstance(rec, dict):
            out.append(rec)
    out.sort(key=lambda r: (int(r.get("node_rank") or 0), str(r.get("node_id", ""))))
    return out


def merge_node_records(
    manifest: Manifest | Mapping[str, Any], records: list[dict[str, Any]]
) -> Manifest:
    """The manifest with the job-level fields derived from the node records: ``nodes`` (one
    summary per node), ``hosts`` (union), ``rank_exit_codes`` and ``rank_signals`` (unions),
    ``status`` (the worst
    node's: hang, failed, running, ok), ``exit_code`` (the first failing node's, by node rank),
    ``torchrun_exit_code`` (likewise), ``end_ns`` (the last node's; None while one runs),
    ``start_ns`` (the first), ``hang`` (the first node's, unless the manifest has one)."""
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
    statuses = [str(rec.get("status") or "running") for rec in records]
    failing = [rec for rec in records if rec.get("exit_code") not in (0, None)]
    first = failing[0] if failing else records[0]
    ends = [rec.get("end_ns") for rec in records]
    changes: dict[str, Any] = {
        "nodes": [{k: rec.get(k) for k in NODE_SUMMARY_KEYS} for rec in records],
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
    return m.updated(**changes)


__all__ = [
    "NODE_SUMMARY_KEYS",
    "STATUS_ORDER",
    "as_manifest",
    "merge_node_records",
    "read_manifest",
    "read_node_records",
    "write_manifest",
    "write_node_record",
]

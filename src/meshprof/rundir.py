"""Files on disk: atomic writes (a crash never leaves half a file)."""

from __future__ import annotations

import contextlib
import functools as _functools
import json as _json
import os
import re as _re
import tempfile
from dataclasses import dataclass as _dataclass
from dataclasses import field as _field
from pathlib import Path
from typing import Any as _Any

import numpy as _np

from meshprof.errors import MeshprofError
from meshprof.events import EVENT_DTYPE, MEMORY_DTYPE, SPAN_DTYPE


def atomic_write_bytes(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


# --------------------------------------------------------------------------------------------
# The run directory
#
#   DIR/manifest.json          written by the launcher (or rank 0): see Manifest; with several
#                              nodes, each launcher rewrites it merged with every node record
#   DIR/nodes/NODE.json        one record per launcher (node): its ranks, exit codes, hosts,
#                              torchrun's exit code, status; load_run merges them into the
#                              manifest, so a run copied together from per-node directories
#                              (no shared file system) reads the same as one on a shared one
#   DIR/rank00000.npz ...      one file per rank: see RankData
#   DIR/traces/                torch.profiler traces (optional)
#   DIR/hang/                  watchdog dumps (optional)
#
# A rank file is a numpy .npz archive (loaded with allow_pickle=False: never unpickled):
#   events   EVENT_DTYPE rows (collectives) in the order they completed: an asynchronous op
#            issued earlier can end later, so sort by start_ns for issue order
#   spans    SPAN_DTYPE rows (steps and phases)
#   memory   MEMORY_DTYPE rows (one per step)
#   meta     uint8 array holding UTF-8 JSON: rank, world_size, hostname, pid, versions, the
#            tables that name the codes (groups, dtypes, op labels, span names), errors and
#            metadata keyed by event index, exact statistics (Accumulator.to_dict), clock
#            sync samples, layout, monitor settings.
# --------------------------------------------------------------------------------------------


RUN_FORMAT = "meshprof-run/1"
MANIFEST = "manifest.json"
NODES_DIR = "nodes"
_RANK_RE = _re.compile(r"^rank(\d+)\.npz$")


def rank_file(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / f"rank{rank:05d}.npz"


@_dataclass(slots=True)
class RankData:
    """Everything one rank recorded, as loaded from (or about to be written to) its file."""

    rank: int
    events: _np.ndarray
    spans: _np.ndarray
    memory: _np.ndarray
    meta: dict[str, _Any] = _field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return int(self.meta.get("world_size", -1))

    @property
    def groups(self) -> list[dict[str, _Any]]:
        """[{name, desc, ranks, backend}] indexed by the events' ``group`` code."""
        return list(self.meta.get("groups", []))

    @property
    def dtypes(self) -> list[str]:
        return list(self.meta.get("dtypes", []))

    @property
    def labels(self) -> list[str]:
        """Custom op labels; op code CUSTOM_BASE + i names labels[i]."""
        return list(self.meta.get("labels", []))

    @property
    def span_names(self) -> list[str]:
        return list(self.meta.get("span_names", []))

    def op_name(self, code: int) -> str:
        from meshprof.events import CUSTOM_BASE, OP_NAMES

        return self.labels[code - CUSTOM_BASE] if code >= CUSTOM_BASE else OP_NAMES[code]


def write_rank_file(run_dir: Path, data: RankData) -> Path:
    """Write one rank's file atomically (temporary file + rename)."""
    import io

    buf = io.BytesIO()
    meta = _json.dumps(data.meta, default=str).encode("utf-8")
    _np.savez(
        buf,
        events=_np.ascontiguousarray(data.events, dtype=EVENT_DTYPE),
        spans=_np.ascontiguousarray(data.spans, dtype=SPAN_DTYPE),
        memory=_np.ascontiguousarray(data.memory, dtype=MEMORY_DTYPE),
        meta=_np.frombuffer(meta, dtype=_np.uint8),
    )
    return atomic_write_bytes(rank_file(run_dir, data.rank), buf.getvalue())


@_functools.lru_cache(maxsize=256)
def _npy_header(text: str) -> tuple[_np.dtype, tuple[int, ...]] | None:
    """(dtype, shape) of a C-order .npy header dict, None for anything else. Headers repeat
    (same dtype, same few shapes): parsing each once instead of per member per file (numpy's
    ``ast.literal_eval``) was 40 % of loading 4,096 small rank files."""
    import ast

    d = ast.literal_eval(text)
    if not isinstance(d, dict) or d.get("fortran_order") or not isinstance(d.get("shape"), tuple):
        return None
    dt = _np.lib.format.descr_to_dtype(d["descr"])
    if dt.hasobject:
        return None
    return dt, tuple(int(x) for x in d["shape"])


def _read_npz(path: Path, names: tuple[str, ...]) -> dict[str, _np.ndarray]:
    """The named arrays of an uncompressed or compressed .npz (as ``np.load`` reads them, never
    unpickling); falls back to ``np.load`` for a member this reader does not handle."""
    import struct
    import zipfile

    out: dict[str, _np.ndarray] = {}
    with zipfile.ZipFile(path) as zf:
        for name in names:
            with zf.open(f"{name}.npy") as f:
                magic = f.read(8)
                if len(magic) != 8 or magic[:6] != b"\x93NUMPY" or magic[6] not in (1, 2, 3):
                    raise ValueError(f"{name}: not a .npy member")
                if magic[6] == 1:
                    (hlen,) = struct.unpack("<H", f.read(2))
                else:
                    (hlen,) = struct.unpack("<I", f.read(4))
                header = f.read(hlen).decode("utf-8" if magic[6] == 3 else "latin1")
                parsed = _npy_header(header)
                if parsed is None:
                    break
                dt, shape = parsed
                arr = _np.empty(shape, dtype=dt)
                view = memoryview(arr.reshape(-1).view(_np.uint8))  # type: ignore[arg-type]
                got = 0
                while got < len(view):
                    # in 256 KiB pieces, as np.load reads (ZipExtFile.readinto reads into a
                    # temporary bytes first; larger pieces left glibc arenas holding more)
                    k = f.readinto(view[got : got + (1 << 18)])  # type: ignore[attr-defined]
                    if not k:
                        raise EOFError(f"{name}: truncated ({got} of {len(view)} bytes)")
                    got += k
                out[name] = arr
        else:
            return out
    with _np.load(path, allow_pickle=False) as z:
        return {name: z[name] for name in names}


def load_rank_file(path: Path) -> RankData:
    """Load one rank file; a damaged or foreign file raises :class:`MeshprofError`."""
    import zipfile

    m = _RANK_RE.match(Path(path).name)
    try:
        arrays = _read_npz(Path(path), ("events", "spans", "memory", "meta"))
        events, spans, memory = arrays["events"], arrays["spans"], arrays["memory"]
        meta = _json.loads(bytes(arrays["meta"]).decode("utf-8"))
    except FileNotFoundError:
        raise MeshprofError(f"{path}: no such file") from None
    except (zipfile.BadZipFile, ValueError, KeyError, OSError, EOFError, UnicodeDecodeError) as e:
        raise MeshprofError(f"{path}: damaged rank file ({type(e).__name__}: {e})") from None
    if events.dtype != EVENT_DTYPE or spans.dtype != SPAN_DTYPE or memory.dtype != MEMORY_DTYPE:
        raise MeshprofError(f"{path}: rank file of another meshprof format (column layout differs)")
    rank = int(meta.get("rank", int(m.group(1)) if m else -1))
    return RankData(rank=rank, events=events, spans=spans, memory=memory, meta=meta)


@_dataclass(slots=True)
class LoadedRun:
    """A run directory: its manifest, the ranks that loaded, and the ones that did not."""

    path: Path
    manifest: dict[str, _Any]
    ranks: dict[int, RankData]
    problems: dict[int, str]
    """rank -> why it is missing or damaged (ranks expected from the manifest's world size)."""
    world_size: int


def write_manifest(run_dir: Path, manifest: dict[str, _Any]) -> Path:
    manifest = {"format": RUN_FORMAT, **manifest}
    return atomic_write_text(Path(run_dir) / MANIFEST, _json.dumps(manifest, indent=2, default=str))


def node_record_path(run_dir: Path, node_id: str) -> Path:
    """Where the launcher ``node_id`` keeps its node record."""
    safe = _re.sub(r"[^A-Za-z0-9_.-]", "_", node_id) or "node"
    return Path(run_dir) / NODES_DIR / f"{safe}.json"


def write_node_record(run_dir: Path, node_id: str, record: dict[str, _Any]) -> Path:
    return atomic_write_text(
        node_record_path(run_dir, node_id), _json.dumps(record, indent=2, default=str)
    )


def read_node_records(run_dir: Path) -> list[dict[str, _Any]]:
    """Every readable node record, ordered by node rank then id (a damaged one is skipped: the
    manifest still has what that launcher wrote into it)."""
    out: list[dict[str, _Any]] = []
    d = Path(run_dir) / NODES_DIR
    if not d.is_dir():
        return out
    for f in sorted(d.glob("*.json")):
        try:
            rec = _json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError):
            continue
        if isinstance(rec, dict):
            out.append(rec)
    out.sort(key=lambda r: (int(r.get("node_rank") or 0), str(r.get("node_id", ""))))
    return out


#: How a job ended, worst first: the merged status is the worst node's.
_STATUS_ORDER = ("hang", "failed", "running", "ok")


def merge_node_records(
    manifest: dict[str, _Any], records: list[dict[str, _Any]]
) -> dict[str, _Any]:
    """The manifest with the job-level fields derived from the node records: ``nodes`` (one
    summary per node), ``hosts`` (union), ``rank_exit_codes`` (union), ``status`` (the worst
    node's: hang, failed, running, ok), ``exit_code`` (the first failing node's, by node rank),
    ``torchrun_exit_code`` (likewise), ``end_ns`` (the last node's; None while one runs)."""
    if not records:
        return manifest
    m = dict(manifest)
    m["nodes"] = [
        {
            k: rec.get(k)
            for k in (
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
        }
        for rec in records
    ]
    hosts = set(m.get("hosts") or [])
    codes: dict[str, _Any] = dict(m.get("rank_exit_codes") or {})
    for rec in records:
        hosts |= set(rec.get("hosts") or [])
        codes.update({str(k): v for k, v in (rec.get("rank_exit_codes") or {}).items()})
    m["hosts"] = sorted(hosts)
    m["rank_exit_codes"] = dict(sorted(codes.items(), key=lambda kv: int(kv[0])))
    statuses = [str(rec.get("status") or "running") for rec in records]
    m["status"] = min(statuses, key=lambda s: _STATUS_ORDER.index(s) if s in _STATUS_ORDER else 0)
    failing = [rec for rec in records if rec.get("exit_code") not in (0, None)]
    first = failing[0] if failing else records[0]
    m["exit_code"] = first.get("exit_code")
    m["torchrun_exit_code"] = first.get("torchrun_exit_code")
    ends = [rec.get("end_ns") for rec in records]
    m["end_ns"] = None if None in ends else max(int(e) for e in ends if e is not None)
    starts = [rec.get("start_ns") for rec in records if rec.get("start_ns")]
    if starts:
        m["start_ns"] = min([*starts, *([m["start_ns"]] if m.get("start_ns") else [])])
    hangs = [rec["hang"] for rec in records if rec.get("hang")]
    if hangs and not m.get("hang"):
        m["hang"] = hangs[0]
    return m


def _load_or_reason(
    path: Path, shared: dict[tuple[str, int], list] | None = None
) -> RankData | str:
    try:
        rd = load_rank_file(path)
    except MeshprofError as e:
        return str(e)
    if shared is not None:
        # every rank file lists the members of each of its groups: share one list per group
        # (4,096 ranks each holding the world group's 4,096 members would be 16M Python ints)
        for g in rd.meta.get("groups") or ():
            ranks = g.get("ranks") if isinstance(g, dict) else None
            if not isinstance(ranks, list):
                continue
            key = (str(g.get("name", "")), len(ranks))
            have = shared.setdefault(key, ranks)
            if have is not ranks and have == ranks:
                g["ranks"] = have
    return rd


def _load_all(paths: list[Path]) -> list[RankData | str]:
    """Rank files are independent: read them on a thread pool (8 threads or one per core; reading
    and copying the arrays release the GIL: 8 files of 54 MB load about 2× faster on 2 cores;
    thousands of small files gain little, their JSON metadata holds the GIL)."""
    workers = min(len(paths), max(8, os.cpu_count() or 1), 32)
    shared: dict[tuple[str, int], list] = {}
    if workers <= 1:
        return [_load_or_reason(p, shared) for p in paths]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers, thread_name_prefix="meshprof-load") as pool:
        return list(pool.map(lambda p: _load_or_reason(p, shared), paths))


def load_run(run_dir: Path) -> LoadedRun:
    """Load every rank file of a run directory. Missing or damaged ranks are listed in
    ``problems``; the rest still load. No usable rank at all raises :class:`MeshprofError`."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise MeshprofError(f"{run_dir}: no such directory")
    if not run_dir.is_dir():
        raise MeshprofError(f"{run_dir}: not a directory (expected a meshprof run directory)")
    manifest: dict[str, _Any] = {}
    mpath = run_dir / MANIFEST
    if mpath.exists():
        try:
            manifest = _json.loads(mpath.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise MeshprofError(f"{mpath}: damaged manifest ({e})") from None
    manifest = merge_node_records(manifest, read_node_records(run_dir))
    ranks: dict[int, RankData] = {}
    problems: dict[int, str] = {}
    files = [
        (int(mm.group(1)), f)
        for f in sorted(run_dir.iterdir())
        if (mm := _RANK_RE.match(f.name)) is not None
    ]
    for r, got in zip((r for r, _ in files), _load_all([f for _, f in files]), strict=True):
        if isinstance(got, RankData):
            ranks[r] = got
        else:
            problems[r] = got
    world = int(manifest.get("world_size") or 0)
    for rd in ranks.values():
        world = max(world, rd.world_size)
    world = max(world, max(list(ranks) + list(problems), default=-1) + 1)
    for r in range(world):
        if r not in ranks and r not in problems:
            problems[r] = f"{rank_file(run_dir, r).name}: missing"
    if not ranks:
        detail = "; ".join(problems.values()) if problems else "no rank files (rank*.npz)"
        raise MeshprofError(f"{run_dir}: no usable rank file ({detail})")
    return LoadedRun(
        path=run_dir, manifest=manifest, ranks=ranks, problems=problems, world_size=world
    )

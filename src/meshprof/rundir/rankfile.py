"""One rank's file (``DIR/rankNNNNN.npz``): :class:`RankData`, written and loaded.

A rank file is a numpy .npz archive (loaded with ``allow_pickle=False``: never unpickled):

- ``events``: EVENT_DTYPE rows (collectives) in the order they completed: an asynchronous op
  issued earlier can end later, so sort by ``start_ns`` for issue order;
- ``spans``: SPAN_DTYPE rows (steps and phases);
- ``memory``: MEMORY_DTYPE rows (one per step);
- ``meta``: a uint8 array holding UTF-8 JSON, :class:`~meshprof.rundir.schema.RankMeta`.
"""

from __future__ import annotations

import functools
import io
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from meshprof.errors import MeshprofError
from meshprof.events import CUSTOM_BASE, EVENT_DTYPE, MEMORY_DTYPE, OP_NAMES, SPAN_DTYPE
from meshprof.rundir.atomic import atomic_write_bytes
from meshprof.rundir.schema import RANK_FILE_RE, RankMeta, rank_file


@dataclass(slots=True)
class RankData:
    """Everything one rank recorded, as loaded from (or about to be written to) its file."""

    rank: int
    events: np.ndarray
    spans: np.ndarray
    memory: np.ndarray
    meta: RankMeta = field(default_factory=RankMeta)

    @property
    def world_size(self) -> int:
        """The world size the rank saw (-1 when unknown)."""
        return int(self.meta.world_size if self.meta.world_size is not None else -1)

    @property
    def groups(self) -> list[dict[str, Any]]:
        """[{name, desc, ranks, backend}] indexed by the events' ``group`` code."""
        return list(self.meta.groups or [])

    @property
    def dtypes(self) -> list[str]:
        return list(self.meta.dtypes or [])

    @property
    def labels(self) -> list[str]:
        """Custom op labels; op code CUSTOM_BASE + i names labels[i]."""
        return list(self.meta.labels or [])

    @property
    def span_names(self) -> list[str]:
        return list(self.meta.span_names or [])

    def op_name(self, code: int) -> str:
        return self.labels[code - CUSTOM_BASE] if code >= CUSTOM_BASE else OP_NAMES[code]


def write_rank_file(run_dir: str | Path, data: RankData) -> Path:
    """Write one rank's file atomically (temporary file + rename); returns its path."""
    buf = io.BytesIO()
    meta = json.dumps(data.meta.to_dict(), default=str).encode("utf-8")
    np.savez(
        buf,
        events=np.ascontiguousarray(data.events, dtype=EVENT_DTYPE),
        spans=np.ascontiguousarray(data.spans, dtype=SPAN_DTYPE),
        memory=np.ascontiguousarray(data.memory, dtype=MEMORY_DTYPE),
        meta=np.frombuffer(meta, dtype=np.uint8),
    )
    return atomic_write_bytes(rank_file(run_dir, data.rank), buf.getvalue())


@functools.lru_cache(maxsize=256)
def _npy_header(text: str) -> tuple[np.dtype, tuple[int, ...]] | None:
    """(dtype, shape) of a C-order .npy header dict, None for anything else. Headers repeat
    (same dtype, same few shapes): parsing each once instead of per member per file (numpy's
    ``ast.literal_eval``) was 40 % of loading 4,096 small rank files."""
    import ast

    d = ast.literal_eval(text)
    if not isinstance(d, dict) or d.get("fortran_order") or not isinstance(d.get("shape"), tuple):
        return None
    dt = np.lib.format.descr_to_dtype(d["descr"])
    if dt.hasobject:
        return None
    return dt, tuple(int(x) for x in d["shape"])


def _read_npz(path: Path, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The named arrays of an uncompressed or compressed .npz (as ``np.load`` reads them, never
    unpickling); falls back to ``np.load`` for a member this reader does not handle."""
    import struct

    out: dict[str, np.ndarray] = {}
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
                arr = np.empty(shape, dtype=dt)
                view = memoryview(arr.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
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
    with np.load(path, allow_pickle=False) as z:
        return {name: z[name] for name in names}


def load_rank_file(path: str | Path) -> RankData:
    """Load one rank file; a damaged or foreign file raises :class:`MeshprofError`."""
    m = RANK_FILE_RE.match(Path(path).name)
    try:
        arrays = _read_npz(Path(path), ("events", "spans", "memory", "meta"))
        events, spans, memory = arrays["events"], arrays["spans"], arrays["memory"]
        raw = json.loads(bytes(arrays["meta"]).decode("utf-8"))
    except FileNotFoundError:
        raise MeshprofError(f"{path}: no such file") from None
    except (zipfile.BadZipFile, ValueError, KeyError, OSError, EOFError, UnicodeDecodeError) as e:
        raise MeshprofError(f"{path}: damaged rank file ({type(e).__name__}: {e})") from None
    if events.dtype != EVENT_DTYPE or spans.dtype != SPAN_DTYPE or memory.dtype != MEMORY_DTYPE:
        raise MeshprofError(f"{path}: rank file of another meshprof format (column layout differs)")
    if not isinstance(raw, dict):
        raise MeshprofError(f"{path}: damaged rank file (meta is not a JSON object)")
    meta = RankMeta.from_dict(raw)
    rank = int(meta.rank if meta.rank is not None else (int(m.group(1)) if m else -1))
    return RankData(rank=rank, events=events, spans=spans, memory=memory, meta=meta)


__all__ = ["RankData", "load_rank_file", "write_rank_file"]

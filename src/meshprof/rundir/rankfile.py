"""One rank's file (``DIR/rankNNNNN.npz``): :class:`RankData`, written and loaded.

A rank file is a numpy .npz archive (loaded with ``allow_pickle=False``: never unpickled):

- ``events``: EVENT_DTYPE rows (collectives) in the order they completed: an asynchronous op
  issued earlier can end later, so sort by ``start_ns`` for issue order;
- ``spans``: SPAN_DTYPE rows (steps and phases);
- ``memory``: MEMORY_DTYPE rows (one per step);
- ``inflight``: EVENT_DTYPE rows of the collectives issued and not completed at the write
  (status ``pending``, ``duration_ns`` -1, ``start_ns`` the issue time), oldest first; never
  also in ``events``: the next write has such a collective in ``events`` once it completed
  (files of earlier versions have no ``inflight`` member: read as empty);
- ``meta``: a uint8 array holding UTF-8 JSON, :class:`~meshprof.rundir.schema.RankMeta`.
"""

from __future__ import annotations

import functools
import io
import json
import re
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from meshprof.errors import MeshprofError
from meshprof.events import (
    CUSTOM_BASE,
    EVENT_DTYPE,
    MEMORY_DTYPE,
    OP_NAMES,
    REQUEST_DTYPE,
    REQUEST_TRACE_DTYPE,
    SPAN_DTYPE,
    STEP_TOTALS_DTYPE,
    TOKEN_DTYPE,
)
from meshprof.records.codec import RecordError
from meshprof.records.members import Members
from meshprof.records.rank_meta import GroupRecord
from meshprof.rundir.atomic import atomic_write_bytes
from meshprof.rundir.json_file import is_regular
from meshprof.rundir.schema import RANK_FILE_RE, RANK_FORMAT, RankMeta, rank_file

if TYPE_CHECKING:
    from meshprof.comm.recorder import CommProfiler


@dataclass(slots=True)
class RankData:
    """Everything one rank recorded, as loaded from (or about to be written to) its file."""

    rank: int
    events: np.ndarray
    spans: np.ndarray
    memory: np.ndarray
    meta: RankMeta = field(default_factory=RankMeta)
    file_events: int = -1
    """Event rows in the rank file (-1: not loaded from a file). ``events`` may hold fewer:
    a lean or sampled load (:func:`load_rank_file`) keeps only some."""
    inflight: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=EVENT_DTYPE))
    """EVENT_DTYPE rows of the collectives in flight at the write (status pending, duration
    -1), oldest first; none of them is in ``events``."""

    steps: np.ndarray = field(default_factory=lambda: np.zeros(0, STEP_TOTALS_DTYPE))
    """Per-step totals (STEP_TOTALS_DTYPE) for the whole run, including the steps whose
    detailed rows were rotated out (segment storage; empty for a single rank file)."""
    requests: np.ndarray = field(default_factory=lambda: np.zeros(0, REQUEST_DTYPE))
    """The serving requests this rank recorded (REQUEST_DTYPE), in the order they finished
    (those still running at the last write at the end, reason ``unfinished``); empty for a
    rank that served none (and for a single rank file)."""
    tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, TOKEN_DTYPE))
    """Their token emissions (TOKEN_DTYPE), in the order they were emitted."""
    request_traces: np.ndarray = field(default_factory=lambda: np.zeros(0, REQUEST_TRACE_DTYPE))
    """The W3C ``traceparent`` of those requests that came with one (REQUEST_TRACE_DTYPE,
    matched to ``requests`` by id and arrival); empty for a run of an earlier version."""

    @property
    def world_size(self) -> int:
        """The world size the rank saw (-1 when unknown)."""
        return int(self.meta.world_size if self.meta.world_size is not None else -1)

    @property
    def groups(self) -> list[GroupRecord]:
        """The process groups, indexed by the events' ``group`` code."""
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
        inflight=np.ascontiguousarray(data.inflight, dtype=EVENT_DTYPE),
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


def _member_header(f: Any, name: str) -> tuple[np.dtype, tuple[int, ...]] | None:
    """Read a .npy member's header from ``f``: (dtype, shape), None for one this reader does
    not handle (Fortran order, object dtype)."""
    import struct

    magic = f.read(8)
    if len(magic) != 8 or magic[:6] != b"\x93NUMPY" or magic[6] not in (1, 2, 3):
        raise ValueError(f"{name}: not a .npy member")
    if magic[6] == 1:
        (hlen,) = struct.unpack("<H", f.read(2))
    else:
        (hlen,) = struct.unpack("<I", f.read(4))
    return _npy_header(f.read(hlen).decode("utf-8" if magic[6] == 3 else "latin1"))


_DEFLATE_RATIO = 1032
"""The most a deflated stream expands (zlib's bound): a member claiming more bytes than its
compressed size allows is damage, not data."""


def _check_size(zf: zipfile.ZipFile, member: str, dt: np.dtype, shape: tuple[int, ...]) -> None:
    """``ValueError`` when an array of ``shape`` × ``dt`` needs more bytes than the member can
    hold (its header claims a size, the file holds what it holds: never allocate the claim)."""
    info = zf.getinfo(member)
    need = dt.itemsize
    for d in shape:
        need *= int(d)
    disk = zf.fp.seek(0, 2) if zf.fp is not None else info.compress_size
    packed = min(info.compress_size, disk)
    room = packed if info.compress_type == zipfile.ZIP_STORED else packed * _DEFLATE_RATIO + 4096
    if need > min(info.file_size, room):
        raise ValueError(
            f"{member}: its header claims {need:,} bytes, the file holds at most {min(info.file_size, room):,}"
        )


def _read_into(f: Any, arr: np.ndarray, name: str) -> None:
    """Fill ``arr`` (C-contiguous) with the next ``arr.nbytes`` bytes of ``f``."""
    view = memoryview(arr.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
    got = 0
    while got < len(view):
        # in 256 KiB pieces, as np.load reads (ZipExtFile.readinto reads into a
        # temporary bytes first; larger pieces left glibc arenas holding more)
        step = len(view) if isinstance(f, _StoredMember) else 1 << 18  # (no temporary)
        k = f.readinto(view[got : got + step])
        if not k:
            raise EOFError(f"{name}: truncated ({got} of {len(view)} bytes)")
        got += k


class _StoredMember:
    """An uncompressed zip member read with ``os.pread`` (the GIL is released while the kernel
    copies, so rank files load on several cores at once; ``ZipExtFile`` reads in Python under
    the GIL). The CRC is checked, as ``zipfile`` does, once the last byte is read."""

    def __init__(self, fd: int, offset: int, size: int, crc: int, name: str) -> None:
        self._fd, self._pos, self._end, self._crc, self._want = fd, offset, offset + size, 0, crc
        self._name = name

    def readinto(self, view: memoryview) -> int:
        import os
        import zlib

        n = min(len(view), self._end - self._pos)
        got = 0
        while got < n:
            k = os.preadv(self._fd, [view[got:n]], self._pos + got)
            if k <= 0:
                break
            got += k
        self._crc = zlib.crc32(view[:got], self._crc)
        self._pos += got
        if self._pos >= self._end and self._crc != self._want:
            raise zipfile.BadZipFile(f"Bad CRC-32 for file {self._name!r}")
        return got

    def read(self, n: int) -> bytes:
        buf = bytearray(max(min(n, self._end - self._pos), 0))
        got = self.readinto(memoryview(buf))
        return bytes(buf[:got])

    def __enter__(self) -> _StoredMember:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _open_member(zf: zipfile.ZipFile, fd: int | None, name: str) -> Any:
    """``name`` of ``zf`` as a file: read with ``os.pread`` when it is stored uncompressed and
    ``fd`` (the same file, opened for reading) is given, else through ``zipfile``."""
    info = zf.getinfo(name)
    if fd is None or info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
        return zf.open(name)
    import os
    import struct

    head = os.pread(fd, 30, info.header_offset)  # the local header: its own name/extra lengths
    if len(head) != 30 or head[:4] != b"PK\x03\x04":
        return zf.open(name)
    n_name, n_extra = struct.unpack("<HH", head[26:30])
    start = info.header_offset + 30 + n_name + n_extra
    return _StoredMember(fd, start, info.file_size, info.CRC, name)


def _read_npz(path: Path, names: tuple[str, ...], zf: zipfile.ZipFile) -> dict[str, np.ndarray]:
    """The named arrays of an uncompressed or compressed .npz open as ``zf`` (as ``np.load``
    reads them, never unpickling); falls back to ``np.load`` for a member this reader does not
    handle."""
    out: dict[str, np.ndarray] = {}
    for name in names:
        with zf.open(f"{name}.npy") as f:
            parsed = _member_header(f, name)
            if parsed is None:
                break
            dt, shape = parsed
            _check_size(zf, f"{name}.npy", dt, shape)
            arr = np.empty(shape, dtype=dt)
            _read_into(f, arr, name)
            out[name] = arr
    else:
        return out
    with np.load(path, allow_pickle=False) as z:
        return {name: z[name] for name in names}


LEAN_FIELDS = (
    "op",
    "status",
    "flags",
    "group",
    "peer",
    "seq",
    "in_bytes",
    "out_bytes",
    "start_ns",
    "duration_ns",
)
"""The event columns the run report reads (:func:`load_rank_file` with ``lean=True``)."""
_LEAN_CHUNK = 1 << 16  # rows read at a time (3.5 MB of EVENT_DTYPE)
_WIDE = ("peer", "seq", "in_bytes", "out_bytes", "duration_ns")  # narrowed when they fit


def _lean_dtype(hi: dict[str, int], lo: dict[str, int]) -> np.dtype:
    """Packed dtype of the :data:`LEAN_FIELDS`, each integer column in the narrowest of
    (int16 for peer) int32 / int64 that holds its range."""
    fields: list[tuple[str, Any]] = []
    for name in LEAN_FIELDS:
        dt = EVENT_DTYPE[name]
        if name in _WIDE:
            small = np.int16 if name == "peer" else np.int32
            info = np.iinfo(small)
            if info.min <= lo[name] and hi[name] <= info.max:
                dt = np.dtype(small)
        fields.append((name, dt))
    return np.dtype(fields)


def lean_events(
    chunks: Callable[[], Iterator[np.ndarray]], groups: list[Any], sample_limit: int | None
) -> np.ndarray:
    """The completed events (duration ≥ 0) of EVENT_DTYPE ``chunks``, only the
    :data:`LEAN_FIELDS`, each column as narrow as its values allow; with ``sample_limit``, only
    the collectives whose (group, seq) hash is below it (:mod:`meshprof.rundir.sampling`).
    ``chunks()`` returns a fresh iterator over the rows and is called twice (sizes, then copy)
    unless the first pass saw a single chunk: the full EVENT_DTYPE array is never held."""
    from meshprof.rundir.sampling import group_crcs, sampled

    crcs = group_crcs(groups)
    ngroups = len(groups)

    def kept(c: np.ndarray) -> np.ndarray:
        keep = c["duration_ns"] >= 0
        if sample_limit is not None:
            g = c["group"]
            known = g < ngroups
            keep &= known
            keep &= sampled(c["seq"], crcs[np.where(known, g, 0)], sample_limit)
        return c if keep.all() else c[keep]

    big = np.iinfo(np.int64).max
    lo = dict.fromkeys(_WIDE, big)
    hi = dict.fromkeys(_WIDE, -big)
    count = 0
    first: np.ndarray | None = None  # a single chunk is read once, not once per pass
    for seen, c in enumerate(chunks()):
        k = kept(c)
        first = k if seen == 0 else None
        count += len(k)
        if len(k):
            for name in _WIDE:
                lo[name] = min(lo[name], int(k[name].min()))
                hi[name] = max(hi[name], int(k[name].max()))
    out = np.empty(count, dtype=_lean_dtype(hi, lo))
    pos = 0
    for k in [first] if first is not None else (kept(c) for c in chunks()):
        for name in LEAN_FIELDS:
            out[name][pos : pos + len(k)] = k[name]
        pos += len(k)
    if pos != count:
        raise ValueError("events: changed while read")
    return out


def _read_events_lean(
    zf: zipfile.ZipFile, groups: list[Any], sample_limit: int | None, fd: int | None = None
) -> tuple[np.ndarray, int] | None:
    """:func:`lean_events` of a rank file's ``events`` member, read in chunks. Returns (events,
    rows in the file); None when the member is not a plain EVENT_DTYPE array."""
    with _open_member(zf, fd, "events.npy") as f:
        parsed = _member_header(f, "events")
    if parsed is None or parsed[0] != EVENT_DTYPE or len(parsed[1]) != 1:
        return None
    _check_size(zf, "events.npy", parsed[0], parsed[1])
    n = parsed[1][0]

    def chunks() -> Iterator[np.ndarray]:
        with _open_member(zf, fd, "events.npy") as f:
            _member_header(f, "events")
            buf = np.empty(min(n, _LEAN_CHUNK), dtype=EVENT_DTYPE)
            for b0 in range(0, n, _LEAN_CHUNK):
                c = buf[: min(_LEAN_CHUNK, n - b0)]
                _read_into(f, c, "events")
                yield c

    return lean_events(chunks, groups, sample_limit), n


_LONG_RANKS = re.compile(r'"ranks": ?(\[[0-9, ]{2048,}\])')
"""A group's member list long enough to be worth parsing once per run (~400 ranks or more)."""
_SHARED = "@meshprof-shared-"


def parse_meta(text: str, shared: dict[str, Members] | None) -> Any:
    """The meta JSON. With ``shared`` (one dict per run load), every long ``"ranks": [...]``
    list (files of versions before issue 31 list every group's members) is parsed once per
    distinct text, made :class:`~meshprof.records.members.Members` (a progression: three
    numbers), and the same object is put in every rank's meta that has it: 4,096 such files
    hold 4,096 × 4,096 numbers, and parsing them was most of the load time. The result equals
    ``json.loads(text)`` but for those lists, which are ``Members`` (equal to them)."""
    if shared is None or len(text) < 2048:
        return json.loads(text)
    found: list[Members] = []

    def swap(m: re.Match[str]) -> str:
        body = m.group(1)
        lst = shared.get(body)
        if lst is None:
            lst = shared[body] = Members(json.loads(body))
        found.append(lst)
        return f'"ranks": "{_SHARED}{len(found) - 1}"'

    swapped = _LONG_RANKS.sub(swap, text)
    if not found:
        return json.loads(text)
    raw = json.loads(swapped)
    put = 0
    groups = raw.get("groups") if isinstance(raw, dict) else None
    for g in groups if isinstance(groups, list) else ():
        v = g.get("ranks") if isinstance(g, dict) else None
        if isinstance(v, str) and v.startswith(_SHARED):
            g["ranks"] = found[int(v[len(_SHARED) :])]
            put += 1
    # a long list anywhere but a group's members: parse the text as it is
    return raw if put == len(found) else json.loads(text)


def load_rank_file(
    path: str | Path,
    *,
    lean: bool = False,
    sample_limit: int | None = None,
    shared_ranks: dict[str, Members] | None = None,
) -> RankData:
    """Load one rank file; a damaged or foreign file raises :class:`MeshprofError`.

    ``lean``: ``events`` holds only the completed events (duration ≥ 0) and only the
    :data:`LEAN_FIELDS`, in narrow dtypes (about 30 B per event instead of 54: what the run
    report reads); ``sample_limit`` (with ``lean``) keeps a consistent (group, seq) sample of
    the collectives (:mod:`meshprof.rundir.sampling`); ``shared_ranks`` (one dict per run
    load): long group member lists parsed once and shared between the rank files."""
    m = RANK_FILE_RE.match(Path(path).name)
    file_events = -1
    if Path(path).exists() and not is_regular(path):
        raise MeshprofError(f"{path}: not a regular file (a link to a device, a FIFO?)")
    try:
        names = ("spans", "memory", "meta") if lean else ("events", "spans", "memory", "meta")
        got = None
        with zipfile.ZipFile(path) as zf:  # (its directory read once per file)
            if "inflight.npy" in zf.NameToInfo:  # (absent from files of earlier versions)
                names = (*names, "inflight")
            arrays = _read_npz(Path(path), names, zf)
            spans, memory = arrays["spans"], arrays["memory"]
            raw = parse_meta(bytes(arrays["meta"]).decode("utf-8"), shared_ranks)
            if lean and isinstance(raw, dict):
                groups = raw.get("groups") if isinstance(raw.get("groups"), list) else []
                import os

                fd = os.open(path, os.O_RDONLY)
                try:
                    got = _read_events_lean(zf, groups or [], sample_limit, fd)
                finally:
                    os.close(fd)
        if lean and isinstance(raw, dict):
            if got is None:
                raise MeshprofError(
                    f"{path}: rank file of another meshprof format (column layout differs)"
                )
            events, file_events = got
        else:
            events = arrays["events"] if "events" in arrays else np.zeros(0, EVENT_DTYPE)
    except FileNotFoundError:
        raise MeshprofError(f"{path}: no such file") from None
    except (
        zipfile.BadZipFile, ValueError, KeyError, OSError, EOFError, UnicodeDecodeError,
        TypeError, SyntaxError, RecursionError,  # a damaged .npy header (a literal to numpy)
    ) as e:  # fmt: skip
        raise MeshprofError(f"{path}: damaged rank file ({type(e).__name__}: {e})") from None
    ev_ok = lean or events.dtype == EVENT_DTYPE
    inflight = arrays.get("inflight")
    if inflight is None:
        inflight = np.zeros(0, dtype=EVENT_DTYPE)
    elif inflight.dtype != EVENT_DTYPE or inflight.ndim != 1:
        ev_ok = False
    if not ev_ok or spans.dtype != SPAN_DTYPE or memory.dtype != MEMORY_DTYPE:
        raise MeshprofError(f"{path}: rank file of another meshprof format (column layout differs)")
    if not isinstance(raw, dict):
        raise MeshprofError(f"{path}: damaged rank file (meta is not a JSON object)")
    try:
        meta = RankMeta.from_dict(raw, "meta")
    except RecordError as e:
        raise MeshprofError(f"{path}: damaged rank file ({e})") from None
    rank = int(meta.rank if meta.rank is not None else (int(m.group(1)) if m else -1))
    if file_events < 0:
        file_events = len(events)
    return RankData(
        rank=rank,
        events=events,
        spans=spans,
        memory=memory,
        meta=meta,
        file_events=file_events,
        inflight=inflight,
    )


def rank_data(
    prof: CommProfiler, monitor: Any = None, extra_meta: dict[str, Any] | None = None
) -> RankData:
    """Everything ``prof`` (and ``monitor``) hold now, as one rank file's content.

    Everything comes from one read of the recorder (:meth:`~meshprof.comm.recorder.CommProfiler.read`):
    the completed events go to ``events``, the collectives in flight at that instant to
    ``inflight`` (a collective in flight at one write is in ``events`` at a later one, and in
    one of the two only), and the statistics count both. Side tables keyed by event id in the
    recorder (errors, metadata) are re-keyed by the row index within the written ``events``
    array (as strings: the meta is JSON). ``extra_meta`` entries (RankMeta keys, or free-form
    ones kept in ``extra``) override the recorder's own.
    """
    reading = prof.read(stats=True)  # one instant: completed events, ops in flight, statistics
    events, ids = reading.events, reading.ids
    first_id = int(ids[0]) if len(ids) else 0
    log = prof.log
    errors = {str(i - first_id): text for i, text in list(log.errors.items()) if i >= first_id}
    metadata = {str(i - first_id): m for i, m in list(log.metadata.items()) if i >= first_id}
    stats = prof.accumulated_stats_dict(reading)
    meta = RankMeta.from_dict(prof.meta(reading))
    meta = meta.updated(
        format=RANK_FORMAT,
        dtypes=list(log.dtypes),
        labels=list(log.labels),
        errors=errors,
        metadata=metadata,
        stats=stats,
        first_event_id=first_id,
        span_names=[],
    )
    spans = np.zeros(0, dtype=SPAN_DTYPE)
    memory = np.zeros(0, dtype=MEMORY_DTYPE)
    if monitor is not None:
        spans, names = monitor.spans_array()
        memory = monitor.memory_array()
        meta = meta.updated(span_names=list(names), monitor=monitor.to_meta())
    if extra_meta:
        meta = meta.updated(**extra_meta)
    rank = int(meta.rank if meta.rank is not None else -1)
    return RankData(
        rank=max(rank, 0),
        events=events,
        spans=spans,
        memory=memory,
        meta=meta,
        inflight=reading.pending.rows,
    )


__all__ = [
    "LEAN_FIELDS",
    "RankData",
    "lean_events",
    "load_rank_file",
    "parse_meta",
    "rank_data",
    "write_rank_file",
]

"""The segment format: how a rank appends what it recorded, and how it is read back.

A rank keeps one folder, ``DIR/rankNNNNN/``. Each process that records the rank is a
*generation* (1, then one more per restart of the rank), and writes::

    g001-meta.json        RankMeta (+ its ``storage`` record): tables, statistics, exit; replaced
                          atomically when its tables change, every flush interval and at exit
    g001-000001.seg ...   segments: append-only, a new one every ``segment_bytes`` (or
                          ``segment_s``); the oldest are deleted by the retention bounds
    g001-steps.seg        per-step totals (STEP_TOTALS_DTYPE), kept for the whole run
    g001-cursor           16 bytes rewritten in place at every step change: the step the rank
                          is in and when it began (int64 each), for a rank killed mid-tick
    reserve               a few hundred KiB allocated up front, freed to write the last meta
                          when the disk fills up

A file is a sequence of *chunks*, each a 12-byte head (``b"MP"``, kind, version, payload length,
CRC-32 of the payload) and its payload. The first chunk is a JSON :class:`SegmentHeader` naming
the row layouts; then the rank writer appends one ``BATCH`` chunk per tick (every
:data:`TICK_S` seconds, when something is new): a :data:`BATCH_DTYPE` row (the tick's time, the
step the rank is in, the id of its first event, row counts), then the new event, span and
memory rows as packed arrays, the collectives in flight at the tick (EVENT_DTYPE rows of status
pending, duration -1: a rank's in-flight set is its last batch's; a change of the set alone
makes a batch), then the error texts and metadata of those events (JSON keyed by
event id). The steps file holds ``STEPS`` chunks of STEP_TOTALS_DTYPE rows. A serving rank
also appends a ``SERVING`` chunk per tick with something new: the requests finished since the
last one (REQUEST_DTYPE rows; at the last write, also those still running, reason
``unfinished``) and the token emissions (TOKEN_DTYPE rows), after a :data:`SERVING_HEAD`;
when some of those requests came with a W3C ``traceparent``, then a :data:`TRACES_HEAD` and
their REQUEST_TRACE_DTYPE rows (a chunk without them, as every chunk written before they
existed, ends after the token rows).

Nothing is ever rewritten: the bytes written per collective are the bytes stored. A process
killed without warning leaves everything it appended (the kernel keeps the page cache of a dead
process' writes), so it loses at most one tick; a chunk cut short by a crash or a full disk
fails its length or CRC check and ends the file for the reader.
"""

from __future__ import annotations

import functools
import json
import re
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from meshprof.events import (
    EVENT_DTYPE,
    MEMORY_DTYPE,
    REQUEST_DTYPE,
    REQUEST_TRACE_DTYPE,
    SPAN_DTYPE,
    STEP_TOTALS_DTYPE,
    TOKEN_DTYPE,
)
from meshprof.records.codec import RecordError
from meshprof.records.storage import SEGMENT_FORMAT, SegmentHeader
from meshprof.rundir.json_file import read_bytes
from meshprof.rundir.schema import RANK_DIR_RE, rank_dir

TICK_S = 0.5
"""Seconds between two appends of a rank's new rows: a rank killed by SIGKILL loses at most
this (plus the tick's own time)."""
MAGIC = b"MP"
VERSION = 1
HEAD = struct.Struct("<2sBBII")
"""A chunk's head: magic, kind, version, payload bytes, CRC-32 of the payload (12 bytes)."""
KIND_HEADER = 1
"""A JSON :class:`SegmentHeader` (the first chunk of every file)."""
KIND_BATCH = 2
"""One tick's new rows."""
KIND_STEPS = 3
"""STEP_TOTALS_DTYPE rows."""
KIND_SERVING = 4
"""One tick's finished requests and token emissions (a serving rank)."""
SERVING_HEAD = struct.Struct("<II")
"""A serving chunk's head: request rows, token rows (8 bytes)."""
TRACES_HEAD = struct.Struct("<I")
"""The head of a serving chunk's optional third table, after the token rows: request-trace
rows (4 bytes). Absent from a chunk without any (and from every chunk of earlier versions)."""

BATCH_DTYPE = np.dtype(
    [
        ("t_ns", np.int64),  # wall clock when the tick's flush began: complete up to it
        ("first_event_id", np.int64),  # recorder id of the batch's first event row
        ("step_ns", np.int64),  # when the step the rank is in began (wall clock)
        ("step", np.int32),  # the step the rank is in (-1 before the first)
        ("n_events", np.uint32),
        ("n_spans", np.uint32),
        ("n_memory", np.uint32),
        ("n_side", np.uint32),  # bytes of the JSON side table at the end of the payload
        ("lost_events", np.uint32),  # events the ring dropped before this tick could write them
        ("n_inflight", np.uint32),  # collectives in flight at the tick (rows after memory)
    ]
)
"""The fixed part of a batch (52 bytes)."""
_BATCH_COUNTS = struct.Struct("=28x4I4xI")
"""The row counts of :data:`BATCH_DTYPE` (n_events, n_spans, n_memory, n_side, n_inflight):
read with ``struct``, a tenth of the cost of five fields of a numpy record."""
assert _BATCH_COUNTS.size == BATCH_DTYPE.itemsize

DTYPES = {
    "events": EVENT_DTYPE,
    "spans": SPAN_DTYPE,
    "memory": MEMORY_DTYPE,
    "batch": BATCH_DTYPE,
    "steps": STEP_TOTALS_DTYPE,
}

SERVING_DTYPES = {
    "requests": REQUEST_DTYPE,
    "tokens": TOKEN_DTYPE,
    "request_traces": REQUEST_TRACE_DTYPE,
}
"""Layouts of the serving chunks' rows: in every header written since they exist; a file
without them (an earlier version) has no serving chunk, and one without ``request_traces`` (an
earlier version) no request-trace rows."""

SEGMENT_RE = re.compile(r"^g(\d+)-(\d+)\.seg$")
STEPS_RE = re.compile(r"^g(\d+)-steps\.seg$")
META_RE = re.compile(r"^g(\d+)-meta\.json$")
CURSOR_RE = re.compile(r"^g(\d+)-cursor$")
CURSOR = struct.Struct("<qq")
"""The cursor file: the step the rank is in, when it began (wall clock ns)."""
RESERVE = "reserve"


def segment_name(generation: int, index: int) -> str:
    return f"g{generation:03d}-{index:06d}.seg"


def steps_name(generation: int) -> str:
    return f"g{generation:03d}-steps.seg"


def meta_name(generation: int) -> str:
    return f"g{generation:03d}-meta.json"


def cursor_name(generation: int) -> str:
    return f"g{generation:03d}-cursor"


def join_rows(parts: list[np.ndarray], dtype: np.dtype) -> np.ndarray:
    """The rows of ``parts`` (arrays of ``dtype``) as one writable array: their bytes joined,
    which is 4× faster than ``np.concatenate`` for a rank's few dozen small batches (numpy
    promotes a structured dtype field by field on every call)."""
    if not parts:
        return np.zeros(0, dtype)
    buf = bytearray().join(np.ascontiguousarray(p, dtype).data.cast("B") for p in parts)
    return np.frombuffer(buf, dtype)


@functools.lru_cache(maxsize=64)
def dtype_text(dt: np.dtype) -> str:
    """A dtype's layout as text (what a segment header records; the same few every time)."""
    return json.dumps(dt.descr)


def header_chunk(header: SegmentHeader) -> bytes:
    """The JSON header chunk of a new file."""
    return chunk(KIND_HEADER, json.dumps(header.to_dict()).encode("utf-8"))


def new_header(
    rank: int, generation: int, index: int, pid: int, run_id: str | None, created_ns: int
) -> SegmentHeader:
    return SegmentHeader(
        format=SEGMENT_FORMAT,
        rank=rank,
        generation=generation,
        index=index,
        pid=pid,
        run_id=run_id,
        created_ns=created_ns,
        dtypes={name: dtype_text(dt) for name, dt in {**DTYPES, **SERVING_DTYPES}.items()},
    )


def chunk(kind: int, payload: bytes) -> bytes:
    """One chunk: head + payload."""
    return HEAD.pack(MAGIC, kind, VERSION, len(payload), zlib.crc32(payload)) + payload


def batch_payload(
    batch: np.ndarray,
    events: np.ndarray,
    spans: np.ndarray,
    memory: np.ndarray,
    side: bytes,
    inflight: np.ndarray | None = None,
) -> bytes:
    """A batch's payload: the fixed row, then the rows of each table (events, spans, memory,
    the collectives in flight at the tick), then the side table."""
    if inflight is None:
        inflight = np.zeros(0, dtype=EVENT_DTYPE)
    return b"".join(
        (
            batch.tobytes(),
            np.ascontiguousarray(events, dtype=EVENT_DTYPE).tobytes(),
            np.ascontiguousarray(spans, dtype=SPAN_DTYPE).tobytes(),
            np.ascontiguousarray(memory, dtype=MEMORY_DTYPE).tobytes(),
            np.ascontiguousarray(inflight, dtype=EVENT_DTYPE).tobytes(),
            side,
        )
    )


@dataclass(slots=True)
class Batch:
    """One decoded batch (arrays are read-only views of the file's bytes)."""

    info: np.void
    events: np.ndarray
    spans: np.ndarray
    memory: np.ndarray
    side: bytes
    inflight: np.ndarray
    """The collectives in flight at the tick (EVENT_DTYPE, status pending, duration -1): a
    rank's in-flight set is its last batch's."""


def decode_batch(payload: memoryview) -> Batch:
    """A batch chunk's payload, decoded; ValueError when its sizes do not add up."""
    b = BATCH_DTYPE.itemsize
    if len(payload) < b:
        raise ValueError("batch shorter than its fixed part")
    info = np.frombuffer(payload, BATCH_DTYPE, 1)[0]
    ne, ns, nm, nside, ni = _BATCH_COUNTS.unpack_from(payload)
    sizes = (
        ne * EVENT_DTYPE.itemsize,
        ns * SPAN_DTYPE.itemsize,
        nm * MEMORY_DTYPE.itemsize,
        ni * EVENT_DTYPE.itemsize,
    )
    if b + sum(sizes) + nside != len(payload):
        raise ValueError("batch sizes do not add up")
    o1 = b + sizes[0]
    o2 = o1 + sizes[1]
    o3 = o2 + sizes[2]
    o4 = o3 + sizes[3]
    return Batch(
        info=info,
        events=np.frombuffer(payload, EVENT_DTYPE, ne, b),
        spans=np.frombuffer(payload, SPAN_DTYPE, ns, o1),
        memory=np.frombuffer(payload, MEMORY_DTYPE, nm, o2),
        side=bytes(payload[o4:]),
        inflight=np.frombuffer(payload, EVENT_DTYPE, ni, o3),
    )


@dataclass(slots=True)
class FileChunks:
    """The chunks of one segment file that read whole."""

    header: SegmentHeader | None = None
    chunks: list[tuple[int, memoryview]] = field(default_factory=list)
    """(kind, payload) of every chunk after the header."""
    torn_bytes: int = 0
    """Bytes at the end that do not form a whole chunk (a write cut short)."""
    problem: str = ""
    """Why the file was not read ("" when it was)."""


def parse_header(kind: int, payload: memoryview, name: str) -> tuple[SegmentHeader | None, str]:
    """A file's first chunk as its :class:`SegmentHeader`, or why it is not one this version
    reads (``(None, problem)``: not a header, damaged, or rows of another layout)."""
    if kind != KIND_HEADER:
        return None, f"{name}: no segment header"
    try:
        header = SegmentHeader.from_dict(json.loads(bytes(payload)), name)
    except (ValueError, TypeError, RecursionError, RecordError) as e:
        return None, f"{name}: damaged segment header ({e})"
    if header.format != SEGMENT_FORMAT or not _known_layout(header.dtypes or {}):
        return None, f"{name}: segment of another meshprof format"
    return header, ""


def read_chunks(path: Path) -> FileChunks:
    """Every whole chunk of ``path``, up to the first one cut short or damaged. A file whose
    header names another layout is not read (its ``problem`` says why)."""
    out = FileChunks()
    try:
        data = memoryview(read_bytes(path, None))  # (a regular file: not a link to /dev/zero)
    except OSError as e:
        out.problem = f"{path.name}: {e.strerror or e}"
        return out
    pos, n = 0, len(data)
    while pos + HEAD.size <= n:
        magic, kind, version, size, crc = HEAD.unpack_from(data, pos)
        end = pos + HEAD.size + size
        if magic != MAGIC or version != VERSION or end > n:
            break
        payload = data[pos + HEAD.size : end]
        if zlib.crc32(payload) != crc:
            break
        if out.header is None:
            out.header, out.problem = parse_header(kind, payload, path.name)
            if out.problem:
                return out
        else:
            out.chunks.append((kind, payload))
        pos = end
    out.torn_bytes = n - pos
    if out.header is None and not out.problem and n:
        out.problem = f"{path.name}: damaged segment (no header)"
    return out


def _known_layout(dtypes: dict[str, str]) -> bool:
    """The header names this version's row layouts: every table of :data:`DTYPES`, and the
    serving tables where it has them."""
    for name, dt in DTYPES.items():
        if dtypes.get(name) != dtype_text(dt):
            return False
    extra = set(dtypes) - set(DTYPES)
    if not extra <= set(SERVING_DTYPES):
        return False
    return all(dtypes[name] == dtype_text(SERVING_DTYPES[name]) for name in extra)


def serving_payload(
    requests: np.ndarray, tokens: np.ndarray, traces: np.ndarray | None = None
) -> bytes:
    """A serving chunk's payload: the head, the request rows, the token rows; then, when
    ``traces`` has rows, their head and the request-trace rows."""
    parts = [
        SERVING_HEAD.pack(len(requests), len(tokens)),
        np.ascontiguousarray(requests, dtype=REQUEST_DTYPE).tobytes(),
        np.ascontiguousarray(tokens, dtype=TOKEN_DTYPE).tobytes(),
    ]
    if traces is not None and len(traces):
        parts.append(TRACES_HEAD.pack(len(traces)))
        parts.append(np.ascontiguousarray(traces, dtype=REQUEST_TRACE_DTYPE).tobytes())
    return b"".join(parts)


@dataclass(slots=True)
class ServingChunk:
    """One decoded serving chunk (read-only views of the file's bytes)."""

    requests: np.ndarray
    """REQUEST_DTYPE rows."""
    tokens: np.ndarray
    """TOKEN_DTYPE rows."""
    traces: np.ndarray
    """REQUEST_TRACE_DTYPE rows: the ``traceparent`` of those requests that had one (none in
    a chunk of an earlier version)."""


NO_TRACES = np.zeros(0, REQUEST_TRACE_DTYPE)
NO_TRACES.flags.writeable = False


def decode_serving(payload: memoryview) -> ServingChunk:
    """A serving chunk, decoded (with or without its request-trace table); ValueError when its
    sizes do not add up."""
    if len(payload) < SERVING_HEAD.size:
        raise ValueError("serving chunk shorter than its head")
    nr, nt = SERVING_HEAD.unpack_from(payload)
    o1 = SERVING_HEAD.size + nr * REQUEST_DTYPE.itemsize
    o2 = o1 + nt * TOKEN_DTYPE.itemsize
    n = len(payload)
    traces = NO_TRACES
    if o2 != n:
        if o2 + TRACES_HEAD.size > n:
            raise ValueError("serving chunk sizes do not add up")
        (nx,) = TRACES_HEAD.unpack_from(payload, o2)
        o3 = o2 + TRACES_HEAD.size
        if o3 + nx * REQUEST_TRACE_DTYPE.itemsize != n:
            raise ValueError("serving chunk sizes do not add up")
        traces = np.frombuffer(payload, REQUEST_TRACE_DTYPE, nx, o3)
    return ServingChunk(
        requests=np.frombuffer(payload, REQUEST_DTYPE, nr, SERVING_HEAD.size),
        tokens=np.frombuffer(payload, TOKEN_DTYPE, nt, o1),
        traces=traces,
    )


@dataclass(slots=True)
class RankFiles:
    """The files of one rank folder's newest generation."""

    generation: int
    meta: Path | None
    segments: list[Path]
    """Data segments, oldest first."""
    steps: Path | None
    cursor: Path | None = None
    older: int = 0
    """Generations before it (earlier processes of this rank, e.g. before a restart)."""


def scan_rank_dir(path: Path) -> RankFiles | None:
    """The newest generation's files in a rank folder (None when it holds none)."""
    try:
        names = [p.name for p in path.iterdir()]
    except OSError:
        return None
    gens: dict[int, RankFiles] = {}

    def gen(g: int) -> RankFiles:
        return gens.setdefault(g, RankFiles(g, None, [], None))

    seg_index: dict[Path, int] = {}
    for name in names:
        if m := SEGMENT_RE.match(name):
            p = path / name
            gen(int(m.group(1))).segments.append(p)
            seg_index[p] = int(m.group(2))
        elif m := STEPS_RE.match(name):
            gen(int(m.group(1))).steps = path / name
        elif m := META_RE.match(name):
            gen(int(m.group(1))).meta = path / name
        elif m := CURSOR_RE.match(name):
            gen(int(m.group(1))).cursor = path / name
    if not gens:
        return None
    newest = gens[max(gens)]
    newest.segments.sort(key=lambda p: seg_index[p])
    newest.older = len(gens) - 1
    return newest


def iter_batches(
    files: RankFiles,
    problems: list[str] | None = None,
    serving: list[ServingChunk] | None = None,
) -> Iterator[Batch]:
    """Every batch of the generation's segments, oldest first (a damaged batch ends its file;
    what could not be read is appended to ``problems``). ``serving``: the serving chunks are
    appended to it as they are read."""
    for seg in files.segments:
        got = read_chunks(seg)
        if got.problem:
            if problems is not None:
                problems.append(got.problem)
            continue
        for kind, payload in got.chunks:
            if kind == KIND_SERVING and serving is not None:
                try:
                    serving.append(decode_serving(payload))
                except ValueError as e:
                    if problems is not None:
                        problems.append(f"{seg.name}: {e}")
                    break
                continue
            if kind != KIND_BATCH:
                continue
            try:
                yield decode_batch(payload)
            except ValueError as e:
                if problems is not None:
                    problems.append(f"{seg.name}: {e}")
                break


def read_cursor(files: RankFiles) -> tuple[int, int] | None:
    """(step, step_ns) of the generation's cursor file; None when it has none."""
    if files.cursor is None:
        return None
    try:
        data = read_bytes(files.cursor, 1 << 16)
    except OSError:
        return None
    if len(data) < CURSOR.size:
        return None
    step, step_ns = CURSOR.unpack_from(data)
    return int(step), int(step_ns)


def read_step_totals(files: RankFiles) -> np.ndarray:
    """The generation's per-step totals (STEP_TOTALS_DTYPE), by step."""
    if files.steps is None:
        return np.zeros(0, STEP_TOTALS_DTYPE)
    got = read_chunks(files.steps)
    parts = [
        np.frombuffer(p, STEP_TOTALS_DTYPE)
        for k, p in got.chunks
        if k == KIND_STEPS and len(p) % STEP_TOTALS_DTYPE.itemsize == 0
    ]
    if not parts:
        return np.zeros(0, STEP_TOTALS_DTYPE)
    rows = join_rows(parts, STEP_TOTALS_DTYPE)
    return rows[np.argsort(rows["step"], kind="stable")]


__all__ = [
    "BATCH_DTYPE",
    "CURSOR",
    "KIND_BATCH",
    "KIND_HEADER",
    "KIND_SERVING",
    "KIND_STEPS",
    "RANK_DIR_RE",
    "RESERVE",
    "SERVING_DTYPES",
    "SERVING_HEAD",
    "TICK_S",
    "TRACES_HEAD",
    "Batch",
    "FileChunks",
    "RankFiles",
    "ServingChunk",
    "batch_payload",
    "chunk",
    "cursor_name",
    "decode_batch",
    "decode_serving",
    "header_chunk",
    "iter_batches",
    "meta_name",
    "new_header",
    "parse_header",
    "rank_dir",
    "read_chunks",
    "read_cursor",
    "read_step_totals",
    "scan_rank_dir",
    "segment_name",
    "serving_payload",
    "steps_name",
]

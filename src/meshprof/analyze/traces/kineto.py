"""Reading torch.profiler (Kineto) Chrome traces: where each rank's profiled time went.

A Kineto trace (``.json`` or ``.json.gz``, as ``torch.profiler`` exports it) holds complete
events (``"ph": "X"``) with ``ts``/``dur`` in microseconds; ``baseTimeNanoseconds`` + ``ts``·1000
is the wall clock (``time.time_ns``) of the profiled process, the clock meshprof's recorder uses.

On a trace with GPU events ("device" basis) the figures are Holistic Trace Analysis' temporal
breakdown and communication/computation overlap over the GPU kernel span, plus exposed
communication, memory copies, per iteration, per stream and per collective: see
:mod:`meshprof.analyze.traces.gpu_breakdown` for the definitions. The split fields below then read:
window = the kernel span, computation = union of computation kernels, communication = exposed
communication (outside computation), other = the rest (idle, copies, synchronization).

On a CPU-only trace ("host" basis; HTA reports nothing there), per trace file, summed over a
rank's files:

* **window** — from the first event's start to the last event's end (ops, annotations).
* **communication** — the union of the intervals of collective events: CPU ops whose name
  contains one of :data:`COMM_MARKERS` ("nccl", "gloo", "c10d::", "record_param_comms", ...).
* **computation** — the union of every other op interval, minus the time already counted as
  communication (so an op that encloses a collective is not counted twice).
* **other** — the rest of the window (Python, data loading, idle, waiting).

computation + communication + other = window on both bases.
"""

from __future__ import annotations

import functools
import gc
import itertools
import json
import os
import re
import sys
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from meshprof.analyze.compute import intervals
from meshprof.analyze.traces.gpu_breakdown import (
    GpuBreakdown,
    KernelStragglers,
    gpu_breakdown,
    kernel_stragglers,
)
from meshprof.analyze.traces.kineto_load import fast_trace, trace_columns
from meshprof.errors import MeshprofError, NotATraceError
from meshprof.rundir.json_file import read_bytes

#: Lower-case substrings that mark an event as communication.
COMM_MARKERS: tuple[str, ...] = (
    "nccl",
    "gloo",
    "c10d::",
    "c10d_functional",
    "record_param_comms",
    "allreduce",
    "all_reduce",
    "allgather",
    "all_gather",
    "reduce_scatter",
    "reducescatter",
    "alltoall",
    "all_to_all",
    "sendrecv",
)
DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
HOST_CATS = frozenset({"cpu_op", "user_annotation", "python_function"})
_RANK_RE = re.compile(r"rank[_-]?(\d+)")
#: First track id given to the tracks of a merged Kineto trace.
KINETO_TID_BASE = 1000
_STEP_RE = re.compile(r"^ProfilerStep#\d+$")


@dataclass(frozen=True, slots=True)
class KinetoBreakdown:
    """Where one rank's profiled time went, from its torch.profiler traces (nanoseconds)."""

    rank: int
    """Global rank (``distributedInfo.rank`` in the trace, else ``rank<N>`` in the file name)."""
    paths: tuple[str, ...]
    """The trace files read for this rank."""
    basis: str
    """"device" (GPU kernels counted) or "host" (CPU ops counted)."""
    window_ns: int
    """Sum over the files of (last event end − first event start)."""
    compute_ns: int
    """Union of non-communication op/kernel intervals, outside communication."""
    comm_ns: int
    """Union of communication op/kernel intervals."""
    other_ns: int
    """window − compute − communication."""
    comm_events: int
    """Number of communication events counted."""
    start_ns: int
    """Wall clock of the first event (this rank's clock)."""
    rank_source: str = "metadata"
    """Where the rank came from: "metadata" (``distributedInfo.rank``), "file name" or "default"."""
    gpu: GpuBreakdown | None = None
    """The GPU breakdown on HTA's definitions (device basis); None on a CPU-only trace."""

    @property
    def compute_share(self) -> float:
        return self.compute_ns / self.window_ns if self.window_ns else 0.0

    @property
    def comm_share(self) -> float:
        return self.comm_ns / self.window_ns if self.window_ns else 0.0

    @property
    def other_share(self) -> float:
        return self.other_ns / self.window_ns if self.window_ns else 0.0

    def to_dict(self) -> dict[str, Any]:
        """``kineto.ranks[i]`` of ``report --json``: HTA's figures at the top (None on the host
        basis), then the split, iterations, streams and collectives."""
        g = self.gpu
        t = g.total if g is not None else None
        d: dict[str, Any] = {
            "rank": self.rank,
            "rank_source": self.rank_source,
            "paths": list(self.paths),
            "basis": self.basis,
            "idle_pct": t.idle_pct if t else None,
            "compute_pct": t.compute_pct if t else None,
            "non_compute_pct": t.non_compute_pct if t else None,
            "comm_comp_overlap_pct": t.comm_comp_overlap_pct if t else None,
            "exposed_comm_ns": t.exposed_comm_ns if t else None,
            "exposed_comm_pct": t.exposed_comm_pct if t else None,
            "memcpy_ns": t.memcpy_ns if t else None,
            "memset_ns": t.memset_ns if t else None,
            "window_ns": self.window_ns,
            "compute_ns": self.compute_ns,
            "comm_ns": self.comm_ns,
            "other_ns": self.other_ns,
            "comm_events": self.comm_events,
            "start_ns": self.start_ns,
            "compute_share": self.compute_share,
            "comm_share": self.comm_share,
            "other_share": self.other_share,
        }
        if g is not None:
            d["gpu"] = g.total.to_dict() | {
                "last_step_dropped": g.last_step_dropped,
                "excluded_events": g.excluded,
            }
            d["iterations"] = [i.to_dict() for i in g.iterations]
            d["streams"] = [x.to_dict() for x in g.streams]
            d["collectives"] = [c.to_dict() for c in g.collectives]
        return d


@dataclass(frozen=True, slots=True)
class KinetoReport:
    """Every rank's breakdown from a set of trace files, what could not be read, and the
    kernel-level straggler."""

    ranks: tuple[KinetoBreakdown, ...]
    """Sorted by rank."""
    problems: tuple[str, ...] = ()
    """Files not read, each "path: why" (truncated, not JSON, ...)."""
    notes: tuple[str, ...] = ()
    """Several files claiming one rank, and how they were read."""
    stragglers: KernelStragglers | None = None
    """Whose computation kernels take longest per iteration (device basis, two ranks or more)."""
    found: bool = True
    """Trace files were found (False: the run directory holds none, and the rest is empty)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "ranks": [b.to_dict() for b in self.ranks],
            "problems": list(self.problems),
            "notes": list(self.notes),
            "stragglers": self.stragglers.to_dict() if self.stragglers else None,
        }


def _loads(raw: bytes) -> Any:
    """Parse JSON with orjson when it is installed (the ``fast`` extra; ~3× faster on big
    traces), else the standard library."""
    try:
        import orjson
    except ImportError:
        return json.loads(raw.decode("utf-8"))
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        # Kineto may write NaN/Infinity, which only the standard library accepts
        return json.loads(raw.decode("utf-8"))


def load_trace(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a Chrome/Kineto trace (``.json`` or gzip-compressed). Bad files raise MeshprofError."""
    return _parse_trace(path, _trace_bytes(path))


def _trace_bytes(path: str | os.PathLike[str]) -> bytes:
    """The file's bytes, gunzipped when compressed."""
    p = Path(path)
    try:
        raw = read_bytes(p, None)  # (a regular file: not a link to /dev/zero)
    except FileNotFoundError:
        raise MeshprofError(f"{p}: no such trace file") from None
    except OSError as e:
        raise MeshprofError(f"{p}: cannot read ({e})") from None
    try:
        return _gunzip(raw, p) if raw[:2] == b"\x1f\x8b" else raw
    except (OSError, EOFError, ValueError, zlib.error) as e:
        raise MeshprofError(f"{p}: not a JSON trace ({type(e).__name__}: {e})") from None


GZIP_RATIO = 200
"""A gzipped trace is read up to this many times its compressed size (plus 64 MiB): Kineto's
JSON compresses 10–30×; a file that expands further is a bomb, not a trace."""


def _gunzip(raw: bytes, p: Path) -> bytes:
    """``raw`` gunzipped, at most :data:`GZIP_RATIO` × its size (``ValueError`` past it)."""
    limit = GZIP_RATIO * len(raw) + (64 << 20)
    out = bytearray()
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    data = raw
    while data:
        out += d.decompress(data, limit + 1 - len(out))
        if len(out) > limit:
            raise ValueError(f"expands past {limit:,} bytes ({GZIP_RATIO}× its size)")
        data = d.unconsumed_tail
        if d.eof:
            data = d.unused_data  # (a second gzip member follows: gzip's own rule)
            if data[:2] != b"\x1f\x8b":
                break
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    if not d.eof:
        raise EOFError("compressed file ended before the end-of-stream marker was reached")
    return bytes(out)


def _parse_trace(path: str | os.PathLike[str], raw: bytes) -> dict[str, Any]:
    p = Path(path)
    try:
        data = _loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise MeshprofError(f"{p}: not a JSON trace ({type(e).__name__}: {e})") from None
    except RecursionError:
        raise MeshprofError(f"{p}: not a JSON trace (nested too deep)") from None
    if isinstance(data, list):
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise NotATraceError(p)
    return data


@functools.lru_cache(maxsize=65536)
def is_comm_name(name: str) -> bool:
    """Whether an op or kernel name is a collective (see :data:`COMM_MARKERS`); memoized, since a
    trace repeats a few thousand distinct names over millions of events."""
    n = name.lower()
    return any(m in n for m in COMM_MARKERS)


def trace_rank(data: dict[str, Any], path: str | os.PathLike[str]) -> int:
    """The rank a trace belongs to: ``distributedInfo.rank``, else ``rank<N>`` in the file
    name, else 0."""
    return trace_rank_source(data, path)[0]


def trace_rank_source(data: dict[str, Any], path: str | os.PathLike[str]) -> tuple[int, str]:
    """(rank, where it came from: "metadata", "file name" or "default")."""
    info = data.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return int(info["rank"]), "metadata"
    m = _RANK_RE.search(Path(path).name)
    return (int(m.group(1)), "file name") if m else (0, "default")


def _intervals(
    events: Iterable[dict[str, Any]], base_ns: int
) -> tuple[np.ndarray, np.ndarray, list[str], list[str]]:
    starts, ends, names, cats = [], [], [], []
    for e in events:
        if e.get("ph") != "X":
            continue
        try:
            ts = float(e["ts"])
            dur = float(e.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            continue
        s = base_ns + round(ts * 1000.0)
        starts.append(s)
        ends.append(s + max(round(dur * 1000.0), 0))
        names.append(str(e.get("name", "")))
        cats.append(str(e.get("cat", "")))
    return np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64), names, cats


def breakdown_of(data: dict[str, Any]) -> tuple[str, int, int, int, int, int]:
    """(basis, window, compute, communication, comm events, first start) of one loaded trace."""
    base = int(data.get("baseTimeNanoseconds", 0) or 0)
    s, e, names, cats = _intervals(data["traceEvents"], base)
    cat_arr = np.array(cats, dtype=object)
    counted = (
        np.isin(cat_arr, list(HOST_CATS | DEVICE_CATS)) if len(cats) else np.zeros(0, dtype=bool)
    )
    if not counted.any():
        return "host", 0, 0, 0, 0, 0
    window_start, window_end = int(s[counted].min()), int(e[counted].max())
    device = np.isin(cat_arr, list(DEVICE_CATS))
    basis = "device" if device.any() else "host"
    if basis == "device":
        ops = device
    else:
        # ProfilerStep#N annotations span whole steps: they are the window, not computation
        ops = np.isin(cat_arr, ["cpu_op", "user_annotation"]) & ~np.array(
            [bool(_STEP_RE.match(n)) for n in names], dtype=bool
        )
    comm_mask = ops & np.array([is_comm_name(n) for n in names], dtype=bool)
    comp_mask = ops & ~comm_mask
    comm = intervals.total(s[comm_mask], e[comm_mask])
    both = intervals.total(
        np.concatenate([s[comm_mask], s[comp_mask]]), np.concatenate([e[comm_mask], e[comp_mask]])
    )
    compute = both - comm
    return basis, window_end - window_start, compute, comm, int(comm_mask.sum()), window_start


@dataclass(frozen=True, slots=True)
class _FileResult:
    path: str
    rank: int
    rank_source: str
    split: tuple[str, int, int, int, int, int]
    gpu: GpuBreakdown | None
    error: str = ""
    not_a_trace: bool = False


def _read_one(path: str, hta_rounding: bool = False) -> _FileResult:
    """One file reduced to its breakdown; a bad file gives its error instead of raising. The
    cyclic garbage collector is paused meanwhile: parsing creates millions of containers and
    no cycles, and its passes over them cost a third of the time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _read_one_gc_off(path, hta_rounding)
    finally:
        if enabled:
            gc.enable()


def _read_one_gc_off(path: str, hta_rounding: bool) -> _FileResult:
    try:
        raw = _trace_bytes(path)
        fast = fast_trace(raw, hta_rounding)  # GPU traces with msgspec: no dict per event
        if fast is not None:
            cols, data = fast
        else:
            data = _parse_trace(path, raw)
            cols = None
    except MeshprofError as e:
        return _FileResult(
            path, -1, "", ("host", 0, 0, 0, 0, 0), None, str(e), isinstance(e, NotATraceError)
        )
    del raw
    if isinstance(data.get("metadata"), dict) and data["metadata"].get("meshprof"):
        return _FileResult(
            path, -1, "", ("host", 0, 0, 0, 0, 0), None, "meshprof's own trace", True
        )
    rank, source = trace_rank_source(data, path)
    if cols is None:
        cols = trace_columns(data["traceEvents"], hta_rounding)
    gpu = gpu_breakdown(cols)
    if gpu is None:
        split = breakdown_of(data)
    else:
        t = gpu.total
        start = int(data.get("baseTimeNanoseconds", 0) or 0) + int(cols.dev_start.min())
        comm_events = sum(c.kernels for c in gpu.collectives)
        split = ("device", t.span_ns, t.compute_ns, t.exposed_comm_ns, comm_events, start)
    return _FileResult(path, rank, source, split, gpu)


PARALLEL_MIN_BYTES = 32 << 20
"""Read traces in parallel processes (one per core) when they add up to more than this."""


def _read_all(
    paths: Sequence[str | os.PathLike[str]], hta_rounding: bool = False
) -> list[_FileResult]:
    """Parse every trace and reduce it to its breakdown; several files go to a pool of forked
    processes (parsing JSON is CPU-bound and holds the GIL). Only the small breakdowns come
    back. Falls back to this process when forking is not safe (torch already imported: its
    threads do not survive a fork) or not possible; results are the same either way."""
    names = [str(p) for p in paths]
    cores = os.cpu_count() or 1
    try:
        total = sum(os.path.getsize(p) for p in names)
    except OSError:
        total = 0
    if len(names) > 1 and cores > 1 and total >= PARALLEL_MIN_BYTES and "torch" not in sys.modules:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        try:
            ctx = mp.get_context("fork")
            with ProcessPoolExecutor(max_workers=min(cores, len(names)), mp_context=ctx) as pool:
                return list(pool.map(_read_one, names, [hta_rounding] * len(names)))
        except Exception:
            pass  # no fork here: read in this process
    return [_read_one(p, hta_rounding) for p in names]


def _overlapping(items: list[_FileResult]) -> bool:
    spans = sorted((r.split[5] + (r.gpu.total.span_ns if r.gpu else 0), r.split[5]) for r in items)
    return False if len(spans) < 2 else any(a[1] < b[0] for a, b in itertools.pairwise(spans))


def kineto_report(
    paths: Sequence[str | os.PathLike[str]], hta_rounding: bool = False
) -> KinetoReport:
    """Every rank's breakdown from torch.profiler trace files (several files of one rank, e.g.
    one per active window, are summed), the files that could not be read, the ranks claimed by
    several files, and the kernel-level straggler. Files that are JSON but no trace (a config, a
    comm log) are left out quietly. ``hta_rounding``: round sub-µs times as HTA 0.5 does
    (:mod:`meshprof.analyze.traces.kineto_load`)."""
    per: dict[int, list[_FileResult]] = {}
    problems: list[str] = []
    for r in _read_all(paths, hta_rounding):
        if r.error:
            if not r.not_a_trace:
                problems.append(r.error)
            continue
        per.setdefault(r.rank, []).append(r)
    out: list[KinetoBreakdown] = []
    notes: list[str] = []
    for rank in sorted(per):
        items = per[rank]
        if len(items) > 1:
            names = ", ".join(Path(r.path).name for r in items)
            notes.append(
                f"rank {rank} claimed by {len(items)} files ({names}): "
                + (
                    "their times overlap, so they may be different processes; summed as one rank"
                    if _overlapping(items)
                    else "read as successive windows of one rank and summed"
                )
            )
        basis = "device" if any(r.split[0] == "device" for r in items) else "host"
        use = [r for r in items if r.split[0] == basis]
        window = sum(r.split[1] for r in use)
        compute = sum(r.split[2] for r in use)
        comm = sum(r.split[3] for r in use)
        starts = [r.split[5] for r in use if r.split[1] > 0]
        gpu = None
        for r in use:
            if r.gpu is not None:
                gpu = r.gpu if gpu is None else gpu + r.gpu
        out.append(
            KinetoBreakdown(
                rank=rank,
                paths=tuple(r.path for r in items),
                basis=basis,
                window_ns=window,
                compute_ns=compute,
                comm_ns=comm,
                other_ns=window - compute - comm,
                comm_events=sum(r.split[4] for r in use),
                start_ns=min(starts) if starts else 0,
                rank_source=items[0].rank_source,
                gpu=gpu,
            )
        )
    strag = kernel_stragglers([(b.rank, b.gpu) for b in out if b.gpu is not None])
    return KinetoReport(tuple(out), tuple(problems), tuple(notes), strag)


def kineto_breakdown(paths: Sequence[str | os.PathLike[str]]) -> list[KinetoBreakdown]:
    """Per rank breakdowns of torch.profiler trace files (see :func:`kineto_report`), sorted by
    rank. A file that cannot be read, or is no trace, raises :class:`MeshprofError`."""
    rep = kineto_report(paths)
    if rep.problems:
        raise MeshprofError(rep.problems[0])
    bad = [str(p) for p in paths if str(p) not in {q for b in rep.ranks for q in b.paths}]
    if bad:
        raise NotATraceError(Path(bad[0]))
    return list(rep.ranks)


_TRACE_SUFFIXES = (".json", ".json.gz")
_NOT_TRACES = frozenset({"manifest.json"})


def find_traces(run_dir: str | os.PathLike[str]) -> list[Path]:
    """Candidate torch.profiler traces in a folder, directly in it or in ``traces/``: every
    ``*.json`` and ``*.json.gz`` but meshprof's manifest (``trace_rank{r}_step{s}.json.gz`` of
    ``@performance_monitor``, ``*.pt.trace.json`` of ``tensorboard_trace_handler``, any other
    name). Whether a file is a trace is decided when it is read (:func:`kineto_report`)."""
    d = Path(run_dir)
    found: list[Path] = []
    for sub in (d, d / "traces"):
        if sub.is_dir():
            found += [
                f
                for f in sorted(sub.iterdir())
                if f.name.endswith(_TRACE_SUFFIXES) and f.name not in _NOT_TRACES and f.is_file()
            ]
    return found


def kineto_events(
    path: str | os.PathLike[str], rank: int, offset_ns: int, origin_ns: int = 0
) -> list[dict[str, Any]]:
    """The trace's events for merging into meshprof's Perfetto trace: ``pid`` = ``rank``, times
    moved onto the aligned clock (``aligned = local + offset_ns``) and given in µs from
    ``origin_ns`` (the merged trace's time zero; 0 keeps absolute wall-clock µs).

    Complete ("X"), instant ("i"), counter ("C") and flow ("s"/"t"/"f") events are kept; thread
    names are carried over as metadata. The original tracks (threads, CUDA streams, some named by
    strings) become integer track ids from :data:`KINETO_TID_BASE` up, clear of meshprof's own
    tracks; flow ids are made unique per rank.
    """
    data = load_trace(path)
    base = int(data.get("baseTimeNanoseconds", 0) or 0)
    shift_us = (base + offset_ns - origin_ns) / 1000.0
    tids: dict[Any, int] = {}
    names: dict[Any, str] = {}

    def tid_of(t: Any) -> int:
        if t not in tids:
            tids[t] = KINETO_TID_BASE + len(tids)
        return tids[t]

    out: list[dict[str, Any]] = []
    for e in data["traceEvents"]:
        if not isinstance(e, dict):
            continue
        ph = e.get("ph")
        if ph == "M":
            if e.get("name") == "thread_name":
                names[e.get("tid")] = str((e.get("args") or {}).get("name", e.get("tid")))
            continue
        if ph not in ("X", "i", "I", "C", "s", "t", "f") or "ts" not in e:
            continue
        try:
            ts = float(e["ts"]) + shift_us
        except (TypeError, ValueError):
            continue
        ev = dict(e)
        ev["ts"] = round(ts, 3)
        ev["pid"] = rank
        ev["tid"] = tid_of(e.get("tid", 0))
        if ph in ("s", "t", "f") and "id" in ev:
            ev["id"] = f"kineto-{rank}-{ev['id']}"
        out.append(ev)
    for t, i in tids.items():
        label = names.get(t, str(t))
        out.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": rank,
                "tid": i,
                "args": {"name": f"torch.profiler {label}"},
            }
        )
    return out


__all__ = [
    "COMM_MARKERS",
    "KINETO_TID_BASE",
    "KinetoBreakdown",
    "KinetoReport",
    "find_traces",
    "is_comm_name",
    "kineto_breakdown",
    "kineto_events",
    "kineto_report",
    "load_trace",
]

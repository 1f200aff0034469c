"""Reading torch.profiler (Kineto) Chrome traces: where each rank's profiled time went.

A Kineto trace (``.json`` or ``.json.gz``, as ``torch.profiler`` exports it) holds complete
events (``"ph": "X"``) with ``ts``/``dur`` in microseconds; ``baseTimeNanoseconds`` + ``ts``·1000
is the wall clock (``time.time_ns``) of the profiled process, the clock meshprof's recorder uses.

Definitions (per trace file, summed over a rank's files):

* **window** — from the first event's start to the last event's end (ops, kernels, annotations).
* **communication** — the union of the intervals of collective events: kernels or CPU ops whose
  name contains one of :data:`COMM_MARKERS` ("nccl", "gloo", "c10d::", "record_param_comms", ...).
* **computation** — the union of every other op/kernel interval, minus the time already counted as
  communication (so an op that encloses a collective is not counted twice).
* **other** — the rest of the window (Python, data loading, idle, waiting for the GPU).

On a trace with GPU kernels only the kernels (and memcpy/memset) are counted ("device" basis);
on a CPU-only trace the CPU ops are ("host" basis). computation + communication + other = window.
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from meshprof.analyze import intervals
from meshprof.errors import MeshprofError

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
        return {
            "rank": self.rank,
            "paths": list(self.paths),
            "basis": self.basis,
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
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise MeshprofError(f"{p}: no such trace file") from None
    except OSError as e:
        raise MeshprofError(f"{p}: cannot read ({e})") from None
    try:
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        data = _loads(raw)
    except (OSError, EOFError, ValueError, UnicodeDecodeError) as e:
        raise MeshprofError(f"{p}: not a JSON trace ({type(e).__name__}: {e})") from None
    if isinstance(data, list):
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise MeshprofError(f"{p}: no traceEvents list (not a torch.profiler trace)")
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
    info = data.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return int(info["rank"])
    m = _RANK_RE.search(Path(path).name)
    return int(m.group(1)) if m else 0


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


def _read_one(path: str) -> tuple[str, int, tuple[str, int, int, int, int, int]]:
    data = load_trace(path)
    return path, trace_rank(data, path), breakdown_of(data)


PARALLEL_MIN_BYTES = 32 << 20
"""Read traces in parallel processes (one per core) when they add up to more than this."""


def _read_all(
    paths: Sequence[str | os.PathLike[str]],
) -> list[tuple[str, int, tuple[str, int, int, int, int, int]]]:
    """Parse every trace and reduce it to its breakdown; several files go to a pool of forked
    processes (parsing JSON is CPU-bound and holds the GIL). Only the small breakdown tuples come
    back. Falls back to this process when forking is not safe (torch already imported: its
    threads do not survive a fork) or not possible; errors are the same either way."""
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
                return list(pool.map(_read_one, names))
        except MeshprofError:
            raise
        except Exception:
            pass  # no fork here: read in this process
    return [_read_one(p) for p in names]


def kineto_breakdown(paths: Sequence[str | os.PathLike[str]]) -> list[KinetoBreakdown]:
    """Computation / communication / other time per rank from torch.profiler trace files
    (several files of one rank, e.g. one per active window, are summed). Sorted by rank."""
    per: dict[int, list[tuple[str, tuple[str, int, int, int, int, int]]]] = {}
    for p, rank, b in _read_all(paths):
        per.setdefault(rank, []).append((p, b))
    out = []
    for rank in sorted(per):
        items = per[rank]
        basis = "device" if any(b[0] == "device" for _, b in items) else "host"
        window = sum(b[1] for _, b in items)
        compute = sum(b[2] for _, b in items)
        comm = sum(b[3] for _, b in items)
        starts = [b[5] for _, b in items if b[1] > 0]
        out.append(
            KinetoBreakdown(
                rank=rank,
                paths=tuple(p for p, _ in items),
                basis=basis,
                window_ns=window,
                compute_ns=compute,
                comm_ns=comm,
                other_ns=window - compute - comm,
                comm_events=sum(b[4] for _, b in items),
                start_ns=min(starts) if starts else 0,
            )
        )
    return out


_TRACE_NAME = re.compile(r"^(trace_rank\d+.*|.*\.pt\.trace)\.json(\.gz)?$")


def find_traces(run_dir: str | os.PathLike[str]) -> list[Path]:
    """torch.profiler traces in a run directory, directly in it or in ``traces/``:
    ``trace_rank{r}_step{s}.json[.gz]`` (``@performance_monitor``) and ``*.pt.trace.json[.gz]``
    (``torch.profiler.tensorboard_trace_handler``). meshprof's own merged trace is not one."""
    d = Path(run_dir)
    found: list[Path] = []
    for sub in (d, d / "traces"):
        if sub.is_dir():
            found += [f for f in sorted(sub.iterdir()) if _TRACE_NAME.match(f.name)]
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
    "find_traces",
    "is_comm_name",
    "kineto_breakdown",
    "kineto_events",
    "load_trace",
]

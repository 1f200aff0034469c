"""Reading a torch.profiler (Kineto) trace into columns: only what the GPU breakdown needs.

One pass over the trace's events keeps, as numpy columns (times in ns from the trace's ``ts``
zero, ``ts``/``dur`` being µs):

* **device events** — complete events of the GPU categories (:data:`DEVICE_CATS`) with a stream
  (``args.stream``, as Holistic Trace Analysis reads it): start, end, stream, correlation id, kernel
  class (:class:`KernelClass`) and the collective named in the kernel's own args, if any;
* **launches** — host events carrying ``args.correlation`` (``cudaLaunchKernel``, ``cudaMemcpyAsync``,
  ...): start, correlation id, thread;
* **steps** — ``ProfilerStep#N`` annotations: N, start, end (and the starts of their GPU-side
  copies, ``gpu_user_annotation``);
* **record_param_comms** — c10d's host record of each collective: start, end, thread, and its
  ``Collective name``.

Everything else (CPU ops, Python functions, flows) is skipped without being converted.

``hta_rounding`` reproduces HTA 0.5's parser on traces with sub-µs times (any ``ts`` written as a
fraction): every start is rounded up and every end down to a whole µs (HTA's fix for events that
overlap by rounding error, pytorch/pytorch#122425). It shortens each GPU event by up to 1 µs, so on
short kernels HTA's idle time is larger than the trace says; meshprof keeps ns by default.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import numpy as np

#: Event categories that run on the GPU (Kineto's names, and HTA's alternate spellings).
DEVICE_CATS = frozenset(
    {
        "kernel",
        "Kernel",
        "gpu_memcpy",
        "Memcpy",
        "gpu_memset",
        "Memset",
        "cuda_sync",
        "mtia_ccp_events",
    }
)
_STEP_RE = re.compile(r"^ProfilerStep\s*#\s*(\d+)$")
#: NCCL and RCCL kernels, including NCCL ≥ 2.19's ``ncclDevKernel_*`` (HTA: ``^nccl.*Kernel``).
COMM_KERNEL_RE = re.compile(r"^(nccl|rccl).*Kernel")
#: Memory kernels (HTA: ``^Memcpy|^Memset|^dma``).
MEMORY_KERNEL_RE = re.compile(r"^(Memcpy|Memset|dma)")
#: Names HTA keeps out of computation besides the above (copies named inside, synchronization).
NOT_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*Memcpy)|(^Memset)|(.*Sync)")


class KernelClass(IntEnum):
    """What a GPU event does, from its name (Holistic Trace Analysis' kernel types, with its
    ``MEMORY`` split into copies and sets)."""

    COMPUTATION = 0
    COMMUNICATION = 1
    MEMCPY = 2
    MEMSET = 3
    OTHER = 4
    """Synchronization events and kernels whose name holds "Memcpy" or "Sync" later on."""


@functools.lru_cache(maxsize=65536)
def kernel_class(name: str) -> KernelClass:
    """The class of a GPU event by its name, as HTA's ``get_kernel_type`` decides it."""
    if COMM_KERNEL_RE.match(name):
        return KernelClass.COMMUNICATION
    if MEMORY_KERNEL_RE.match(name):
        return KernelClass.MEMSET if name.startswith("Memset") else KernelClass.MEMCPY
    if NOT_COMPUTE_RE.match(name):
        return KernelClass.OTHER
    return KernelClass.COMPUTATION


@dataclass(frozen=True, slots=True)
class TraceColumns:
    """The parts of one trace the GPU breakdown reads (times in ns from the trace's ts zero)."""

    dev_start: np.ndarray
    """int64: device event starts."""
    dev_end: np.ndarray
    """int64: device event ends."""
    dev_stream: np.ndarray
    """int64: CUDA stream of each device event."""
    dev_corr: np.ndarray
    """int64: correlation id (-1 without)."""
    dev_class: np.ndarray
    """int8: :class:`KernelClass` of each device event."""
    dev_coll: np.ndarray
    """int32: index into :attr:`collectives` of the collective named in the kernel's args, -1."""
    launch_start: np.ndarray
    """int64: start of each host event with a correlation id."""
    launch_corr: np.ndarray
    """int64: its correlation id."""
    launch_tid: np.ndarray
    """int32: its thread (an index of this trace's threads)."""
    step_num: np.ndarray
    """int64: N of each ``ProfilerStep#N``."""
    step_start: np.ndarray
    """int64."""
    step_end: np.ndarray
    """int64."""
    gpu_step_start: np.ndarray
    """int64: starts of the GPU-side copies of ``ProfilerStep#N`` (``gpu_user_annotation``); HTA
    counts them among the steps when it finds where the last one starts."""
    rpc_start: np.ndarray
    """int64: ``record_param_comms`` starts."""
    rpc_end: np.ndarray
    """int64."""
    rpc_tid: np.ndarray
    """int32: thread index."""
    rpc_coll: np.ndarray
    """int32: index into :attr:`collectives`, -1 without a name."""
    collectives: tuple[str, ...]
    """Collective names met (``Collective name`` args)."""


def _ns(ts: list[Any], dur: list[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """(start ns, end ns, valid, any start with a sub-µs fraction) from raw µs values; the
    conversion is vectorized, with an element-wise fallback for odd values (None, strings)."""
    try:
        t = np.asarray(ts, dtype=np.float64)
        d = np.asarray(dur, dtype=np.float64)
        ok = np.isfinite(t) & np.isfinite(d)
    except (TypeError, ValueError):
        t = np.array([_num(x) for x in ts], dtype=np.float64)
        d = np.array([_num(x) for x in dur], dtype=np.float64)
        ok = np.isfinite(t) & np.isfinite(d)
    t = np.where(ok, t, 0.0)
    d = np.where(ok, d, 0.0)
    s = np.rint(t * 1000.0).astype(np.int64)
    e = s + np.maximum(np.rint(d * 1000.0).astype(np.int64), 0)
    frac = bool(len(t)) and bool(np.any(t != np.floor(t)))
    return s, e, ok, frac


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def _hta_round(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = -((-start) // 1000) * 1000
    e = (end // 1000) * 1000
    return s, np.maximum(e, s)


class _Lists:
    """The raw values one pass collects (filled by either loop below)."""

    def __init__(self) -> None:
        self.d_ts: list[Any] = []
        self.d_dur: list[Any] = []
        self.dstream: list[int] = []
        self.dcorr: list[int] = []
        self.dcls: list[int] = []
        self.dcoll: list[int] = []
        self.l_ts: list[Any] = []
        self.lc: list[int] = []
        self.lt: list[int] = []
        self.sn: list[int] = []
        self.s_ts: list[Any] = []
        self.s_dur: list[Any] = []
        self.g_ts: list[Any] = []
        self.r_ts: list[Any] = []
        self.r_dur: list[Any] = []
        self.rt: list[int] = []
        self.rc: list[int] = []
        self.tids: dict[Any, int] = {}
        self.colls: dict[str, int] = {}
        self.classes: dict[Any, int] = {}

    def columns(self, hta_rounding: bool) -> TraceColumns:
        i64, i32 = np.int64, np.int32
        ds, de, dok, frac = _ns(self.d_ts, self.d_dur)
        ls, _, lok, _ = _ns(self.l_ts, [0] * len(self.l_ts))
        ss, se, sok, _ = _ns(self.s_ts, self.s_dur)
        rs, re_, rok, _ = _ns(self.r_ts, self.r_dur)
        gs, _, gok, _ = _ns(self.g_ts, [0] * len(self.g_ts))
        if hta_rounding and frac:
            ds, de = _hta_round(ds, de)
            ls = -((-ls) // 1000) * 1000
            ss, se = _hta_round(ss, se)
            gs = -((-gs) // 1000) * 1000
        return TraceColumns(
            dev_start=ds[dok],
            dev_end=de[dok],
            dev_stream=np.array(self.dstream, i64)[dok],
            dev_corr=np.array(self.dcorr, i64)[dok],
            dev_class=np.array(self.dcls, np.int8)[dok],
            dev_coll=np.array(self.dcoll, i32)[dok],
            launch_start=ls[lok],
            launch_corr=np.array(self.lc, i64)[lok],
            launch_tid=np.array(self.lt, i32)[lok],
            step_num=np.array(self.sn, i64)[sok],
            step_start=ss[sok],
            step_end=se[sok],
            gpu_step_start=gs[gok],
            rpc_start=rs[rok],
            rpc_end=re_[rok],
            rpc_tid=np.array(self.rt, i32)[rok],
            rpc_coll=np.array(self.rc, i32)[rok],
            collectives=tuple(self.colls),
        )


def _device(acc: _Lists, name: Any, ts: Any, dur: Any, stream: int, corr: Any, cn: Any) -> None:
    acc.d_ts.append(ts)
    acc.d_dur.append(dur)
    acc.dstream.append(stream)
    acc.dcorr.append(corr if type(corr) is int else -1)
    k = acc.classes.get(name)
    if k is None:
        k = acc.classes[name] = int(kernel_class(str(name)))
    acc.dcls.append(k)
    acc.dcoll.append(acc.colls.setdefault(str(cn), len(acc.colls)) if cn else -1)


def trace_columns(events: list[Any], hta_rounding: bool = False) -> TraceColumns:
    """One pass over a trace's ``traceEvents`` (dicts); see the module docstring. The loop only
    copies raw values into lists; conversion and checks are done on arrays afterwards."""
    acc = _Lists()
    tids, colls = acc.tids, acc.colls
    device_cats = DEVICE_CATS
    step_re = _STEP_RE
    for e in events:
        if type(e) is not dict or e.get("ph") != "X":
            continue
        cat = e.get("cat")
        if cat in device_cats:
            args = e.get("args") or {}
            stream = args.get("stream", e.get("tid"))
            if type(stream) is not int:
                try:
                    stream = int(stream)  # type: ignore[arg-type]
                except (TypeError, ValueError):
                    continue  # HTA's stream -1: not a GPU event
            if stream >= 0:
                _device(
                    acc,
                    e.get("name", ""),
                    e.get("ts"),
                    e.get("dur", 0),
                    stream,
                    args.get("correlation", -1),
                    args.get("Collective name"),
                )
        elif cat == "cpu_op":
            if e.get("name") == "record_param_comms":
                cn = (e.get("args") or {}).get("Collective name")
                acc.r_ts.append(e.get("ts"))
                acc.r_dur.append(e.get("dur", 0))
                acc.rt.append(tids.setdefault(e.get("tid"), len(tids)))
                acc.rc.append(colls.setdefault(str(cn), len(colls)) if cn else -1)
        elif cat == "user_annotation":
            m = step_re.match(str(e.get("name", "")))
            if m:
                acc.sn.append(int(m.group(1)))
                acc.s_ts.append(e.get("ts"))
                acc.s_dur.append(e.get("dur", 0))
        elif cat == "gpu_user_annotation":
            if step_re.match(str(e.get("name", ""))):
                acc.g_ts.append(e.get("ts"))
        elif cat != "python_function":
            args = e.get("args")
            if args:
                corr = args.get("correlation")
                if type(corr) is int:
                    acc.l_ts.append(e.get("ts"))
                    acc.lc.append(corr)
                    acc.lt.append(tids.setdefault(e.get("tid"), len(tids)))
    return acc.columns(hta_rounding)


# ---- the msgspec path: decode only the fields read above (no dict per event) -----------------

try:  # the ``fast`` extra
    import msgspec
except ImportError:  # pragma: no cover - depends on the environment
    msgspec = None  # type: ignore[assignment]

if msgspec is not None:

    class _Args(msgspec.Struct):
        stream: Any = None
        correlation: Any = None
        coll: Any = msgspec.field(default=None, name="Collective name")

    class _Event(msgspec.Struct):
        ph: Any = None
        cat: Any = None
        name: Any = ""
        tid: Any = None
        ts: Any = None
        dur: Any = 0
        args: _Args | None = None

    class _Document(msgspec.Struct):
        traceEvents: list[_Event]  # the trace's own key names
        distributedInfo: Any = None
        baseTimeNanoseconds: Any = 0
        metadata: Any = None

    _DECODER: Any = msgspec.json.Decoder(_Document)
else:  # pragma: no cover
    _DECODER = None


def fast_trace(
    raw: bytes, hta_rounding: bool = False
) -> tuple[TraceColumns, dict[str, Any]] | None:
    """The columns of a trace decoded with msgspec, keeping only the fields the GPU breakdown
    reads (3× faster than building every event's dict), and the document's ``distributedInfo``,
    ``baseTimeNanoseconds`` and ``metadata``. None when msgspec is not installed, the document
    does not fit (not an object with a ``traceEvents`` list of objects whose ``args`` are objects)
    or it has no GPU event (the host split needs every event): parse it whole then. The same
    columns as :func:`trace_columns` (tested)."""
    if _DECODER is None:
        return None
    try:
        doc = _DECODER.decode(raw)
    except Exception:  # msgspec.ValidationError / DecodeError: the general path decides
        return None
    acc = _Lists()
    tids, colls = acc.tids, acc.colls
    device_cats = DEVICE_CATS
    step_re = _STEP_RE
    for e in doc.traceEvents:
        if e.ph != "X":
            continue
        cat = e.cat
        if cat in device_cats:
            args = e.args
            stream = args.stream if args is not None and args.stream is not None else e.tid
            if type(stream) is not int:
                try:
                    stream = int(stream)
                except (TypeError, ValueError):
                    continue
            if stream >= 0:
                _device(
                    acc,
                    e.name,
                    e.ts,
                    e.dur,
                    stream,
                    args.correlation if args is not None and args.correlation is not None else -1,
                    args.coll if args is not None else None,
                )
        elif cat == "cpu_op":
            if e.name == "record_param_comms":
                cn = e.args.coll if e.args is not None else None
                acc.r_ts.append(e.ts)
                acc.r_dur.append(e.dur)
                acc.rt.append(tids.setdefault(e.tid, len(tids)))
                acc.rc.append(colls.setdefault(str(cn), len(colls)) if cn else -1)
        elif cat == "user_annotation":
            m = step_re.match(str(e.name))
            if m:
                acc.sn.append(int(m.group(1)))
                acc.s_ts.append(e.ts)
                acc.s_dur.append(e.dur)
        elif cat == "gpu_user_annotation":
            if step_re.match(str(e.name)):
                acc.g_ts.append(e.ts)
        elif cat != "python_function":
            args = e.args
            if args is not None and type(args.correlation) is int:
                acc.l_ts.append(e.ts)
                acc.lc.append(args.correlation)
                acc.lt.append(tids.setdefault(e.tid, len(tids)))
    if not acc.d_ts:
        return None
    header = {
        "distributedInfo": doc.distributedInfo,
        "baseTimeNanoseconds": doc.baseTimeNanoseconds,
        "metadata": doc.metadata,
    }
    return acc.columns(hta_rounding), header


__all__ = [
    "DEVICE_CATS",
    "KernelClass",
    "TraceColumns",
    "fast_trace",
    "kernel_class",
    "trace_columns",
]

"""Reading a torch.profiler (Kineto) trace into columns: only what the GPU breakdown needs.

One pass over the trace's events keeps, as numpy columns (times in ns from the trace's ``ts``
zero, ``ts``/``dur`` being µs):

* **device events** — complete events of the GPU categories (:data:`DEVICE_CATS`) with a stream
  (``args.stream``, as Holistic Trace Analysis reads it): start, end, stream, correlation id, kernel
  class (:class:`KernelClass`) and the collective named in the kernel's own args, if any;
* **launches** — host events carrying ``args.correlation`` (``cudaLaunchKernel``, ``cudaMemcpyAsync``,
  ...): start, correlation id, thread;
* **steps** — ``ProfilerStep#N`` annotations: N, start, end;
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
    {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset", "cuda_sync", "mtia_ccp_events"}
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


def _us_to_ns(v: Any) -> int | None:
    try:
        return round(float(v) * 1000.0)
    except (TypeError, ValueError):
        return None


def _hta_round(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = -((-start) // 1000) * 1000
    e = (end // 1000) * 1000
    return s, np.maximum(e, s)


def trace_columns(events: list[Any], hta_rounding: bool = False) -> TraceColumns:
    """One pass over a trace's ``traceEvents``; see the module docstring."""
    ds: list[int] = []
    de: list[int] = []
    dstream: list[int] = []
    dcorr: list[int] = []
    dcls: list[int] = []
    dcoll: list[int] = []
    ls: list[int] = []
    lc: list[int] = []
    lt: list[int] = []
    sn: list[int] = []
    ss: list[int] = []
    se: list[int] = []
    rs: list[int] = []
    re_: list[int] = []
    rt: list[int] = []
    rc: list[int] = []
    tids: dict[Any, int] = {}
    colls: dict[str, int] = {}
    device_cats = DEVICE_CATS
    fractional = False
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        cat = e.get("cat")
        if cat == "cpu_op":
            if e.get("name") != "record_param_comms":
                continue
            s = _us_to_ns(e.get("ts"))
            d = _us_to_ns(e.get("dur", 0))
            if s is None or d is None:
                continue
            args = e.get("args") or {}
            cn = args.get("Collective name")
            rs.append(s)
            re_.append(s + max(d, 0))
            rt.append(tids.setdefault(e.get("tid"), len(tids)))
            rc.append(colls.setdefault(str(cn), len(colls)) if cn else -1)
            continue
        if cat in device_cats:
            args = e.get("args") or {}
            stream = args.get("stream", e.get("tid"))
            try:
                stream = int(stream)
            except (TypeError, ValueError):
                continue  # HTA's stream -1: not a GPU event
            if stream < 0:
                continue
            ts = e.get("ts")
            s = _us_to_ns(ts)
            d = _us_to_ns(e.get("dur", 0))
            if s is None or d is None:
                continue
            if not fractional and isinstance(ts, float) and not ts.is_integer():
                fractional = True
            ds.append(s)
            de.append(s + max(d, 0))
            dstream.append(stream)
            corr = args.get("correlation", -1)
            dcorr.append(corr if isinstance(corr, int) else -1)
            dcls.append(kernel_class(str(e.get("name", ""))))
            cn = args.get("Collective name")
            dcoll.append(colls.setdefault(str(cn), len(colls)) if cn else -1)
            continue
        if cat == "user_annotation":
            m = _STEP_RE.match(str(e.get("name", "")))
            if m:
                s = _us_to_ns(e.get("ts"))
                d = _us_to_ns(e.get("dur", 0))
                if s is not None and d is not None:
                    sn.append(int(m.group(1)))
                    ss.append(s)
                    se.append(s + max(d, 0))
            continue
        if cat == "python_function":
            continue
        args = e.get("args")
        if args and "correlation" in args:
            corr = args["correlation"]
            s = _us_to_ns(e.get("ts"))
            if isinstance(corr, int) and s is not None:
                ls.append(s)
                lc.append(corr)
                lt.append(tids.setdefault(e.get("tid"), len(tids)))
    i64, i32 = np.int64, np.int32
    dev_start, dev_end = np.array(ds, i64), np.array(de, i64)
    launch_start = np.array(ls, i64)
    step_start, step_end = np.array(ss, i64), np.array(se, i64)
    if hta_rounding and fractional:
        dev_start, dev_end = _hta_round(dev_start, dev_end)
        launch_start = -((-launch_start) // 1000) * 1000
        step_start, step_end = _hta_round(step_start, step_end)
    return TraceColumns(
        dev_start=dev_start,
        dev_end=dev_end,
        dev_stream=np.array(dstream, i64),
        dev_corr=np.array(dcorr, i64),
        dev_class=np.array(dcls, np.int8),
        dev_coll=np.array(dcoll, i32),
        launch_start=launch_start,
        launch_corr=np.array(lc, i64),
        launch_tid=np.array(lt, i32),
        step_num=np.array(sn, i64),
        step_start=step_start,
        step_end=step_end,
        rpc_start=np.array(rs, i64),
        rpc_end=np.array(re_, i64),
        rpc_tid=np.array(rt, i32),
        rpc_coll=np.array(rc, i32),
        collectives=tuple(colls),
    )


__all__ = ["DEVICE_CATS", "KernelClass", "TraceColumns", "kernel_class", "trace_columns"]

"""Where a rank's GPU time went, on Holistic Trace Analysis' definitions (HTA 0.5).

Read from HTA's source (``hta/analyzers/breakdown_analysis.py``, ``communication_analysis.py``,
``hta/common/trace.py``, ``hta/utils/utils.py``) and computed here on numpy columns
(:mod:`meshprof.analyze.traces.kineto_load`):

* **GPU events** — complete events of a GPU category that carry a CUDA stream (kernels, memcpy,
  memset, stream synchronization).
* **Kernel classes** by name (:func:`~meshprof.analyze.traces.kineto_load.kernel_class`): communication
  = ``^nccl.*Kernel`` (NCCL, RCCL, ``ncclDevKernel_*``); memory = ``^Memcpy|^Memset|^dma``;
  computation = everything else except names containing "Memcpy" or "Sync" (those are "other").
* **The last iteration is left out** when the trace has two or more ``ProfilerStep#N``: only GPU
  events whose launch (the host event with the same correlation id) starts before the last
  ``ProfilerStep`` does are counted (HTA: the last step is usually cut short by the profiler). As
  in HTA, "the last ProfilerStep start" is the latest start of any ``ProfilerStep`` event, the
  GPU-side copy (``gpu_user_annotation``, which starts when the step's first kernel does) included.
* **span** — from the first GPU event's start to the last one's end (all streams).
* **idle** — span − union of all GPU events (no GPU event on any stream).
* **compute** — union of computation kernels; **non-compute** — the rest of the busy time
  (span − compute − idle). ``idle_pct`` + ``compute_pct`` + ``non_compute_pct`` = 100.
* **comm_comp_overlap_pct** — |union(communication) ∩ union(computation)| / |union(communication)|.

Beyond HTA: **exposed communication** (union of communication outside computation), **memcpy** and
**memset** time (unions), the same figures per iteration (a GPU event belongs to the
``ProfilerStep#N`` its launch falls in), per stream (sums of durations per class), communication
time per collective (the ``Collective name`` of the kernel, else of the ``record_param_comms`` that
launched it), and the kernel-level straggler across ranks (whose computation kernels take longest
per iteration).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from meshprof.analyze.compute.intervals import total
from meshprof.analyze.traces.kineto_load import KernelClass, TraceColumns


def _pct(part: int, whole: int) -> float | None:
    return 100.0 * part / whole if whole > 0 else None


@dataclass(frozen=True, slots=True)
class GpuTime:
    """HTA's temporal breakdown and overlap over one stretch of GPU events (ns)."""

    span_ns: int = 0
    """First GPU event start to last GPU event end (summed over files / iterations)."""
    busy_ns: int = 0
    """Union of all GPU events."""
    idle_ns: int = 0
    """span − busy: no GPU event on any stream."""
    compute_ns: int = 0
    """Union of computation kernels."""
    non_compute_ns: int = 0
    """busy − compute: communication, memory copies and sets, synchronization not under computation."""
    comm_ns: int = 0
    """Union of communication kernels."""
    overlap_ns: int = 0
    """Communication time during which computation also runs."""
    exposed_comm_ns: int = 0
    """comm − overlap: communication with no computation beside it."""
    memcpy_ns: int = 0
    """Union of memory copies."""
    memset_ns: int = 0
    """Union of memory sets."""
    kernels: int = 0
    """GPU events counted."""

    @property
    def idle_pct(self) -> float | None:
        return _pct(self.idle_ns, self.span_ns)

    @property
    def compute_pct(self) -> float | None:
        return _pct(self.compute_ns, self.span_ns)

    @property
    def non_compute_pct(self) -> float | None:
        return _pct(self.non_compute_ns, self.span_ns)

    @property
    def comm_comp_overlap_pct(self) -> float | None:
        """HTA's headline figure; None without communication."""
        return _pct(self.overlap_ns, self.comm_ns)

    @property
    def exposed_comm_pct(self) -> float | None:
        """Exposed communication as a share of the span."""
        return _pct(self.exposed_comm_ns, self.span_ns)

    def __add__(self, o: GpuTime) -> GpuTime:
        return GpuTime(*(getattr(self, f.name) + getattr(o, f.name) for f in fields(GpuTime)))

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(GpuTime)}
        for p in ("idle_pct", "compute_pct", "non_compute_pct", "comm_comp_overlap_pct"):
            d[p] = getattr(self, p)
        d["exposed_comm_pct"] = self.exposed_comm_pct
        return d


def gpu_time(start: np.ndarray, end: np.ndarray, cls: np.ndarray) -> GpuTime:
    """:class:`GpuTime` of the GPU events (start, end, :class:`KernelClass`)."""
    if not len(start):
        return GpuTime()
    span = int(end.max() - start.min())
    busy = total(start, end)
    comp = cls == KernelClass.COMPUTATION
    comm = cls == KernelClass.COMMUNICATION
    compute = total(start[comp], end[comp])
    comm_ns = total(start[comm], end[comm])
    either = comp | comm
    overlap = compute + comm_ns - total(start[either], end[either])
    mc = cls == KernelClass.MEMCPY
    ms = cls == KernelClass.MEMSET
    return GpuTime(
        span_ns=span,
        busy_ns=busy,
        idle_ns=span - busy,
        compute_ns=compute,
        non_compute_ns=busy - compute,
        comm_ns=comm_ns,
        overlap_ns=overlap,
        exposed_comm_ns=comm_ns - overlap,
        memcpy_ns=total(start[mc], end[mc]),
        memset_ns=total(start[ms], end[ms]),
        kernels=len(start),
    )


@dataclass(frozen=True, slots=True)
class IterationTime:
    """One ``ProfilerStep#N``: the GPU events launched during it."""

    step: int
    time: GpuTime

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step} | self.time.to_dict()


@dataclass(frozen=True, slots=True)
class StreamTime:
    """One CUDA stream: summed durations of its GPU events by class (ns)."""

    stream: int
    kernels: int
    busy_ns: int
    """Union of the stream's events."""
    compute_ns: int
    comm_ns: int
    memcpy_ns: int
    memset_ns: int
    other_ns: int

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(StreamTime)}


@dataclass(frozen=True, slots=True)
class CollectiveTime:
    """Communication kernels of one collective (``Collective name``; "" when unnamed)."""

    name: str
    kernels: int
    time_ns: int
    """Summed kernel durations."""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kernels": self.kernels, "time_ns": self.time_ns}


@dataclass(frozen=True, slots=True)
class GpuBreakdown:
    """One rank's (or one trace file's) GPU time on HTA's definitions."""

    total: GpuTime
    iterations: tuple[IterationTime, ...]
    streams: tuple[StreamTime, ...]
    collectives: tuple[CollectiveTime, ...]
    last_step_dropped: bool
    """Whether the last ``ProfilerStep`` was left out (HTA's rule; two or more steps)."""
    excluded: int
    """GPU events left out (launched in the last step, or with no launch found)."""

    def __add__(self, o: GpuBreakdown) -> GpuBreakdown:
        streams: dict[int, StreamTime] = {s.stream: s for s in self.streams}
        for s in o.streams:
            if s.stream in streams:
                a = streams[s.stream]
                streams[s.stream] = StreamTime(
                    s.stream,
                    *(getattr(a, f.name) + getattr(s, f.name) for f in fields(StreamTime)[1:]),
                )
            else:
                streams[s.stream] = s
        colls: dict[str, CollectiveTime] = {c.name: c for c in self.collectives}
        for c in o.collectives:
            ca = colls.get(c.name, CollectiveTime(c.name, 0, 0))
            colls[c.name] = CollectiveTime(c.name, ca.kernels + c.kernels, ca.time_ns + c.time_ns)
        return GpuBreakdown(
            total=self.total + o.total,
            iterations=tuple(sorted(self.iterations + o.iterations, key=lambda i: i.step)),
            streams=tuple(streams[k] for k in sorted(streams)),
            collectives=tuple(sorted(colls.values(), key=lambda c: -c.time_ns)),
            last_step_dropped=self.last_step_dropped or o.last_step_dropped,
            excluded=self.excluded + o.excluded,
        )


def _launch_index(cols: TraceColumns) -> tuple[np.ndarray, np.ndarray]:
    """For each GPU event: index of its launch (host event with the same correlation id) and
    whether one exists."""
    if not len(cols.launch_corr) or not len(cols.dev_corr):
        n = len(cols.dev_corr)
        return np.zeros(n, np.int64), np.zeros(n, bool)
    order = np.argsort(cols.launch_corr, kind="stable")
    sc = cols.launch_corr[order]
    pos = np.searchsorted(sc, cols.dev_corr)
    pos_c = np.minimum(pos, len(sc) - 1)
    found = (pos < len(sc)) & (sc[pos_c] == cols.dev_corr) & (cols.dev_corr >= 0)
    return order[pos_c], found


def _step_of(ts: np.ndarray, cols: TraceColumns) -> np.ndarray:
    """``ProfilerStep`` number containing each time (start ≤ t < end), −1 outside."""
    if not len(cols.step_start) or not len(ts):
        return np.full(len(ts), -1, np.int64)
    order = np.argsort(cols.step_start, kind="stable")
    st, en, num = cols.step_start[order], cols.step_end[order], cols.step_num[order]
    i = np.searchsorted(st, ts, side="right") - 1
    ic = np.maximum(i, 0)
    inside = (i >= 0) & (ts < en[ic])
    return np.where(inside, num[ic], -1)


def _collective_of(cols: TraceColumns, li: np.ndarray, has: np.ndarray) -> np.ndarray:
    """Collective name index for each GPU event: its own ``Collective name``, else that of the
    ``record_param_comms`` enclosing its launch on the launching thread; −1 when neither."""
    out = cols.dev_coll.copy()
    need = (out < 0) & has & (cols.dev_class == KernelClass.COMMUNICATION)
    if not need.any() or not len(cols.rpc_start):
        return out
    idx = np.flatnonzero(need)
    lts = cols.launch_start[li[idx]]
    ltid = cols.launch_tid[li[idx]]
    for tid in np.unique(ltid):
        rm = np.flatnonzero(cols.rpc_tid == tid)
        if not len(rm):
            continue
        rm = rm[np.argsort(cols.rpc_start[rm], kind="stable")]
        sel = ltid == tid
        j = np.searchsorted(cols.rpc_start[rm], lts[sel], side="right") - 1
        jc = np.maximum(j, 0)
        ok = (j >= 0) & (lts[sel] <= cols.rpc_end[rm][jc])
        out[idx[sel]] = np.where(ok, cols.rpc_coll[rm][jc], -1)
    return out


def gpu_breakdown(cols: TraceColumns) -> GpuBreakdown | None:
    """The GPU breakdown of one trace; None when it has no GPU events."""
    n = len(cols.dev_start)
    if n == 0:
        return None
    li, has = _launch_index(cols)
    keep = np.ones(n, bool)
    dropped = False
    if len(np.unique(cols.step_num)) >= 2:
        # HTA takes the latest start among all ProfilerStep events, the GPU-side copies included
        last = int(
            max(cols.step_start.max(), cols.gpu_step_start.max(initial=cols.step_start.max()))
        )
        keep = has & (cols.launch_start[li] < last) if len(cols.launch_start) else has
        dropped = True
    s, e, cls = cols.dev_start[keep], cols.dev_end[keep], cols.dev_class[keep]
    li_k, has_k = li[keep], has[keep]
    tot = gpu_time(s, e, cls)

    iters: list[IterationTime] = []
    if len(cols.step_start) and len(s):
        launch_ts = np.where(has_k, cols.launch_start[li_k] if len(cols.launch_start) else 0, 0)
        step = np.where(has_k, _step_of(launch_ts, cols), -1)
        if dropped:  # the few kernels of the last step HTA keeps are no whole iteration
            step[step == cols.step_num[np.argmax(cols.step_start)]] = -1
        for k in np.unique(step[step >= 0]):
            m = step == k
            iters.append(IterationTime(int(k), gpu_time(s[m], e[m], cls[m])))

    streams = []
    stream = cols.dev_stream[keep]
    dur = e - s
    for sid in np.unique(stream):
        m = stream == sid
        by = np.bincount(cls[m].astype(np.int64), weights=dur[m], minlength=len(KernelClass))
        streams.append(
            StreamTime(
                stream=int(sid),
                kernels=int(m.sum()),
                busy_ns=total(s[m], e[m]),
                compute_ns=int(by[KernelClass.COMPUTATION]),
                comm_ns=int(by[KernelClass.COMMUNICATION]),
                memcpy_ns=int(by[KernelClass.MEMCPY]),
                memset_ns=int(by[KernelClass.MEMSET]),
                other_ns=int(by[KernelClass.OTHER]),
            )
        )

    colls: list[CollectiveTime] = []
    cm = cls == KernelClass.COMMUNICATION
    if cm.any():
        ci = _collective_of(cols, li, has)[keep][cm]
        cd = dur[cm]
        for c in np.unique(ci):
            m = ci == c
            colls.append(
                CollectiveTime(
                    cols.collectives[c] if c >= 0 else "",
                    int(m.sum()),
                    int(cd[m].sum()),
                )
            )
        colls.sort(key=lambda c: -c.time_ns)
    return GpuBreakdown(
        total=tot,
        iterations=tuple(iters),
        streams=tuple(streams),
        collectives=tuple(colls),
        last_step_dropped=dropped,
        excluded=int(n - keep.sum()),
    )


@dataclass(frozen=True, slots=True)
class KernelStragglers:
    """Whose computation kernels take longest, per iteration common to all ranks."""

    ranks: tuple[int, ...]
    steps: tuple[int, ...]
    compute_ns: tuple[tuple[int, ...], ...]
    """[rank][step]: union of computation kernels of that iteration."""
    slowest: tuple[int, ...]
    """Per step, the rank with the most computation."""
    excess_pct: tuple[float, ...]
    """Per step, 100 × (slowest / median − 1)."""
    straggler: int | None
    """The rank slowest in the most iterations (ties: the most computation in all)."""
    straggler_steps: int
    """In how many of the steps it is the slowest."""
    mean_excess_pct: float
    """Mean of :attr:`excess_pct` over the steps where the straggler is the slowest."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "ranks": list(self.ranks),
            "steps": list(self.steps),
            "compute_ns": [list(r) for r in self.compute_ns],
            "slowest": list(self.slowest),
            "excess_pct": list(self.excess_pct),
            "straggler": self.straggler,
            "straggler_steps": self.straggler_steps,
            "mean_excess_pct": self.mean_excess_pct,
        }


def kernel_stragglers(per_rank: Sequence[tuple[int, GpuBreakdown]]) -> KernelStragglers | None:
    """The kernel-level straggler across ranks; None with fewer than two ranks or no iteration
    common to all."""
    if len(per_rank) < 2:
        return None
    by = {r: {i.step: i.time.compute_ns for i in b.iterations} for r, b in per_rank}
    common = sorted(set.intersection(*(set(d) for d in by.values())))
    if not common:
        return None
    ranks = tuple(r for r, _ in per_rank)
    mat = np.array([[by[r][s] for s in common] for r in ranks], dtype=np.int64)
    slow_i = mat.argmax(axis=0)
    med = np.median(mat, axis=0)
    excess = np.where(med > 0, 100.0 * (mat.max(axis=0) / np.where(med > 0, med, 1) - 1), 0.0)
    counts = np.bincount(slow_i, minlength=len(ranks))
    best = max(range(len(ranks)), key=lambda i: (counts[i], int(mat[i].sum())))
    mine = slow_i == best
    return KernelStragglers(
        ranks=ranks,
        steps=tuple(common),
        compute_ns=tuple(tuple(int(v) for v in row) for row in mat),
        slowest=tuple(ranks[i] for i in slow_i),
        excess_pct=tuple(float(x) for x in excess),
        straggler=ranks[best],
        straggler_steps=int(counts[best]),
        mean_excess_pct=float(excess[mine].mean()) if mine.any() else 0.0,
    )


__all__ = [
    "CollectiveTime",
    "GpuBreakdown",
    "GpuTime",
    "IterationTime",
    "KernelStragglers",
    "StreamTime",
    "gpu_breakdown",
    "gpu_time",
    "kernel_stragglers",
]

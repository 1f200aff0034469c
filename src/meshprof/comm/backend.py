"""The one interface between the recorder and the dispatcher kernel that feeds it.

Two kernels implement :class:`KernelBackend`: :class:`meshprof.comm.python_kernel.PythonKernel`
(a Python function per c10d op, calling back into the recorder's hot path) and
:class:`meshprof.comm.native.NativeKernel` (C++, records drained into the event log at a flush).
:class:`meshprof.comm.recorder.CommProfiler` talks to whichever runs through this protocol only;
:mod:`meshprof.comm.selection` chooses it (and hands over from one to the other).
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from meshprof.comm.completion import Completion, InflightOp, PendingOp, PendingOps
from meshprof.events import P2P_OPS, GroupInfo

if TYPE_CHECKING:
    from meshprof.comm.ops import OpSpec
    from meshprof.config import ProfilerConfig
    from meshprof.event_log import EventLog


class GroupRef(NamedTuple):
    """A process group as the recorder knows it."""

    log_index: int
    """Index in the event log's group table."""
    size: int
    crc: int
    """CRC-32 of the name: with the seq, the sampling hash (the same on every member rank)."""
    ranks: tuple[int, ...]
    """Global ranks of the members, in group-rank order."""
    name: str


class KernelBackend(Protocol):
    """A dispatcher kernel installed for every ``c10d::`` op, as the recorder sees it."""

    @property
    def name(self) -> str:
        """``"python"`` or ``"native"``: the kernel recording now (``CommProfiler.backend_name``)."""

    def install(self) -> None:
        """Register the kernel (and its ``Work.wait`` hook) in PyTorch."""

    def uninstall(self) -> None:
        """Remove what :meth:`install` registered; ops still in flight are given a short while
        to complete. The recorder flushes afterwards."""

    def configure(self) -> None:
        """The recorder's config changed (enabled, sampling, the ops filter)."""

    def set_step(self, step: int) -> None:
        """Ops issued from now on belong to training step ``step``."""

    def drain(self, pending: bool = False) -> PendingOps | None:
        """Move the kernel's finished records into the recorder's event log. With ``pending``,
        also return the kernel's own ops not finished at that moment (None: it holds none of
        its own), taken atomically with the finished ones: each op is moved or returned, once."""

    def exclusive(self) -> AbstractContextManager[Any]:
        """A context in which no other thread drains this kernel (a read holds it from its
        drain until it has taken the log's state, so no op finished later enters the log
        meanwhile)."""

    def settle(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the kernel's ops in flight to complete."""

    def sweep(self) -> None:
        """Complete, on the calling thread and without waiting, the kernel's ops whose works
        have already finished (so a read right after misses none of them)."""

    def inflight(self) -> list[InflightOp]:
        """The kernel's own ops in flight, oldest first (those the recorder does not hold)."""

    def next_seq(self, group: GroupRef, op: str, peer: int) -> int:
        """The next sequence number of ``op`` in ``group`` (per peer and direction for
        point-to-point ops), from the counters the kernel numbers its own ops with."""

    def composite_enter(self) -> None:
        """A composite op (object collective, ``label()``) starts on this thread: the c10d ops
        inside are counted into it, not recorded."""

    def composite_exit(self) -> tuple[int, int, int]:
        """The composite op ends: (input bytes, output bytes, c10d ops) the kernel counted."""

    def thread_cpu_ns(self) -> dict[str, int]:
        """CPU ns so far of the kernel's threads that Python does not see (the C++ poller), by
        name; the ``meshprof-*`` Python threads are read by :mod:`meshprof.comm.thread_cpu`."""


class SeqSource(Protocol):
    """Where the Python path takes sequence numbers from (:class:`SeqCounters`, or the
    native kernel's counters once it took over)."""

    def next(self, gidx: int, op: str, peer: int) -> int: ...

    def counts(self, groups: list[GroupInfo]) -> dict[tuple[str, int, int], int]: ...


class SeqCounters:
    """The one place sequence numbers of the Python path are assigned.

    Collectives count per group; point-to-point ops per (group, peer, direction), so a send and
    the matching recv get the same number on both ranks. A recv from any source counts on its own
    (peer -1) at issue, so the group's numbers stay aligned, and takes its pair's number at
    completion. (With the native kernel the C++ counters number every op, composite ones too.)
    """

    def __init__(self) -> None:
        self._group: dict[int, int] = {}
        self._p2p: dict[tuple[int, int, int], int] = {}
        self._lock = threading.Lock()  # p2p numbers are also taken at completion, on any thread

    def next(self, gidx: int, op: str, peer: int) -> int:
        if op in P2P_OPS:
            key = (gidx, peer, 0 if op.startswith("send") else 1)
            with self._lock:
                seq = self._p2p.get(key, 0)
                self._p2p[key] = seq + 1
            return seq
        seq = self._group.get(gidx, 0)
        self._group[gidx] = seq + 1
        return seq

    def counts(self, groups: list[GroupInfo]) -> dict[tuple[str, int, int], int]:
        """The next number of every counter, keyed as the native kernel keys them: (group name,
        group-local peer or -1, 0 collective / 1 send / 2 recv); ``groups`` is the log's table."""
        out: dict[tuple[str, int, int], int] = {}
        for gidx, n in list(self._group.items()):
            out[(groups[gidx].name, -1, 0)] = n
        with self._lock:
            p2p = list(self._p2p.items())
        for (gidx, peer, direction), n in p2p:
            ranks = groups[gidx].ranks
            local = ranks.index(peer) if peer in ranks else peer
            out[(groups[gidx].name, local, 1 + direction)] = n
        return out


class RecorderCore(Protocol):
    """What the kernels and the kernel selection use of the recorder
    (:class:`meshprof.comm.recorder.CommProfiler` is the one implementation): its settings, its
    event log and counters, and the hot path the Python kernel calls."""

    config: ProfilerConfig
    log: EventLog
    seqs: SeqSource
    completion: Completion
    step: int

    @property
    def open_composites(self) -> int: ...

    @property
    def backend(self) -> KernelBackend | None:
        """The kernel installed now (None: none)."""

    @property
    def wall_offset_ns(self) -> int:
        """time.time_ns() − time.perf_counter_ns() at the recorder's start (ns)."""

    @property
    def min_duration_ns(self) -> int:
        """Ops shorter than this are not kept (ns)."""

    def begin(self, spec: OpSpec, args: tuple[Any, ...]) -> PendingOp | None: ...

    def fail(self, rec: PendingOp, exc: BaseException) -> None: ...

    def begin_composite(
        self, label: str, group: Any, peer: int, metadata: dict[str, Any] | None = None
    ) -> PendingOp | None: ...

    def finish_composite(self, rec: PendingOp) -> None: ...

    def start_op(
        self,
        op: str,
        gidx: int,
        peer: int,
        seq: int,
        dtype: int,
        in_b: int,
        out_b: int,
        flags: int,
        meta: dict[str, Any] | None,
        composite: bool,
    ) -> PendingOp: ...

    def complete(
        self, rec: PendingOp, end: int, err: BaseException | None, dur: int | None = None
    ) -> None: ...

    def flush(self) -> None: ...

    def group_of(self, pg: Any) -> GroupRef: ...

    def report_internal_error(self, e: BaseException) -> None: ...

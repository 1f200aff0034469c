"""The one interface between the recorder and the dispatcher kernel that feeds it.

Two kernels implement :class:`KernelBackend`: :class:`meshprof.comm.python_kernel.PythonKernel`
(a Python function per c10d op, calling back into the recorder's hot path) and
:class:`meshprof.comm.native.NativeKernel` (C++, records drained into the event log at a flush).
:class:`meshprof.comm.recorder.CommProfiler` talks to whichever runs through this protocol only;
:mod:`meshprof.comm.selection` chooses it (and hands over from one to the other).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from meshprof.comm.completion import InflightOp


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

    def drain(self) -> None:
        """Move the kernel's finished records into the recorder's event log."""

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

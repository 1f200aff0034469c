"""Composite ops: the object collectives and ``CommProfiler.label()``, each one event.

The object collectives (``all_gather_object`` ...) are Python functions built from several c10d
ops; they are wrapped so that each is recorded as one event of its own name. ``label(name)``
records whatever runs inside a ``with`` block as one event named ``name``. The c10d ops inside a
composite op are not recorded on their own: their bytes are summed into it and their count is
kept in its metadata (``c10d_ops``). Both kernels (Python and native) share this.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections.abc import Callable
from typing import Any

from meshprof.comm.backend import KernelBackend, RecorderCore
from meshprof.comm.completion import PendingOp
from meshprof.comm.patching import Patches
from meshprof.events import OBJECT_OPS

_tls = threading.local()


def composite_depth() -> int:
    """How many composite ops are open on this thread (the inner ones are not recorded)."""
    return getattr(_tls, "depth", 0)


def patch_object_collectives(prof: RecorderCore, patches: Patches) -> None:
    """Wrap every object collective of ``torch.distributed`` so it records one event."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name in sorted(OBJECT_OPS):
        original = getattr(c10d, name, None)
        if original is None:
            continue
        wrapper = _wrap_object_collective(prof, name, original)
        for module in (c10d, dist):
            if getattr(module, name, None) is original:
                patches.replace(module, name, wrapper, original)


def _wrap_object_collective(
    prof: RecorderCore, name: str, original: Callable[..., Any]
) -> Callable[..., Any]:
    sig = inspect.signature(original)
    is_send = name == "send_object_list"
    is_recv = name == "recv_object_list"

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if composite_depth() or not prof.config.enabled:
            return original(*args, **kwargs)
        rec = None
        try:
            bound = sig.bind_partial(*args, **kwargs).arguments
            peer = -1
            if is_send:
                peer = _global_peer(bound.get("group"), bound.get("dst"), bound.get("group_dst"))
            elif is_recv:
                peer = _global_peer(bound.get("group"), bound.get("src"), bound.get("group_src"))
            rec = prof.begin_composite(name, bound.get("group"), peer)
        except Exception as e:
            prof.report_internal_error(e)
        if rec is None:
            return original(*args, **kwargs)
        _tls.depth = composite_depth() + 1
        try:
            result = original(*args, **kwargs)
        except BaseException as e:
            _tls.depth -= 1
            prof.fail(rec, e)
            raise
        _tls.depth -= 1
        prof.finish_composite(rec)
        return result

    wrapper.__meshprof_original__ = original  # type: ignore[attr-defined]
    return wrapper


def _global_peer(group: Any, rank: Any, group_rank: Any) -> int:
    import torch.distributed as dist

    if rank is not None:
        return int(rank)
    if group_rank is not None and group is not None:
        try:
            return int(dist.get_global_rank(group, int(group_rank)))
        except Exception:
            return -1
    return -1


class composite_op:
    """Record everything issued inside as one event named ``label`` (a user-defined op)."""

    def __init__(
        self,
        prof: RecorderCore,
        label: str,
        group: Any = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        self.prof = prof
        self.label = label
        self.group = group
        self.metadata = metadata
        self.rec: PendingOp | None = None

    def __enter__(self) -> composite_op:
        if composite_depth() or not self.prof.config.enabled:
            return self
        try:
            self.rec = self.prof.begin_composite(self.label, self.group, -1, self.metadata)
        except Exception as e:
            self.prof.report_internal_error(e)
        if self.rec is not None:
            _tls.depth = composite_depth() + 1
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self.rec is None:
            return
        _tls.depth -= 1
        if exc is not None:
            self.prof.fail(self.rec, exc)
        else:
            self.prof.finish_composite(self.rec)


class OpenComposites:
    """The composite ops open in one recorder: a stack per thread (the c10d ops issued inside
    count into the top one, :meth:`top`) and how many are open on all threads (a kernel handover
    waits until none is)."""

    def __init__(self) -> None:
        self._tls = threading.local()
        self._lock = threading.Lock()
        self.count = 0

    def _stack(self) -> list[PendingOp]:
        s = getattr(self._tls, "stack", None)
        if s is None:
            s = self._tls.stack = []
        return s

    def top(self) -> PendingOp | None:
        """The innermost composite op open on this thread (None: none)."""
        s = getattr(self._tls, "stack", None)
        return s[-1] if s else None

    def begin(
        self,
        prof: RecorderCore,
        label: str,
        group: Any,
        peer: int,
        metadata: dict[str, Any] | None,
    ) -> PendingOp | None:
        """Open a composite op named ``label`` on ``group`` (None: the default group); None when
        the ops filter leaves it out."""
        import torch.distributed as dist

        if group is None:
            group = dist.distributed_c10d._get_default_group()
        g = prof.group_of(group)
        backend = prof.backend
        if backend is not None:  # one set of counters: the kernel's
            seq = backend.next_seq(g, label, peer)
        else:
            seq = prof.seqs.next(g.log_index, label, peer)
        if prof.config.ops is not None and label not in prof.config.ops:
            return None
        dtype = prof.log.dtype_code(
            "object" if label.endswith(("object", "object_list")) else "none"
        )
        meta = dict(metadata or {})
        meta["c10d_ops"] = 0
        rec = prof.start_op(label, g.log_index, peer, seq, dtype, 0, 0, 0, meta, True)
        with self._lock:
            self.count += 1
        if backend is not None:
            backend.composite_enter()
        rec.t0 = time.perf_counter_ns()
        rec.start_ns = rec.t0 + prof.wall_offset_ns
        self._stack().append(rec)
        return rec

    def finish(self, prof: RecorderCore, rec: PendingOp) -> None:
        """Close ``rec``: it enters the log with the bytes and count of the c10d ops inside."""
        try:
            end = time.perf_counter_ns()
            self.pop(rec, prof.backend)
            if prof.backend is not None:
                # ops that finished before this one (the native kernel keeps them until a
                # drain) enter the log first: the log stays in completion order
                prof.backend.drain()
            prof.complete(rec, end, None)
        except Exception as e:
            prof.report_internal_error(e)

    def pop(self, rec: PendingOp, backend: KernelBackend | None) -> None:
        """Take ``rec`` off this thread's stack, adding what the kernel counted inside it."""
        stack = self._stack()
        if stack and stack[-1] is rec:
            stack.pop()
        with self._lock:
            self.count -= 1
        if backend is not None:
            in_b, out_b, n = backend.composite_exit()
            rec.in_bytes += in_b
            rec.out_bytes += out_b
            if rec.meta is not None:
                rec.meta["c10d_ops"] = rec.meta.get("c10d_ops", 0) + n

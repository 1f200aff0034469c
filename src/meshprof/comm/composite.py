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
from collections.abc import Callable
from typing import Any

from meshprof.comm.backend import RecorderCore
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

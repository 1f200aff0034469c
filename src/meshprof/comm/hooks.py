"""Installing meshprof in PyTorch's dispatcher, and the object-collective wrappers.

One Python kernel is registered at the ``BackendSelect`` dispatch key for every ``c10d::`` op.
``BackendSelect`` sits just above the backend keys (CPU, CUDA) and, unlike the autograd keys, is
not skipped under ``torch.inference_mode``; c10d ops have no kernel of their own there. The
kernel notes the op, redispatches to the backend kernel below ``BackendSelect`` (with the GIL
released, as PyTorch's own bindings do) and returns its result unchanged.

Because the choke point is the dispatcher, every path is seen exactly once: names imported before
meshprof was enabled, DDP's C++ reducer, FSDP2, DTensor's functional collectives and pipelining.
The object collectives (``all_gather_object`` ...) are Python functions built from several c10d
ops; they are wrapped so that each is recorded as one event of its own name.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from meshprof.comm.ops import OpSpec, available_specs

if TYPE_CHECKING:
    from meshprof.profiler import CommProfiler

_BACKEND_SELECT = torch._C.DispatchKey.BackendSelect

OBJECT_COLLECTIVES = (
    "all_gather_object",
    "gather_object",
    "broadcast_object_list",
    "scatter_object_list",
    "send_object_list",
    "recv_object_list",
)


class _KernelTable:
    """Calls the kernel below ``BackendSelect`` for one op, without holding the GIL.

    ``OperatorHandle.redispatch_boxed`` releases the GIL while the backend kernel runs, as the
    ``torch.distributed`` bindings do. That matters: a backend's worker thread can need the GIL
    (gloo drops a finished work's tensors, which decrefs their Python objects, while holding the
    lock that ``enqueue`` takes). Calling the kernel with the GIL held (``SafeKernelFunction
    .call_boxed``) deadlocks the process within a few hundred collectives.
    """

    def __init__(self, op: Any) -> None:
        self.op = op
        self.redispatch = op._handle.redispatch_boxed

    def call(self, keyset: Any, args: tuple[Any, ...]) -> Any:
        return self.redispatch(keyset.remove(_BACKEND_SELECT), *args)


#: Seconds disable() waits for native ops still in flight to complete before the last drain.
NATIVE_SETTLE_S = 0.5


class Installation:
    """The dispatcher registrations and Python patches that one enable() made."""

    def __init__(self) -> None:
        self.lib: Any = None
        self.native: Any = None
        self.patched: list[tuple[Any, str, Any]] = []


def install(prof: CommProfiler) -> Installation:
    """Register the c10d kernels and wrap the object collectives; returns what to undo."""
    inst = Installation()
    if prof.config.native and _native_allowed(prof):
        from meshprof.errors import MeshprofError
        from meshprof.native import NativeRecorder

        try:
            native = NativeRecorder(prof)
        except MeshprofError as e:  # no compiler, no headers: record with Python instead
            warnings.warn(f"meshprof: {e}", RuntimeWarning, stacklevel=3)
        else:
            inst.native = prof._native = native
            native.install()
            native.set_step(prof.step)
            _patch_object_collectives(prof, inst)
            _patch_work_wait_native(native, inst)
            return inst
    lib = torch.library.Library("c10d", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for spec in available_specs():
            op = getattr(torch.ops.c10d, spec.schema_name).default
            lib.impl(
                spec.schema_name,
                _make_kernel(prof, spec, _KernelTable(op)),
                "BackendSelect",
                with_keyset=True,
            )
    inst.lib = lib
    _patch_object_collectives(prof, inst)
    _patch_work_wait(prof, inst)
    return inst


def _native_allowed(prof: CommProfiler) -> bool:
    """The native recorder times on the host only: with CUDA present keep the Python one."""
    if torch.cuda.is_available() and prof.config.device_timing:
        warnings.warn(
            "meshprof: native=True ignored: CUDA is present and the native recorder cannot time "
            "on the device; using the Python recorder with CUDA-event timing",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    return True


def uninstall(inst: Installation) -> None:
    if inst.native is not None:
        inst.native.uninstall()
        inst.native.settle(NATIVE_SETTLE_S)  # ops still in flight end in C++: wait for them
        inst.native.prof.flush()
        inst.native.prof._native = None
        inst.native = None
    for module, name, original in reversed(inst.patched):
        setattr(module, name, original)
    inst.patched.clear()
    if inst.lib is not None:
        inst.lib._destroy()
        inst.lib = None


def _work_classes() -> list[type]:
    """``Work`` and every subclass that binds its own ``wait`` (FakeWork, PythonCallbackWork...)."""
    base = torch._C._distributed_c10d.Work
    out: list[type] = [base]
    todo = list(base.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if "wait" in cls.__dict__:
            out.append(cls)
    return out


def _patch_wait(inst: Installation, wrap: Callable[[Any], Callable[..., Any]]) -> None:
    """Replace ``Work.wait`` (and the subclasses' own) by ``wrap(original)``; undone by
    :func:`uninstall`."""
    for cls in _work_classes():
        original = cls.__dict__["wait"]
        inst.patched.append((cls, "wait", original))
        setattr(cls, "wait", wrap(original))  # noqa: B010


def _patch_work_wait(prof: CommProfiler, inst: Installation) -> None:
    """Wrap ``Work.wait`` so an op issued from Python ends when its caller's wait returns: the
    exact completion time as the caller sees it, on its own thread."""
    _patch_wait(inst, functools.partial(_wrap_wait, prof))


def _patch_work_wait_native(native: Any, inst: Installation) -> None:
    """Native mode: a future-less work (gloo's send/recv) waited on from Python ends when its
    wait returns (the C++ poller then only backs up works nobody waits on, so it can poll
    slowly: 1 ms, backing off to 20 ms)."""
    try:
        waited = native.mod.work_waited
    except AttributeError:  # a build from before this hook: keep its fast poller
        return
    _patch_wait(inst, functools.partial(_wrap_wait_native, waited))
    native.mod.set_poll_interval(1000, 20000)


def _wrap_wait_native(waited: Callable[[Any, str], bool], original: Any) -> Callable[..., Any]:
    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            out = original(self, *args, **kwargs)
        except BaseException as e:
            with contextlib.suppress(Exception):
                waited(self, f"{type(e).__name__}: {e}")
            raise
        with contextlib.suppress(Exception):
            waited(self, "")
        return out

    wait.__doc__ = getattr(original, "__doc__", None)
    wait.__meshprof_original__ = original  # type: ignore[attr-defined]
    return wait


def _wrap_wait(prof: CommProfiler, original: Any) -> Callable[..., Any]:
    perf = time.perf_counter_ns
    waited = prof._work_waited

    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            result = original(self, *args, **kwargs)
        except BaseException as e:
            if prof._by_work:
                try:
                    waited(self, perf(), e)
                except Exception as e2:
                    prof._internal_error(e2)
            raise
        if prof._by_work:
            end = perf()
            try:
                waited(self, end, None)
            except Exception as e:
                prof._internal_error(e)
        return result

    wait.__doc__ = getattr(original, "__doc__", None)
    wait.__meshprof_original__ = original  # type: ignore[attr-defined]
    return wait


def _make_kernel(prof: CommProfiler, spec: OpSpec, table: _KernelTable) -> Callable[..., Any]:
    begin = prof._begin
    finish = prof._finish
    fail = prof._fail
    internal_error = prof._internal_error
    call = table.call

    def kernel(keyset: Any, *args: Any) -> Any:
        rec = None
        try:
            rec = begin(spec, args)
        except Exception as e:  # never break training
            internal_error(e)
        if rec is None:
            return call(keyset, args)
        try:
            out = call(keyset, args)
        except BaseException as e:
            fail(rec, e)
            raise
        finish(rec, out)
        return out

    kernel.__name__ = f"meshprof_{spec.schema_name}"
    return kernel


_tls = threading.local()


def composite_depth() -> int:
    return getattr(_tls, "depth", 0)


def _patch_object_collectives(prof: CommProfiler, inst: Installation) -> None:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name in OBJECT_COLLECTIVES:
        original = getattr(c10d, name, None)
        if original is None:
            continue
        wrapper = _wrap_object_collective(prof, name, original)
        for module in (c10d, dist):
            if getattr(module, name, None) is original:
                inst.patched.append((module, name, original))
                setattr(module, name, wrapper)


def _wrap_object_collective(
    prof: CommProfiler, name: str, original: Callable[..., Any]
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
            rec = prof._begin_composite(name, bound.get("group"), peer)
        except Exception as e:
            prof._internal_error(e)
        if rec is None:
            return original(*args, **kwargs)
        _tls.depth = composite_depth() + 1
        try:
            result = original(*args, **kwargs)
        except BaseException as e:
            _tls.depth -= 1
            prof._fail(rec, e)
            raise
        _tls.depth -= 1
        prof._finish_composite(rec)
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
    """Record everything issued inside as one event named ``label`` (a user-defined op).

    The c10d collectives issued inside are not recorded on their own; their bytes are summed into
    the labelled event and their count is kept in its metadata (``c10d_ops``).
    """

    def __init__(
        self,
        prof: CommProfiler,
        label: str,
        group: Any = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        self.prof = prof
        self.label = label
        self.group = group
        self.metadata = metadata
        self.rec: Any = None

    def __enter__(self) -> composite_op:
        if composite_depth() or not self.prof.config.enabled:
            return self
        try:
            self.rec = self.prof._begin_composite(self.label, self.group, -1, self.metadata)
        except Exception as e:
            self.prof._internal_error(e)
        if self.rec is not None:
            _tls.depth = composite_depth() + 1
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self.rec is None:
            return
        _tls.depth -= 1
        if exc is not None:
            self.prof._fail(self.rec, exc)
        else:
            self.prof._finish_composite(self.rec)

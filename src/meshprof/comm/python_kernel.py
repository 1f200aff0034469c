"""The dispatcher kernel written in Python (one :class:`~meshprof.comm.backend.KernelBackend`).

One Python kernel is registered at the ``BackendSelect`` dispatch key for every ``c10d::`` op.
``BackendSelect`` sits just above the backend keys (CPU, CUDA) and, unlike the autograd keys, is
not skipped under ``torch.inference_mode``; c10d ops have no kernel of their own there. The
kernel notes the op (``CommProfiler.begin``), redispatches to the backend kernel below
``BackendSelect`` (with the GIL released, as PyTorch's own bindings do), hands the result to
completion (:mod:`meshprof.comm.completion`) and returns it unchanged.

Because the choke point is the dispatcher, every path is seen exactly once: names imported before
meshprof was enabled, DDP's C++ reducer, FSDP2, DTensor's functional collectives and pipelining.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from meshprof.comm.backend import GroupRef, RecorderCore
from meshprof.comm.completion import InflightOp, PendingOps, patch_work_wait
from meshprof.comm.ops import OpSpec, available_specs, output_tensors
from meshprof.comm.patching import Patches

_BACKEND_SELECT = torch._C.DispatchKey.BackendSelect


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


class PythonKernel:
    """The Python kernel of one CommProfiler. Its ops' completion and sequence numbers live in
    the recorder itself (the recorder's hot path is this kernel's), so most of the backend
    interface has nothing to do here."""

    name = "python"

    def __init__(self, prof: RecorderCore) -> None:
        self.prof = prof
        self._lib: Any = None
        self._wait_lib: Any = None
        self._patches = Patches()
        self.after_op: Callable[[], None] | None = None
        """Called at the end of every kernel call while set, on the issuing thread (the handover
        to the native kernel, :class:`~meshprof.comm.selection.HandoverKernel`)."""

    def install(self) -> None:
        lib = torch.library.Library("c10d", "IMPL")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for spec in available_specs():
                self._register(lib, spec)
        self._lib = lib
        self._wait_lib = _install_wait_tensor(self.prof.completion.tensor_waited)
        patch_work_wait(
            self._patches, lambda _cls, original: self.prof.completion.wrap_wait(original)
        )

    def register_copy_of_one_kernel(self) -> None:
        """Register this kernel a second time for one op, over the first, and remove it again
        (it raises PyTorch's once-per-process warning about overriding a kernel as a Python
        warning, suppressed here, instead of on stderr when the native kernel is registered
        over this one)."""
        lib = torch.library.Library("c10d", "IMPL")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._register(lib, available_specs()[0])
        lib._destroy()

    def _register(self, lib: Any, spec: OpSpec) -> None:
        """This kernel as ``lib``'s BackendSelect implementation of ``spec``'s c10d op."""
        op = getattr(torch.ops.c10d, spec.schema_name).default
        lib.impl(
            spec.schema_name,
            _make_kernel(self, spec, _KernelTable(op)),
            "BackendSelect",
            with_keyset=True,
        )

    def uninstall(self) -> None:
        self._patches.undo()
        for lib in (self._lib, self._wait_lib):
            if lib is not None:
                lib._destroy()
        self._lib = self._wait_lib = None
        self.prof.completion.stop()

    def configure(self) -> None:
        """Nothing to do: the kernel reads the recorder's config at every op."""

    def set_step(self, step: int) -> None:
        """Nothing to do: the kernel reads the recorder's step at every op."""

    def drain(self, pending: bool = False) -> PendingOps | None:
        """Nothing to do: the kernel's ops go straight to the recorder's event log, and its ops
        in flight are the recorder's own."""
        return None

    def exclusive(self) -> Any:
        """Nothing to hold: this kernel has no drain of its own."""
        return contextlib.nullcontext()

    def settle(self, timeout_s: float) -> None:
        """Nothing to do: the recorder settles its own ops (``CommProfiler.completion``)."""

    def sweep(self) -> None:
        """Nothing to do: the recorder sweeps its own pending works (``CommProfiler.flush``)."""

    def inflight(self) -> list[InflightOp]:
        return []  # every op in flight is the recorder's own

    def next_seq(self, group: GroupRef, op: str, peer: int) -> int:
        return self.prof.seqs.next(group.log_index, op, peer)

    def composite_enter(self) -> None:
        """Nothing to do: the recorder's stack of composite ops counts the c10d ops inside."""

    def thread_cpu_ns(self) -> dict[str, int]:
        return {}  # its poller is a Python thread (meshprof-poller)

    def composite_exit(self) -> tuple[int, int, int]:
        return (0, 0, 0)


def _make_kernel(owner: PythonKernel, spec: OpSpec, table: _KernelTable) -> Callable[..., Any]:
    prof = owner.prof
    begin = prof.begin
    fail = prof.fail
    watch = prof.completion.watch  # called from here: it looks up the op's caller by depth
    internal_error = prof.report_internal_error
    caller_completes = spec.caller_completes
    call = table.call

    def kernel(keyset: Any, *args: Any) -> Any:
        rec = None
        try:
            rec = begin(spec, args)
        except Exception as e:  # never break training
            internal_error(e)
        if rec is None:
            out = call(keyset, args)
        else:
            try:
                out = call(keyset, args)
            except BaseException as e:
                fail(rec, e)
                raise
            watch(rec, out, output_tensors(spec, args) if caller_completes else None)
        if owner.after_op is not None:
            try:
                owner.after_op()
            except Exception as e:
                internal_error(e)
        return out

    kernel.__name__ = f"meshprof_{spec.schema_name}"
    return kernel


def _install_wait_tensor(waited: Callable[[Any, int], None]) -> Any:
    """A kernel for ``_c10d_functional::wait_tensor`` at ``BackendSelect`` that runs the op and
    then tells completion (``waited(tensor, end)``): a functional collective whose work only
    completes in its caller's wait (gloo's reduce_scatter) ends there. The op itself runs
    unchanged. None where this build has no functional collectives."""
    try:
        op = torch.ops._c10d_functional.wait_tensor.default
    except (AttributeError, RuntimeError):
        return None
    redispatch = op._handle.redispatch_boxed
    perf = time.perf_counter_ns

    def wait_tensor(keyset: Any, tensor: Any) -> Any:
        out = redispatch(keyset.remove(_BACKEND_SELECT), tensor)
        # never break training (a fake or meta tensor has no data pointer)
        with contextlib.suppress(Exception):
            waited(tensor, perf())
        return out

    lib = torch.library.Library("_c10d_functional", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lib.impl("wait_tensor", wait_tensor, "BackendSelect", with_keyset=True)
    return lib

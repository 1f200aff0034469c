"""Which dispatcher kernel records, and the handover from the Python kernel to the native one.

``ProfilerConfig.native`` (``MESHPROF_NATIVE``) chooses:

* ``None`` (default): the native (C++) kernel wherever it can run (:func:`native_supports_device`).
  When its build for this torch is cached it is installed at once. When it is not, the Python
  kernel records from the first collective and a background thread builds the extension (once
  per host, :mod:`meshprof.comm.native_ext`); when the build ends the recording is handed over
  to the native kernel (:class:`HandoverKernel`). A failed build warns once and the Python kernel
  goes on.
* ``True``: native, built now if needed (warns and uses Python when it cannot be built or run).
* ``False``: the Python kernel.

The handover happens on a thread that issues a collective, at the end of a Python kernel call
and while no composite op (object collective, ``label()``) is open: the native kernel's sequence
counters continue from the Python kernel's (so every rank keeps the same numbers whenever each
switches), then it is registered over the Python kernel, which stays registered underneath
(its ops still in flight keep completing through its poller and ``Work.wait`` hook; a kernel
never goes away while a collective runs through it). Every collective is recorded by exactly one
kernel: those issued before the switch by Python, those after by C++.
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any

from meshprof.comm import native_ext
from meshprof.comm.backend import GroupRef, KernelBackend, RecorderCore, SeqCounters
from meshprof.comm.completion import InflightOp, PendingOps
from meshprof.comm.python_kernel import PythonKernel
from meshprof.errors import MeshprofError

if TYPE_CHECKING:
    from meshprof.comm.native import NativeKernel


def native_supports_device() -> bool:
    """Whether the native kernel is the *default* here: no CUDA, or CUDA with the CUDA
    toolkit for its device-timing build (:func:`meshprof.comm.native_ext.build_with_cuda`).
    Verified on an H200 (torch 2.11, NCCL 2.28; ``benchmarks/gpu_native_check.py``: every
    all_reduce recorded once, device-timed within the NCCL kernel's time, no host
    synchronization). With CUDA but no toolkit the default is the Python kernel and its
    CUDA-event timing."""
    import torch

    return not torch.cuda.is_available() or native_can_time_device()


def native_can_time_device() -> bool:
    """With CUDA present, the native kernel can time on the device: its CUDA build is possible."""
    return native_ext.build_with_cuda()


def native_runs_here(device_timing: bool = True) -> bool:
    """The native kernel may record here by default: the device is supported, or device
    timing is off."""
    return native_supports_device() or not device_timing


def _warn(msg: str) -> None:
    with contextlib.suppress(Exception):
        warnings.warn(f"meshprof: {msg}", RuntimeWarning, stacklevel=4)


def choose_backend(prof: RecorderCore) -> KernelBackend:
    """The kernel ``prof.config.native`` asks for, as far as it can run here (module doc)."""
    mode = prof.config.native
    if mode is False:
        return PythonKernel(prof)
    if not native_runs_here(prof.config.device_timing):
        if not mode:
            return PythonKernel(prof)
        if not native_can_time_device():
            _warn(
                "native=True ignored: CUDA is present but the CUDA toolkit (CUDA_HOME) is not, "
                "so the native recorder cannot time on the device; using the Python recorder "
                "with CUDA-event timing"
            )
            return PythonKernel(prof)
    try:
        ready = native_ext.loaded() or native_ext.cached()
    except Exception as e:  # no source file, an unreadable cache: never break enable()
        _warn(f"the native recorder cannot be used ({type(e).__name__}: {e})")
        return PythonKernel(prof)
    if mode or ready:
        from meshprof.comm.native import NativeKernel

        try:
            return NativeKernel(prof)  # native=True: builds now when it is not cached
        except MeshprofError as e:  # no compiler, no headers: record with Python instead
            _warn(f"{e}; recording with the Python kernel")
            return PythonKernel(prof)
    return HandoverKernel(prof)


class _HandedOverSeqs(SeqCounters):
    """After a handover, a Python kernel call already under way (another thread) or a Python op
    completing (a recv from any source learning its sender) numbers from the native counters."""

    def __init__(self, prof: RecorderCore, native: NativeKernel) -> None:
        super().__init__()
        self._prof = prof
        self._native = native

    def next(self, gidx: int, op: str, peer: int) -> int:
        info = self._prof.log.groups[gidx]
        ref = GroupRef(gidx, len(info.ranks), 0, info.ranks, info.name)
        return self._native.next_seq(ref, op, peer)


class HandoverKernel:
    """The Python kernel until the native extension is built in the background, then the
    native one (module doc). Reports the name of the kernel recording now."""

    def __init__(self, prof: RecorderCore) -> None:
        self.prof = prof
        self.python = PythonKernel(prof)
        self.native: NativeKernel | None = None
        self.active: KernelBackend = self.python
        self.switched_ns = 0
        """Wall clock (ns) of the handover; 0 until it happens."""
        self.build_error = ""
        self._switching = threading.Lock()
        self._closed = False

    @property
    def name(self) -> str:
        return self.active.name

    def install(self) -> None:
        self.python.install()
        _silence_override_warning(self.python)
        native_ext.build_in_background(self._built)

    def _built(self, error: MeshprofError | None) -> None:
        """The background build ended (on its thread): arm the switch, or warn once."""
        if error is not None:
            self.build_error = str(error)
            _warn(f"{error}; recording with the Python kernel")
            return
        if not self._closed:
            self.python.after_op = self._switch

    def _switch(self) -> None:
        """Hand over to the native kernel (called at the end of a Python kernel call)."""
        if self.prof.open_composites or not self._switching.acquire(blocking=False):
            return
        try:
            if self._closed or self.native is not None:
                return
            from meshprof.comm.native import NativeKernel

            native = NativeKernel(self.prof)
            native.continue_seqs(self.prof.seqs.counts(self.prof.log.groups))
            native.install()
            self.prof.seqs = _HandedOverSeqs(self.prof, native)
            self.native = native
            self.active = native
            self.switched_ns = time.time_ns()
        except Exception as e:  # never break training: Python goes on recording
            self.build_error = f"{type(e).__name__}: {e}"
            _warn(f"the native recorder could not be installed ({self.build_error})")
        finally:
            self.python.after_op = None
            self._switching.release()

    def uninstall(self) -> None:
        self._closed = True
        self.python.after_op = None
        with self._switching:
            if self.native is not None:
                self.native.uninstall()
            self.python.uninstall()

    def configure(self) -> None:
        self.active.configure()

    def set_step(self, step: int) -> None:
        self.active.set_step(step)

    def drain(self, pending: bool = False) -> PendingOps | None:
        return self.active.drain(pending)

    def exclusive(self) -> Any:
        return self.active.exclusive()

    def settle(self, timeout_s: float) -> None:
        self.active.settle(timeout_s)

    def sweep(self) -> None:
        self.active.sweep()

    def inflight(self) -> list[InflightOp]:
        return self.active.inflight()

    def next_seq(self, group: GroupRef, op: str, peer: int) -> int:
        return self.active.next_seq(group, op, peer)

    def composite_enter(self) -> None:
        self.active.composite_enter()  # no handover while a composite is open: same kernel

    def composite_exit(self) -> tuple[int, int, int]:
        return self.active.composite_exit()

    def thread_cpu_ns(self) -> dict[str, int]:
        return self.native.thread_cpu_ns() if self.native is not None else {}

    def describe(self) -> dict[str, Any]:
        """For the rank file's meta: the handover, if any."""
        out: dict[str, Any] = {"from": "python"}
        if self.switched_ns:
            out["to"] = "native"
            out["at_ns"] = self.switched_ns
        if self.build_error:
            out["error"] = self.build_error
        return out


def _silence_override_warning(python: PythonKernel) -> None:
    """PyTorch warns once per process (on stderr, from C++) when a kernel is registered over
    another for the same op and key, as the handover does. Trigger that one warning here,
    through ``torch.library`` where it is a Python warning that can be suppressed, by
    registering a second Python kernel for one op over the first and removing it again (both
    record, so nothing is lost meanwhile)."""
    with contextlib.suppress(Exception):
        python.register_copy_of_one_kernel()


def planned_recorder(native: bool | None = None) -> dict[str, Any]:
    """Which kernel ``meshprof.enable()`` would record with in this environment, and why:
    {kernel: "native" | "python", native_built: bool, native_cache: directory, reason}.
    ``native`` defaults to ``MESHPROF_NATIVE`` (see :class:`~meshprof.config.ProfilerConfig`)."""
    from meshprof.config import native_from_env

    mode = native_from_env() if native is None else native
    out: dict[str, Any] = {
        "kernel": "python",
        "native_built": native_ext.cached(),
        "native_cache": str(native_ext.build_dir()),
        "reason": "",
    }
    if mode is False:
        out["reason"] = "MESHPROF_NATIVE=0"
    elif not native_supports_device():
        out["reason"] = (
            "CUDA is present but the CUDA toolkit (CUDA_HOME) is not: the native recorder "
            "could time on the host only"
        )
    elif out["native_built"]:
        out["kernel"] = "native"
        out["reason"] = "built and cached"
    else:
        out["reason"] = (
            "the native recorder is not built yet: the first enable() records with Python and "
            "builds it in the background (or build it now: meshprof build-native)"
        )
    return out

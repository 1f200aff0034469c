"""The native (C++) recorder: the same records as the Python dispatcher kernel, at well under a
microsecond per collective.

Opt-in with ``ProfilerConfig(native=True)`` (or ``MESHPROF_NATIVE=1``): the first use compiles
``recorder.cpp`` against the installed torch with ``torch.utils.cpp_extension`` (about 30 s,
cached per torch version under ``TORCH_EXTENSIONS_DIR``); it needs a C++ compiler. The C++ kernel
runs at the same ``BackendSelect`` key for every ``c10d::`` op, assigns seq with the same rules,
samples with the same hash and takes completion from the Work's future (a C++ callback, no GIL)
or, for works without one (gloo's send/recv; each Work class is asked for its future once), from
``Work.wait()`` returning in Python (``work_waited``), with a C++ polling thread (1 ms, backing off
to 20 ms) as the safety net for works nobody waits on. Python drains finished records into the
event log at every flush.

CUDA tensors are not timed natively (their futures complete at enqueue): with CUDA present the
Python path with CUDA-event timing is used instead.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from meshprof.errors import MeshprofError
from meshprof.events import FLAG_DROPPED, FLAG_UNSAMPLED, OP_CODES, GroupInfo

if TYPE_CHECKING:
    from meshprof.profiler import CommProfiler

#: Mirror of ``struct Rec`` in recorder.cpp (packed, 68 bytes).
NATIVE_DTYPE = np.dtype(
    [
        ("op", np.uint8),
        ("status", np.uint8),
        ("dtype", np.int16),
        ("flags", np.uint8),
        ("sampled", np.uint8),
        ("group", np.uint16),
        ("peer", np.int32),
        ("seq", np.int64),
        ("in_bytes", np.int64),
        ("out_bytes", np.int64),
        ("t0", np.int64),
        ("dur", np.int64),
        ("step", np.int64),
        ("token", np.int64),
    ]
)

#: schema name -> (in_arg, out_arg, p2p: 0 collective / 1 send / 2 recv, wait_thread)
_ARGS: dict[str, tuple[int, int, int, int]] = {
    "allreduce_": (0, 0, 0, 0),
    "allreduce_coalesced_": (0, 0, 0, 0),
    "allgather_": (1, 0, 0, 0),
    "_allgather_base_": (1, 0, 0, 0),
    "allgather_coalesced_": (1, 0, 0, 0),
    "allgather_into_tensor_coalesced_": (1, 0, 0, 0),
    "reduce_scatter_": (1, 0, 0, 1),
    "_reduce_scatter_base_": (1, 0, 0, 1),
    "reduce_scatter_tensor_coalesced_": (1, 0, 0, 1),
    "broadcast_": (0, 0, 0, 0),
    "reduce_": (0, 0, 0, 0),
    "gather_": (1, 0, 0, 0),
    "scatter_": (1, 0, 0, 0),
    "alltoall_": (1, 0, 0, 0),
    "alltoall_base_": (1, 0, 0, 0),
    "barrier": (-1, -1, 0, 0),
    "monitored_barrier_": (-1, -1, 0, 0),
    "send": (0, -1, 1, 0),
    "recv_": (-1, 0, 2, 0),
    "recv_any_source_": (-1, 0, 2, 0),
}

#: c10::ScalarType codes -> dtype names
_SCALAR_TYPES = {
    0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32",
    7: "float64", 8: "complex32", 9: "complex64", 10: "complex128", 11: "bool", 15: "bfloat16",
    23: "float8_e5m2", 24: "float8_e4m3fn",
}  # fmt: skip

_lock = threading.Lock()
_module: Any = None


def load() -> Any:
    """Compile (first time) and import the extension; MeshprofError says why it cannot."""
    global _module
    with _lock:
        if _module is not None:
            return _module
        try:
            from torch.utils.cpp_extension import load as load_ext

            src = Path(__file__).with_name("recorder.cpp")
            _module = load_ext(
                name="meshprof_native_recorder",
                sources=[str(src)],
                extra_cflags=["-O2"],
                verbose=bool(os.environ.get("MESHPROF_NATIVE_VERBOSE")),
            )
        except Exception as e:
            raise MeshprofError(
                f"the native recorder could not be built ({type(e).__name__}: {str(e)[:300]}); "
                "it needs a C++ compiler and torch's headers — use the default Python recorder"
            ) from None
        return _module


class NativeRecorder:
    """The installed C++ kernel of one CommProfiler, and the translation of its records."""

    def __init__(self, prof: CommProfiler) -> None:
        self.prof = prof
        self.mod = load()
        self._group_map: dict[int, int] = {}  # native group id -> the log's group index
        self._ranks: dict[int, tuple[int, ...]] = {}
        self._dtype_codes: dict[int, int] = {}
        if self.mod.record_size() != NATIVE_DTYPE.itemsize:
            raise MeshprofError("the native recorder was built from another meshprof version")

    def configure(self) -> None:
        from meshprof.comm.ops import available_specs

        cfg = self.prof.config
        table = []
        for spec in available_specs():
            in_arg, out_arg, p2p, wait_thread = _ARGS[spec.schema_name]
            table.append(
                (
                    spec.schema_name,
                    OP_CODES[spec.op],
                    spec.pg,
                    in_arg,
                    out_arg,
                    spec.tensor_arg,
                    spec.async_arg if spec.async_arg is not None else -1,
                    spec.peer_arg if spec.peer_arg is not None else -1,
                    p2p,
                    wait_thread,
                )
            )
        mask = 0
        for name, code in OP_CODES.items():
            if cfg.ops is None or name in cfg.ops:
                mask |= 1 << code
        self.mod.configure(table, int(cfg.sample_rate * 2**32), mask)
        self.mod.set_enabled(bool(cfg.enabled))
        self.names = [t[0] for t in table]

    def install(self) -> None:
        self.configure()
        self.mod.install(self.names)

    def uninstall(self) -> None:
        self.mod.uninstall()

    def set_step(self, step: int) -> None:
        self.mod.set_step(int(step))

    # -- translation --------------------------------------------------------------------------
    def _group(self, native_id: int, names: list[str]) -> int:
        idx = self._group_map.get(native_id)
        if idx is not None:
            return idx
        name = names[native_id] if native_id < len(names) else str(native_id)
        pg = None
        try:
            import torch

            pg = torch._C._distributed_c10d._resolve_process_group(name)  # type: ignore[arg-type]
        except Exception:
            pg = None
        if pg is not None:
            try:
                idx = self.prof._group(pg)[0]
            except Exception:
                idx = None
        if idx is None:
            idx = self.prof.log.group_index(GroupInfo(name, "", ()))
        self._group_map[native_id] = idx
        return idx

    def _dtype(self, code: int) -> int:
        c = self._dtype_codes.get(code)
        if c is None:
            name = "none" if code < 0 else _SCALAR_TYPES.get(code, f"scalar_type_{code}")
            c = self._dtype_codes[code] = self.prof.log.dtype_code(name)
        return c

    def _peer(self, gidx: int, local: int) -> int:
        if local < 0:
            return -1
        ranks = self.prof.log.groups[gidx].ranks
        return ranks[local] if local < len(ranks) else local

    def drain(self) -> None:
        """Move finished native records into the event log (called by ``CommProfiler.flush``)."""
        raw, names, errors = self.mod.drain()
        if not raw:
            return
        recs = np.frombuffer(raw, dtype=NATIVE_DTYPE)
        err = dict(errors)
        prof = self.prof
        offset = prof._wall_offset
        min_ns = prof._min_ns
        for r in recs.tolist():
            op, status, dtype, flags, sampled, g, peer, seq, in_b, out_b, t0, dur, step, token = r
            gidx = self._group(g, names)
            f = flags if sampled else (flags | FLAG_DROPPED | FLAG_UNSAMPLED)
            if sampled and status == 0 and dur < min_ns:
                f |= FLAG_DROPPED
            prof.log.append(
                (op, status, self._dtype(dtype), f, gidx, self._peer(gidx, peer), seq, in_b, out_b,
                 t0 + offset if sampled else 0, dur if sampled else -1, step,
                 err.get(token) if status else None, None)
            )  # fmt: skip

    def settle(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the native ops in flight to complete (their completion
        runs in C++: future callbacks, the poller); True when none is left."""
        import time

        deadline = time.monotonic() + max(timeout_s, 0.0)
        while self.mod.inflight_records():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.001)
        return True

    def inflight(self) -> list[dict[str, Any]]:
        """The native ops in flight, oldest first, as InflightOp fields."""
        raw = self.mod.inflight_records()
        if not raw:
            return []
        names = self.mod.group_names()
        now = self.mod.now()
        out = []
        for r in sorted(np.frombuffer(raw, dtype=NATIVE_DTYPE).tolist(), key=lambda r: r[10]):
            op, _st, dtype, _f, _s, g, peer, seq, in_b, out_b, t0, _d, _step, _tok = r
            gidx = self._group(g, names)
            info = self.prof.log.groups[gidx]
            out.append(
                {
                    "op": self.prof.log.op_name(op),
                    "group_name": info.name,
                    "group_ranks": info.ranks,
                    "seq": seq,
                    "peer": self._peer(gidx, peer),
                    "dtype": self.prof.log.dtypes[self._dtype(dtype)],
                    "in_bytes": in_b,
                    "out_bytes": out_b,
                    "start_ns": t0 + self.prof._wall_offset,
                    "age_ns": now - t0,
                    "thread_id": 0,
                }
            )
        return out

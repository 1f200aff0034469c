"""Time meshprof adds to one collective on the CPU path: median and p99 per call.

    python benchmarks/record_cost.py [--calls 2000] [--rounds 5] [--no-gloo]

Modes, alternated round by round in one process so drift hits all of them alike:
  disabled     meshprof not installed (PyTorch alone)
  passthrough  an empty Python kernel at BackendSelect that only forwards to the backend: the
               floor of any dispatcher-level hook (PyTorch's Python-kernel dispatch)
  python       meshprof.enable(ProfilerConfig(native=False)): the Python kernel
  default      meshprof.enable(): the default configuration (the native kernel once built:
               build it first with `meshprof build-native`, or this measures the Python kernel)
  sampled      meshprof.enable(sample_rate=0.1), default kernel

Besides the time per call (median, p99, on the calling thread) and the time of the read after
the calls (`prof.flush()`, per call: where the native kernel's records are moved into the event
log), each mode reports the CPU time
of every other thread of the process during its calls (/proc/self/task/*/schedstat, ns):
per call and per second of wall time. Minus the ``disabled`` row (the backend's own threads)
it is what the recorder's threads (pollers) and its callbacks on backend threads cost.

Workloads: PyTorch's fake backend (no communication: the figure is the hook's own cost), a
one-rank gloo group (a real backend, no peer to wait for), and gloo with 2 ranks (a real
16-byte all_reduce; differences are smaller than gloo's own jitter). ``overlap`` issues the
all_reduce with ``async_op=True``, computes ~1 ms, then waits (DDP's pattern: a work pending
while training computes, where a polling completion path would take CPU).
Prints tables; nothing here is a test.
"""

from __future__ import annotations

import argparse
import platform
import time
from typing import Any

import numpy as np

MODES = ("disabled", "passthrough", "python", "default", "sampled")


class _Passthrough:
    """An empty Python BackendSelect kernel for c10d::allreduce_, send and recv_ that only
    redispatches (the floor of any Python-level recorder)."""

    def __init__(self) -> None:
        import torch

        bs = torch._C.DispatchKey.BackendSelect
        self.lib = torch.library.Library("c10d", "IMPL")
        for name in ("allreduce_", "send", "recv_"):
            redispatch = getattr(torch.ops.c10d, name).default._handle.redispatch_boxed

            def kernel(keyset: Any, *args: Any, _r: Any = redispatch) -> Any:
                return _r(keyset.remove(bs), *args)

            self.lib.impl(name, kernel, "BackendSelect", with_keyset=True)

    def close(self) -> None:
        self.lib._destroy()


def _set_mode(mode: str, state: dict[str, Any]) -> None:
    import meshprof

    if state.get("pass") is not None:
        state["pass"].close()
        state["pass"] = None
    meshprof.reset()
    if mode == "passthrough":
        state["pass"] = _Passthrough()
    elif mode == "python":
        meshprof.enable(meshprof.ProfilerConfig(max_events=100_000, native=False))
    elif mode == "default":
        prof = meshprof.enable(meshprof.ProfilerConfig(max_events=100_000))
        state["kernel"] = prof.backend_name
    elif mode == "sampled":
        meshprof.enable(meshprof.ProfilerConfig(max_events=100_000, sample_rate=0.1))


def _other_threads_cpu_ns() -> int:
    """CPU time (ns) of every thread of this process except the calling one."""
    import os
    import threading

    me = threading.get_native_id()
    total = 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that ended meanwhile
    return total


def _compute(ns: int) -> None:
    end = time.perf_counter_ns() + ns
    while time.perf_counter_ns() < end:
        pass


def _time_calls(
    n: int,
    barrier: Any = None,
    op: str = "all_reduce",
    cpu: list[tuple[int, int]] | None = None,
    drain: list[int] | None = None,
) -> np.ndarray:
    """Per-call times (ns): ``all_reduce`` of 4 float32, ``p2p``: one send and one recv of
        4 float32 with the other rank through ``batch_isend_irecv``, both waited (the pattern of
        torch.distributed.pipelining), or ``overlap``: an async all_reduce, ~1 ms of compute, its
        wait (the compute is not in the time). Appends (other threads' CPU ns, wall ns) to ``cpu``
    and the time of the read (``prof.flush()``) after the calls to ``drain``."""
    import torch
    import torch.distributed as dist

    t = torch.ones(4)
    r = torch.empty(4)
    out = np.empty(n, dtype=np.int64)
    clock = time.perf_counter_ns
    peer = 1 - dist.get_rank() if op == "p2p" else 0
    cpu0, wall0 = _other_threads_cpu_ns(), clock()
    for i in range(n):
        if barrier is not None and i % 200 == 0:
            barrier()
        t0 = clock()
        if op == "p2p":
            ops = [dist.P2POp(dist.isend, t, peer), dist.P2POp(dist.irecv, r, peer)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
        elif op == "overlap":
            w = dist.all_reduce(t, async_op=True)
            t1 = clock()
            _compute(1_000_000)
            t2 = clock()
            w.wait()
            t0 += t2 - t1
        else:
            dist.all_reduce(t)
        out[i] = clock() - t0
    if cpu is not None:
        cpu.append((_other_threads_cpu_ns() - cpu0, clock() - wall0))
    if drain is not None:
        import meshprof

        prof = meshprof.get_profiler()
        t0 = clock()
        if prof is not None:
            prof.flush()  # the read side's share: native records move into the event log here
        drain.append(clock() - t0)
    return out


def measure(calls: int, rounds: int, barrier: Any = None, op: str = "all_reduce") -> dict[str, Any]:
    """Per mode: the per-call times (ns) and the other threads' CPU (ns per call, ns per s)."""
    state: dict[str, Any] = {}
    samples: dict[str, list[np.ndarray]] = {m: [] for m in MODES}
    cpu: dict[str, list[tuple[int, int]]] = {m: [] for m in MODES}
    drain: dict[str, list[int]] = {m: [] for m in MODES}
    for m in MODES:  # warm-up round, discarded
        _set_mode(m, state)
        _time_calls(min(calls, 200), barrier, op)
    for r in range(rounds):
        order = MODES if r % 2 == 0 else tuple(reversed(MODES))
        for m in order:
            _set_mode(m, state)
            samples[m].append(_time_calls(calls, barrier, op, cpu[m], drain[m]))
    _set_mode("disabled", state)
    out: dict[str, Any] = {m: np.concatenate(v) for m, v in samples.items()}
    out["cpu"] = {
        m: (
            sum(c for c, _ in v) / (calls * rounds),
            sum(c for c, _ in v) / (sum(w for _, w in v) / 1e9),
        )
        for m, v in cpu.items()
    }
    out["drain"] = {m: sum(v) / (calls * rounds) for m, v in drain.items()}
    out["kernel"] = state.get("kernel", "")
    return out


def _fake(calls: int, rounds: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    torch.set_num_threads(1)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        return measure(calls, rounds)
    finally:
        dist.destroy_process_group()


def _gloo_one_rank(calls: int, rounds: int, op: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from meshprof.launch.spawn import free_port

    torch.set_num_threads(1)
    port = free_port()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        return measure(calls, rounds, op=op)
    finally:
        dist.destroy_process_group()


def _gloo_rank(rank: int, ws: int, calls: int, rounds: int, op: str) -> dict[str, Any]:
    import torch.distributed as dist

    res = measure(calls, rounds, barrier=dist.barrier, op=op)
    return {m: (v.tolist() if isinstance(v, np.ndarray) else v) for m, v in res.items()}


def _row(name: str, v: np.ndarray, base: np.ndarray | None) -> str:
    med, p99 = np.median(v) / 1e3, np.percentile(v, 99) / 1e3
    if base is None:
        return f"| {name:<12} | {med:8.2f} | {p99:8.2f} | {'':>10} | {'':>10} |"
    dmed = med - np.median(base) / 1e3
    dp99 = p99 - np.percentile(base, 99) / 1e3
    return f"| {name:<12} | {med:8.2f} | {p99:8.2f} | {dmed:+10.2f} | {dp99:+10.2f} |"


def _table(title: str, res: dict[str, Any], what: str = "all_reduce of 4 float32") -> str:
    lines = [
        f"### {title}",
        "",
        "| mode         | median µs | p99 µs | added median µs | added p99 µs "
        "| other threads' CPU µs/call | ms/s | read (flush) µs/call |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = np.asarray(res["disabled"])
    for m in MODES:
        row = _row(m, np.asarray(res[m]), None if m == "disabled" else base)
        per_call, per_s = res["cpu"][m]
        lines.append(
            f"{row} {per_call / 1e3:8.2f} | {per_s / 1e6:8.2f} | {res['drain'][m] / 1e3:8.2f} |"
        )
    lines.append("")
    lines.append(
        f"{len(base)} calls per mode; {what}; the default configuration recorded with the "
        f"{res['kernel'] or '?'} kernel."
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description="time meshprof adds per collective")
    ap.add_argument("--calls", type=int, default=2000, help="calls per mode per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-gloo", action="store_true", help="skip the 2-rank gloo measurement")
    ap.add_argument(
        "--only", default="", help="comma-separated: fake, gloo1, overlap, gloo2, p2p (default all)"
    )
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else {"fake", "gloo1", "overlap", "gloo2", "p2p"}
    if args.no_gloo:
        only -= {"gloo2", "p2p"}

    import torch

    print(
        f"machine: {platform.processor() or platform.machine()}, {platform.system()}, "
        f"Python {platform.python_version()}, torch {torch.__version__}"
    )
    from meshprof.launch.spawn import run_ranks

    if "fake" in only:
        print(_table("fake backend, 1 process (hook cost alone)", _fake(args.calls, args.rounds)))
    if "gloo1" in only:
        res = run_ranks(_gloo_one_rank_worker, 1, (args.calls, args.rounds, "all_reduce"),
                        backend=None, timeout=600)[0]  # fmt: skip
        print()
        print(_table("gloo, one-rank group", res))
    if "overlap" in only:
        res = run_ranks(_gloo_one_rank_worker, 1, (args.calls // 4, args.rounds, "overlap"),
                        backend=None, timeout=600)[0]  # fmt: skip
        print()
        print(
            _table(
                "gloo, one-rank group: async all_reduce, 1 ms of compute, wait",
                res,
                "async all_reduce of 4 float32 pending during 1 ms of compute (not timed)",
            )
        )
    if "gloo2" in only:
        r0, _ = run_ranks(_gloo_rank, 2, (args.calls // 4, args.rounds, "all_reduce"), timeout=600)
        print()
        print(_table("gloo, 2 ranks, rank 0", r0))
    if "p2p" in only:
        r0, _ = run_ranks(_gloo_rank, 2, (args.calls // 4, args.rounds, "p2p"), timeout=600)
        print()
        print(
            _table(
                "gloo, 2 ranks, rank 0: send + recv (batch_isend_irecv, as pipelining)",
                r0,
                "one send and one recv of 4 float32 per call (two recorded ops)",
            )
        )


def _gloo_one_rank_worker(rank: int, ws: int, calls: int, rounds: int, op: str) -> dict[str, Any]:
    res = _gloo_one_rank(calls, rounds, op)
    return {m: (v.tolist() if isinstance(v, np.ndarray) else v) for m, v in res.items()}


if __name__ == "__main__":
    main()

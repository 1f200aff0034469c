"""Time meshprof adds to one collective on the CPU path: median and p99 per call.

    python benchmarks/record_cost.py [--calls 2000] [--rounds 5] [--no-gloo]

Modes, alternated round by round in one process so drift hits all of them alike:
  disabled     meshprof not installed (PyTorch alone)
  passthrough  an empty Python kernel at BackendSelect that only forwards to the backend: the
               floor of any dispatcher-level hook (PyTorch's Python-kernel dispatch)
  enabled      meshprof.enable(): full recording
  sampled      meshprof.enable(sample_rate=0.1)
  native       meshprof.enable(native=True): the C++ dispatcher kernel (compiled at first use)

First on PyTorch's fake backend (no communication: the figure is the hook's own cost), then on
gloo with 2 ranks (a real 16-byte all_reduce; differences are smaller than gloo's own jitter).
Prints a table; nothing here is a test.
"""

from __future__ import annotations

import argparse
import platform
import time
from typing import Any

import numpy as np

MODES = ("disabled", "passthrough", "enabled", "sampled", "native")


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
    elif mode == "enabled":
        meshprof.enable(meshprof.ProfilerConfig(max_events=100_000))
    elif mode == "sampled":
        meshprof.enable(meshprof.ProfilerConfig(max_events=100_000, sample_rate=0.1))
    elif mode == "native":
        meshprof.enable(meshprof.ProfilerConfig(max_events=100_000, native=True))


def _time_calls(n: int, barrier: Any = None, op: str = "all_reduce") -> np.ndarray:
    """Per-call times (ns): ``all_reduce`` of 4 float32, or ``p2p``: one send and one recv of
    4 float32 with the other rank through ``batch_isend_irecv``, both waited (the pattern of
    torch.distributed.pipelining)."""
    import torch
    import torch.distributed as dist

    t = torch.ones(4)
    r = torch.empty(4)
    out = np.empty(n, dtype=np.int64)
    clock = time.perf_counter_ns
    peer = 1 - dist.get_rank() if op == "p2p" else 0
    for i in range(n):
        if barrier is not None and i % 200 == 0:
            barrier()
        t0 = clock()
        if op == "p2p":
            ops = [dist.P2POp(dist.isend, t, peer), dist.P2POp(dist.irecv, r, peer)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
        else:
            dist.all_reduce(t)
        out[i] = clock() - t0
    return out


def measure(
    calls: int, rounds: int, barrier: Any = None, op: str = "all_reduce"
) -> dict[str, np.ndarray]:
    state: dict[str, Any] = {}
    samples: dict[str, list[np.ndarray]] = {m: [] for m in MODES}
    for m in MODES:  # warm-up round, discarded
        _set_mode(m, state)
        _time_calls(min(calls, 200), barrier, op)
    for r in range(rounds):
        order = MODES if r % 2 == 0 else tuple(reversed(MODES))
        for m in order:
            _set_mode(m, state)
            samples[m].append(_time_calls(calls, barrier, op))
    _set_mode("disabled", state)
    return {m: np.concatenate(v) for m, v in samples.items()}


def _fake(calls: int, rounds: int) -> dict[str, np.ndarray]:
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    torch.set_num_threads(1)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        return measure(calls, rounds)
    finally:
        dist.destroy_process_group()


def _gloo_rank(rank: int, ws: int, calls: int, rounds: int, op: str) -> dict[str, list[int]]:
    import torch.distributed as dist

    res = measure(calls, rounds, barrier=dist.barrier, op=op)
    return {m: v.tolist() for m, v in res.items()}


def _row(name: str, v: np.ndarray, base: np.ndarray | None) -> str:
    med, p99 = np.median(v) / 1e3, np.percentile(v, 99) / 1e3
    if base is None:
        return f"| {name:<12} | {med:8.2f} | {p99:8.2f} | {'':>10} | {'':>10} |"
    dmed = med - np.median(base) / 1e3
    dp99 = p99 - np.percentile(base, 99) / 1e3
    return f"| {name:<12} | {med:8.2f} | {p99:8.2f} | {dmed:+10.2f} | {dp99:+10.2f} |"


def _table(title: str, res: dict[str, np.ndarray], what: str = "all_reduce of 4 float32") -> str:
    lines = [
        f"### {title}",
        "",
        "| mode         | median µs | p99 µs | added median µs | added p99 µs |",
        "|---|---:|---:|---:|---:|",
    ]
    base = res["disabled"]
    for m in MODES:
        lines.append(_row(m, res[m], None if m == "disabled" else base))
    n = len(base)
    lines.append("")
    lines.append(f"{n} calls per mode; {what}.")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description="time meshprof adds per collective")
    ap.add_argument("--calls", type=int, default=2000, help="calls per mode per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-gloo", action="store_true", help="skip the 2-rank gloo measurement")
    args = ap.parse_args()

    import torch

    print(
        f"machine: {platform.processor() or platform.machine()}, {platform.system()}, "
        f"Python {platform.python_version()}, torch {torch.__version__}"
    )
    print(_table("fake backend, 1 process (hook cost alone)", _fake(args.calls, args.rounds)))
    if not args.no_gloo:
        from meshprof.spawn import run_ranks

        r0, _ = run_ranks(_gloo_rank, 2, (args.calls // 4, args.rounds, "all_reduce"), timeout=600)
        print()
        print(_table("gloo, 2 ranks, rank 0", {m: np.array(v) for m, v in r0.items()}))
        r0, _ = run_ranks(_gloo_rank, 2, (args.calls // 4, args.rounds, "p2p"), timeout=600)
        print()
        print(
            _table(
                "gloo, 2 ranks, rank 0: send + recv (batch_isend_irecv, as pipelining)",
                {m: np.array(v) for m, v in r0.items()},
                "one send and one recv of 4 float32 per call (two recorded ops)",
            )
        )


if __name__ == "__main__":
    main()

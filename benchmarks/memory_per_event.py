"""Bytes per retained event: the ring buffer's size per slot, and the process's RSS growth while
1M and 10M events go through ``EventLog.append`` (the recorder's real write path: staged
tuples, moved in chunks of 1024 into the numpy ring, statistics folded on every chunk).

    python benchmarks/memory_per_event.py [--sizes 1000000 10000000] [--collectives 1000000]

``--collectives N`` also measures the whole path with the default configuration (the native
kernel once built): N real all_reduces on PyTorch's fake backend through ``meshprof.enable()``,
read (``prof.flush()``) every 100,000, RSS growth per retained event.

Prints a table; nothing here is a test.
"""

from __future__ import annotations

import argparse
import gc
import platform
import time

import psutil

from meshprof.comm.recorder import CommProfiler
from meshprof.config import ProfilerConfig
from meshprof.events import EVENT_DTYPE, OP_CODES, GroupInfo


def _rss() -> int:
    gc.collect()
    return int(psutil.Process().memory_info().rss)


def measure(n: int) -> tuple[int, float, float]:
    """(ring bytes per slot, RSS growth per event, seconds) for n events in a ring of n slots."""
    before = _rss()
    prof = CommProfiler(ProfilerConfig(max_events=n))
    g = prof.log.group_index(GroupInfo("0", "default_pg", (0, 1, 2, 3), "gloo"))
    d = prof.log.dtype_code("float32")
    op = OP_CODES["all_reduce"]
    append = prof.log.append
    t0 = time.perf_counter()
    for i in range(n):
        append((op, 0, d, 0, g, -1, i, 4096, 4096, i, 1000 + (i & 1023), 0, None, None))
    prof.log.flush()
    secs = time.perf_counter() - t0
    grown = _rss() - before
    assert len(prof.log) == n
    per_slot = prof.log.nbytes // prof.log.capacity
    del prof
    return per_slot, grown / n, secs


def measure_collectives(n: int) -> tuple[str, float, float]:
    """(kernel, RSS growth per retained event, seconds) for n all_reduces recorded through the
    default configuration on the fake backend (ring of n slots)."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import meshprof

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    t = torch.ones(4)
    for _ in range(1000):  # warm-up, not retained
        dist.all_reduce(t)
    before = _rss()
    prof = meshprof.enable(ProfilerConfig(max_events=n))
    t0 = time.perf_counter()
    for i in range(n):
        dist.all_reduce(t)
        if i % 100_000 == 99_999:
            prof.flush()
    prof.flush()
    secs = time.perf_counter() - t0
    grown = _rss() - before
    assert len(prof.log) == n, len(prof.log)
    kernel = prof.backend_name
    meshprof.disable()
    dist.destroy_process_group()
    return kernel, grown / n, secs


def main() -> None:
    ap = argparse.ArgumentParser(description="bytes per retained event")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--collectives", type=int, default=0, help="also through the kernel")
    args = ap.parse_args()
    print(f"machine: {platform.machine()}, {platform.system()}, Python {platform.python_version()}")
    print(f"EVENT_DTYPE itemsize: {EVENT_DTYPE.itemsize} bytes")
    print()
    print("| events | ring bytes/slot | RSS growth bytes/event | append+flush ns/event |")
    print("|---:|---:|---:|---:|")
    for n in args.sizes:
        per_slot, per_event, secs = measure(n)
        print(f"| {n:,} | {per_slot} | {per_event:.1f} | {secs / n * 1e9:.0f} |")
    if args.collectives:
        kernel, per_event, secs = measure_collectives(args.collectives)
        print()
        print("| all_reduces (fake backend, default config) | kernel | RSS growth bytes/event "
              "| µs per all_reduce incl. recording |")  # fmt: skip
        print("|---:|---|---:|---:|")
        n = args.collectives
        print(f"| {n:,} | {kernel} | {per_event:.1f} | {secs / n * 1e6:.2f} |")


if __name__ == "__main__":
    main()

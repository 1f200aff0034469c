"""What one read of the recorder costs: ``flush()`` against ``read()`` (issue 32).

    python benchmarks/read_cost.py [--kernel native|python] [--n 2000]

A read (``events()``, ``stats()``, ``export_json``, a rank-file write, the live publisher) takes
one instant with the collectives in flight (:meth:`meshprof.comm.recorder.CommProfiler.read`);
``flush()`` only moves finished records into the log. On PyTorch's fake backend (one process, no
communication), after 1,000 ``all_reduce`` calls: the median time of ``flush()`` and of
``read(events=False)`` (no ring copy: what the live publisher does), ``read(events=False,
stats=True)`` (a copy of the running statistics), with nothing new, and after each batch of 100
new collectives. Prints one line per figure; nothing here is a test.
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable
from typing import Any


def _median_ns(f: Callable[[], Any], n: int) -> int:
    xs = []
    for _ in range(n):
        a = time.perf_counter_ns()
        f()
        xs.append(time.perf_counter_ns() - a)
    xs.sort()
    return xs[len(xs) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", choices=("native", "python"), default="native")
    ap.add_argument("--n", type=int, default=2000, help="reads per figure")
    args = ap.parse_args()

    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import meshprof

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    prof = meshprof.enable(
        meshprof.ProfilerConfig(max_events=100_000, native=args.kernel == "native")
    )
    print(
        f"machine: {platform.machine()}, Python {platform.python_version()}, torch "
        f"{torch.__version__}; kernel {prof.backend_name}; fake backend"
    )
    t = torch.ones(4)
    for _ in range(1000):
        dist.all_reduce(t)
    prof.flush()
    n = args.n
    print(f"flush(), nothing new: {_median_ns(prof.flush, n)} ns")
    print(f"read(events=False), nothing new: {_median_ns(lambda: prof.read(events=False), n)} ns")
    stats = _median_ns(lambda: prof.read(events=False, stats=True), max(n // 4, 1))
    print(f"read(events=False, stats=True), nothing new: {stats} ns")

    def after_batch(read: Callable[[], Any]) -> int:
        for _ in range(100):
            dist.all_reduce(t)
        a = time.perf_counter_ns()
        read()
        return time.perf_counter_ns() - a

    reads: tuple[tuple[str, Callable[[], Any]], ...] = (
        ("flush()", prof.flush),
        ("read(events=False)", lambda: prof.read(events=False)),
    )
    for name, fn in reads:
        xs = sorted(after_batch(fn) for _ in range(max(n // 8, 1)))
        print(f"{name} after 100 new collectives: {xs[len(xs) // 2]} ns")
    meshprof.disable()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

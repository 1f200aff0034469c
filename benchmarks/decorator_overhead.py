"""Cost of ``@performance_monitor`` per call of the step: disabled (must be < 1 µs) and enabled
with torch.profiler off (the step monitor and the recorder only).

    python benchmarks/decorator_overhead.py [--calls 200000]

Prints one table row per variant: ns per call above an undecorated function, best of 5 runs.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable

import meshprof


def per_call_ns(fn: Callable[[int], int], calls: int, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for i in range(calls):
            fn(i)
        best = min(best, (time.perf_counter_ns() - t0) / calls)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200_000)
    a = ap.parse_args()

    def step(i: int) -> int:
        return i

    base = per_call_ns(step, a.calls)
    off = meshprof.performance_monitor(None, enabled=False)(step)
    disabled = per_call_ns(off, a.calls) - base
    with tempfile.TemporaryDirectory() as d:
        mon = meshprof.performance_monitor(None, out_dir=d, profiler=False, print_fn=lambda s: None)
        on = mon(step)
        n = max(a.calls // 20, 1000)
        enabled = per_call_ns(on, n, repeats=3) - base
        mon.close()
    print(f"{'variant':<34} {'ns/call above plain call':>26}")
    print(f"{'undecorated call (reference)':<34} {base:>26.1f}")
    print(
        f"{'enabled=False':<34} {disabled:>26.1f}   ({'< 1 µs: ok' if disabled < 1000 else 'OVER 1 µs'})"
    )
    print(f"{'enabled, profiler off':<34} {enabled:>26.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Does ``meshprof bench`` report the busbw a plain timed loop of the same torch call gets?

For each op and size, R times in a row: (a) meshprof's bench (``run_bench_rank``), (b) a plain
loop written here without meshprof: barrier, t0, ``iters`` calls, t1; time = (t1 - t0) / iters,
averaged over ranks; busbw = S / time × the nccl-tests factor, computed here by hand; (c) the
plain loop again. Prints the median busbw of (a) and (b), the median of the paired ratios a/b
(the target: within 3%), and the median of b/c: the noise floor of the machine itself.
A benchmark, not a test: it never fails on a time.

    python benchmarks/bench_vs_loop.py [--nproc 2] [--repeats 7] [--iters 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

from meshprof.launch.spawn import run_ranks
from meshprof.tools.bench import BenchConfig, run_bench_rank

SIZES = (1 << 18, 1 << 20, 1 << 22, 1 << 24)
OPS = ("all_reduce", "all_gather")


def _plain_loop(
    dist, torch, op: str, size: int, iters: int, warmup: int, rank: int, n: int
) -> float:
    """Mean seconds per call, this rank."""
    if op == "all_reduce":
        x = torch.ones(size // 4)

        def call() -> None:
            dist.all_reduce(x)
    else:
        out = torch.empty(size // 4 // n * n)
        inp = torch.ones(size // 4 // n)
        fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

        def call() -> None:
            fn(out, inp)

    for _ in range(warmup):
        call()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - t0) / iters


def _plain_busbw(
    dist, torch, op: str, size: int, iters: int, warmup: int, rank: int, n: int
) -> float:
    t = torch.tensor(
        [_plain_loop(dist, torch, op, size, iters, warmup, rank, n)], dtype=torch.float64
    )
    dist.all_reduce(t)
    t_avg = t.item() / n
    s = (size // 4 // n * n * 4) if op == "all_gather" else size // 4 * 4
    factor = 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n
    return s / t_avg / 1e9 * factor


def _worker(
    rank: int, n: int, repeats: int, iters: int, warmup: int
) -> list[tuple[str, int, float, float, float, float]]:
    import torch
    import torch.distributed as dist

    rows = []
    for op in OPS:
        for size in SIZES:
            mb, plain, ratio, floor = [], [], [], []
            for _ in range(repeats):
                cfg = BenchConfig(
                    ops=(op,),
                    sizes=(size,),
                    warmup=warmup,
                    iters=iters,
                    check=False,
                    modes=("out-of-place",),
                )
                res = run_bench_rank(rank, n, cfg)
                b = _plain_busbw(dist, torch, op, size, iters, warmup, rank, n)
                c = _plain_busbw(dist, torch, op, size, iters, warmup, rank, n)
                if res is not None:
                    a = res.rows[0].busbw
                    mb.append(a)
                    plain.append(b)
                    ratio.append(a / b)
                    floor.append(b / c)
            if rank == 0:
                rows.append(
                    (
                        op,
                        size,
                        statistics.median(mb),
                        statistics.median(plain),
                        statistics.median(ratio),
                        statistics.median(floor),
                    )
                )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    rows = run_ranks(_worker, a.nproc, args=(a.repeats, a.iters, a.warmup), timeout=3600)[0]
    print(
        f"# {a.nproc} ranks, gloo/CPU, medians of {a.repeats} interleaved repeats of {a.iters} iterations"
    )
    print(
        f"{'op':<12}{'size':>10}{'meshprof busbw':>16}{'plain busbw':>13}{'a/b':>8}{'b/c (noise)':>13}"
    )
    worst = worst_floor = 0.0
    for op, size, mb, plain, ratio, floor in rows:
        worst = max(worst, abs(ratio - 1))
        worst_floor = max(worst_floor, abs(floor - 1))
        print(f"{op:<12}{size:>10}{mb:>16.3f}{plain:>13.3f}{ratio:>8.3f}{floor:>13.3f}")
    # the one thing bench's loop does that the plain loop does not: a timestamp per iteration
    import numpy as np

    k = 200_000
    stamps = np.empty(k + 1, dtype=np.int64)
    now = time.perf_counter_ns
    t0 = now()
    for i in range(k):
        stamps[i + 1] = now()
    per = (now() - t0) / k
    fastest = min(size / (mb * 1e9) * 1e9 for _, size, mb, *_ in rows if mb > 0)
    print(
        f"# bench's extra work per iteration (a timestamp): {per:.0f} ns = {per / fastest * 100:.3f}% of the shortest op measured"
    )
    print(
        f"# largest difference meshprof vs plain loop: {worst * 100:.1f}%; plain loop vs itself: {worst_floor * 100:.1f}%"
    )


if __name__ == "__main__":
    main()

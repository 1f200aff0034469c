"""What the crash-safe tick costs: per collective (A/B), per tick, per step.

    python benchmarks/crashsafe_cost.py [--calls 40000] [--rounds 4] [--native]

A/B on PyTorch's fake backend (no communication: the figures are meshprof's own), one process,
meshprof recording in both modes, a :class:`~meshprof.rundir.writer.RankWriter` running its
thread in both (rank-file interval 1 h, so only the tick differs):

  tick off    ``crashsafe_tick_s=0``: the writer's thread sleeps
  tick 0.5 s  the default: every 0.5 s the thread flushes the recorder and copies the new events
              into the mapped files (``meshprof.rundir.crashsafe``)

Modes alternate round by round so drift hits both alike. The tick adds nothing to the hot path
(no code there): what can show is the tick holding the GIL while a collective runs, so the table
gives the median, p99 and the mean per call (the mean carries the tick's whole cost spread over
the calls). Then the tick's own duration with 1,000 / 100,000 new events, and the per-step cost
of noting the step in the mapped cursor. Prints tables; nothing here is a test.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

MODES = ("tick off", "tick 0.5 s")


def _time_calls(n: int) -> np.ndarray:
    import torch
    import torch.distributed as dist

    t = torch.ones(4)
    out = np.empty(n, dtype=np.int64)
    clock = time.perf_counter_ns
    for i in range(n):
        t0 = clock()
        dist.all_reduce(t)
        out[i] = clock() - t0
    return out


def _round(mode: str, calls: int, run_dir: Path, native: bool) -> tuple[np.ndarray, int]:
    import meshprof
    from meshprof.rundir.writer import RankWriter

    meshprof.reset()
    prof = meshprof.enable(meshprof.ProfilerConfig(max_events=1_000_000, native=native))
    tick = 0.5 if mode == "tick 0.5 s" else 0.0
    w = RankWriter(run_dir, prof, interval_s=3600.0, rank=0, crashsafe_tick_s=tick)
    w.start()
    try:
        times = _time_calls(calls)
    finally:
        ticks = w.crashsafe.ticks if w.crashsafe is not None else 0
        w.stop(final_write=False)
        meshprof.reset()
    return times, ticks


def _per_tick(new_events: int, run_dir: Path, preflush: bool) -> float:
    """Median ms of one tick that copies ``new_events`` new events (append, then tick).
    ``preflush``: the recorder's own flush (staged tuples into its ring and statistics, which
    every read and every 1,024 events do anyway) runs before the timer starts, so only what
    the tick adds is timed."""
    from meshprof.comm.recorder import CommProfiler
    from meshprof.config import ProfilerConfig
    from meshprof.events import OP_CODES, GroupInfo
    from meshprof.rundir.crashsafe import CrashSafeStore

    prof = CommProfiler(ProfilerConfig(max_events=1_000_000))
    g = prof.log.group_index(GroupInfo("0", "default_pg", (0, 1), "gloo"))
    store = CrashSafeStore(run_dir)
    ar = OP_CODES["all_reduce"]
    out = []
    seq = 0
    for _ in range(6):
        for _ in range(new_events):
            prof.log.append((ar, 0, 0, 0, g, -1, seq, 16, 16, seq, 10, 0, None, None))
            seq += 1
        if preflush:
            prof.flush()
        t0 = time.perf_counter_ns()
        store.tick(prof, None, 0)
        out.append(time.perf_counter_ns() - t0)
    store.discard()
    return float(np.median(out[1:])) / 1e6


def _per_step(run_dir: Path) -> float:
    """ns per step change with the store's listener on the recorder, minus without."""
    from meshprof.comm.recorder import CommProfiler
    from meshprof.config import ProfilerConfig
    from meshprof.rundir.crashsafe import CrashSafeStore

    n = 200_000
    prof = CommProfiler(ProfilerConfig(max_events=16))
    clock = time.perf_counter_ns

    def loop() -> float:
        t0 = clock()
        for s in range(n):
            prof.step = s
        return (clock() - t0) / n

    base = min(loop() for _ in range(3))
    store = CrashSafeStore(run_dir)
    store.tick(prof, None, 0)
    with_store = min(loop() for _ in range(3))
    store.discard()
    return with_store - base


def main() -> None:
    ap = argparse.ArgumentParser(description="cost of the crash-safe tick")
    ap.add_argument("--calls", type=int, default=40_000, help="calls per mode per round")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--native", action="store_true", help="record with the native kernel")
    args = ap.parse_args()

    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    print(
        f"machine: {platform.processor() or platform.machine()}, {platform.system()}, "
        f"Python {platform.python_version()}, torch {torch.__version__}"
    )
    torch.set_num_threads(1)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    samples: dict[str, list[np.ndarray]] = {m: [] for m in MODES}
    ticks = dict.fromkeys(MODES, 0)
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp)
        for m in MODES:  # warm-up, discarded
            _round(m, 2000, run_dir, args.native)
        for r in range(args.rounds):
            for m in MODES if r % 2 == 0 else tuple(reversed(MODES)):
                times, n = _round(m, args.calls, run_dir, args.native)
                samples[m].append(times)
                ticks[m] += n
        dist.destroy_process_group()
        res: dict[str, Any] = {m: np.concatenate(v) for m, v in samples.items()}
        base = res["tick off"]
        kernel = "native" if args.native else "python"
        print(f"\n### per all_reduce, fake backend, {kernel} recorder\n")
        print("| mode | median µs | p99 µs | mean µs | added mean µs | ticks |")
        print("|---|---:|---:|---:|---:|---:|")
        for m in MODES:
            v = res[m]
            add = "" if m == "tick off" else f"{(v.mean() - base.mean()) / 1e3:+.3f}"
            print(
                f"| {m} | {np.median(v) / 1e3:.2f} | {np.percentile(v, 99) / 1e3:.2f} | "
                f"{v.mean() / 1e3:.3f} | {add} | {ticks[m]} |"
            )
        print(f"\n{len(base)} calls per mode, {args.rounds} rounds alternated.")
        print("\n### one tick\n")
        for n in (1_000, 100_000):
            print(
                f"- {n:,} new events: {_per_tick(n, run_dir, False):.2f} ms with the recorder's "
                f"flush, {_per_tick(n, run_dir, True):.2f} ms for the copy alone"
            )
        print(f"- per step (cursor store): {_per_step(run_dir):+.0f} ns")


if __name__ == "__main__":
    main()

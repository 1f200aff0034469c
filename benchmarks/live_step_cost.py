"""What the live-state publisher (``--live-interval``) costs a training process.

    python benchmarks/live_step_cost.py [--steps 400] [--collectives 20] [--rounds 4]

One process on PyTorch's fake backend (no communication: the figure is meshprof's own cost). A
"step" is ``--collectives`` all_reduces plus ~1 ms of busy compute inside ``StepMonitor.step()``.
Two modes alternate round by round in the same process so drift hits both alike:

  session   RecordingSession(run_dir, live_interval_s=0): recorder, step monitor, rank writer
  live      the same with live_interval_s=0.05 (20 records a second: 20x the default rate, so
            the cost per default 1 s interval is measurable)

Printed: the median step time of each mode and their difference, and the publisher's own
thread CPU per record (``LivePublisher.cost_ns``), per second at the default 1 s interval.
Nothing here is a test.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _round(mode: str, steps: int, collectives: int, base: Path) -> tuple[list[int], int, int]:
    import torch
    import torch.distributed as dist

    import meshprof
    from meshprof.session.recording import RecordingSession, SessionConfig

    meshprof.reset()
    run_dir = Path(tempfile.mkdtemp(dir=base))
    cfg = SessionConfig(
        run_dir=run_dir,
        flush_interval_s=0,
        live_interval_s=0.05 if mode == "live" else 0.0,
        clock_sync=False,
    )
    session = RecordingSession(cfg).start()
    assert session.monitor is not None
    t = torch.ones(4)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter_ns()
        with session.monitor.step(tokens=1024):
            for _ in range(collectives):
                dist.all_reduce(t)
            _busy(0.001)
        times.append(time.perf_counter_ns() - t0)
    live = session.live
    cost, records = (live.cost_ns, live.publishes) if live is not None else (0, 0)
    session.stop(final_write=False)
    meshprof.reset()
    return times, cost, records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--collectives", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()

    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    torch.set_num_threads(1)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    samples: dict[str, list[int]] = {"session": [], "live": []}
    cost = records = 0
    with tempfile.TemporaryDirectory() as tmp:
        _round("live", 50, args.collectives, Path(tmp))  # warm-up
        for r in range(args.rounds):
            for mode in ("session", "live") if r % 2 == 0 else ("live", "session"):
                times, c, n = _round(mode, args.steps, args.collectives, Path(tmp))
                samples[mode] += times
                cost, records = cost + c, records + n
    dist.destroy_process_group()
    med = {m: statistics.median(v) / 1e3 for m, v in samples.items()}
    per_record = cost / max(records, 1) / 1e3
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    print(
        f"steps: {args.steps} x {args.rounds} rounds per mode, {args.collectives} all_reduces each"
    )
    print("| mode | median step (µs) | vs session (µs) |")
    print("|---|---:|---:|")
    print(f"| session (no live state) | {med['session']:.1f} | |")
    print(f"| live, 20 records/s | {med['live']:.1f} | {med['live'] - med['session']:+.1f} |")
    print(
        f"publisher thread CPU: {per_record:.0f} µs per record over {records} records = "
        f"{per_record / 1e4:.3f}% of one core at the default 1 s interval"
    )


if __name__ == "__main__":
    main()

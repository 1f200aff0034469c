"""What the what-if attribution (``meshprof.analyze.run.what_if.what_if``) costs and how close it is, at scale.

Writes the synthetic dp × tp × pp run of ``scale_report.py`` (one rank 30 % slower in every
phase, clocks off by up to ±30 ms) and the same run without the slow rank (same random draws),
whose step ends give the truth: how much shorter each step is without the slow rank's extra
compute. Then, in this process, loads the run, builds the table, clocks, match and stragglers
once, and times ``what_if`` alone (best of ``--repeat``; wall and CPU seconds). Prints one
Markdown row.

    python benchmarks/what_if_cost.py [--ranks 1024] [--events 2000000] [--steps 20]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale_report import layout_of
from synth_run import write_run

from meshprof.analyze.run.events.clock import align_clocks
from meshprof.analyze.run.events.match import match_collectives
from meshprof.analyze.run.events.table import build_event_table
from meshprof.analyze.run.stragglers.stragglers import find_stragglers
from meshprof.analyze.run.what_if.what_if import what_if
from meshprof.rundir import load_run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=1024)
    p.add_argument("--events", type=int, default=2_000_000, help="total over all ranks")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--tmp", type=Path, default=Path(tempfile.gettempdir()))
    a = p.parse_args(argv)
    n, per_rank = a.ranks, a.events // a.ranks
    layout = layout_of(n)
    kw = dict(seed=1, layout=layout, clock_ms=30, slow_phases=(1, 2, 3))
    d, d0 = a.tmp / f"meshprof_whatif_{n}", a.tmp / f"meshprof_whatif_{n}_truth"
    info = write_run(d, n, per_rank, a.steps, slow_rank=n // 3, **kw)
    base = write_run(d0, n, per_rank, a.steps, slow_rank=n // 3, slow=0.0, **kw)
    shutil.rmtree(d0, ignore_errors=True)
    diff = np.asarray(info["job_step_end_ns"]) - np.asarray(base["job_step_end_ns"])
    truth = float(np.median(diff))
    run = load_run(d)
    table = build_event_table(run)
    clock = align_clocks(run, table)
    match = match_collectives(table, clock)
    strag = find_stragglers(run, table, clock, match)
    best_wall = best_cpu = float("inf")
    for _ in range(a.repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        w = what_if(run, table, clock, match, strag)
        best_wall = min(best_wall, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    shutil.rmtree(d, ignore_errors=True)
    top = w.ranks[0]
    scen = f"{len(w.ranks)} + {len(w.groups)} + {len(w.dims)}"
    print(
        "| ranks | layout | events | steps replayed | scenarios (ranks + groups + dims) | levels "
        "| what_if wall | what_if CPU | first | its saving | truth | replay error |"
    )
    print("|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {n:,} | {'x'.join(map(str, layout))} | {len(table):,} | {len(w.steps)} | {scen} "
        f"| {w.levels} | {best_wall:.2f} s | {best_cpu:.2f} s | {top.rank} (slow: {n // 3}) "
        f"| {top.step_saving_ns / 1e6:.3f} ms | {truth / 1e6:.3f} ms | {w.replay_error_ns} ns |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

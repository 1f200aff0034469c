"""How often meshprof's conclusions match a counterfactual truth: the what-if (ranks, groups,
dimensions), its call-outs, the straggler finding, exposed communication and the diff, over
seeded random jobs of the simulator in ``tests/sim`` (dp, tp, pp 1-8; naive, GPipe, 1F1B and
interleaved schedules; eager, rendezvous and async point-to-point; blocking, DDP-bucket and
FSDP data parallelism; clock offsets, jitter; one to three slow ranks, a slow link, or none).

Each job runs ``meshprof report``'s analysis on the simulated run directory; the truth is the
simulator's own job re-run with the slow rank (group, dimension) fixed, same random draws.
A figure is right when within 10 % of the truth or 20 µs (see ``tests/sim/check.py``); a job
whose costliest rank has no peer (pure pipeline parallelism) is right when the report says it
cannot measure it (counted in "said not measured").
Prints the accuracy table (Markdown) and, with ``--failures``, the jobs that failed.

    python benchmarks/what_if_accuracy.py [--jobs 200] [--seed 0] [--max-ranks 64]
                                          [--diff-every 5] [--failures]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from sim.check import JobCheck, check_job
from sim.jobsim import random_job


def _kind(c: JobCheck) -> str:
    if c.job.slow_links:
        return "slow link"
    if not c.job.slow:
        return "balanced"
    return f"{len(c.job.slow)} slow rank" + ("s" if len(c.job.slow) > 1 else "")


def _row(name: str, cs: list[JobCheck]) -> str:
    n = len(cs)

    def pct(xs: list[bool]) -> str:
        return f"{100 * sum(xs) / len(xs):.1f} %" if xs else "-"

    diffs = [c.diff_ok for c in cs if c.diff]
    err = [c.rank.saving_ns - c.rank.truth_ns for c in cs if c.rank.said != "(not measured)"]
    unmeasured = sum(c.rank.said == "(not measured)" for c in cs)
    return (
        f"| {name} | {n} | {unmeasured} | {pct([c.rank.ok for c in cs])} "
        f"| {pct([c.group.ok for c in cs])} "
        f"| {pct([c.dim.ok for c in cs])} | {pct([c.negative_ok for c in cs])} "
        f"| {pct([c.notable_ok for c in cs])} | {pct([c.stragglers_ok for c in cs])} "
        f"| {pct([c.exposed_err <= 0.01 for c in cs])} | {pct(diffs)} "
        f"| {np.median(np.abs(err)) / 1e3 if err else float('nan'):.1f} µs |"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-ranks", type=int, default=64)
    p.add_argument("--diff-every", type=int, default=5, help="check the diff on every n-th job")
    p.add_argument("--failures", action="store_true", help="list the jobs that failed")
    a = p.parse_args(argv)
    rng = np.random.default_rng(a.seed)
    t0 = time.perf_counter()
    checks: list[JobCheck] = []
    for i in range(a.jobs):
        job = random_job(rng, a.max_ranks)
        checks.append(check_job(job, diff=a.diff_every > 0 and i % a.diff_every == 0))
    wall = time.perf_counter() - t0
    print(
        f"{a.jobs} jobs (seed {a.seed}, ≤ {a.max_ranks} ranks) in {wall:.0f} s; "
        f"Python {platform.python_version()}, {platform.machine()}"
    )
    print()
    print(
        "| jobs | n | said not measured (no peers) | top rank right | top group right "
        "| top dim right | no negative "
        "| call-outs right | stragglers: none wrong | exposed comm ≤ 1 % | diff right "
        "| median abs error (top rank) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(_row("all", checks))
    by: dict[str, list[JobCheck]] = defaultdict(list)
    for c in checks:
        by[f"pp {c.job.schedule}" if c.job.pp > 1 else "no pp"].append(c)
        if c.job.pp > 1:
            by[f"p2p {c.job.p2p}"].append(c)
        by[f"dp {c.job.dp_mode}" if c.job.dp > 1 else "no dp"].append(c)
        by[_kind(c)].append(c)
    for name in sorted(by):
        if by[name]:
            print(_row(name, by[name]))
    if a.failures:
        print()
        for c in checks:
            bad = [
                n
                for n, ok in (
                    ("rank", c.rank.ok),
                    ("group", c.group.ok),
                    ("dim", c.dim.ok),
                    ("negative", c.negative_ok),
                    ("call-outs", c.notable_ok),
                    ("stragglers", c.stragglers_ok),
                    ("exposed", c.exposed_err <= 0.01),
                    ("diff", c.diff_ok),
                )
                if not ok
            ]
            if bad:
                print(f"FAILED {bad}: {c.job}")
                print(f"   rank {c.rank}\n   group {c.group}\n   dim {c.dim}")
                print(f"   notable {c.notable} stragglers {c.stragglers} note {c.note!r}")
                print(f"   exposed_err {c.exposed_err:.4f} diff {c.diff}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

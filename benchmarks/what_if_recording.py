"""How often the what-if's saving of a slow rank matches the truth when the same job is recorded
by different recorders (issue 41): per family of jobs (``tests/sim/families.py``: program order
around point-to-point ops, point-to-point semantics, the slow rank's stage in deep pipelines,
FSDP prefetch) and per recording (``tests/sim/recording.py``: exact, a poller's lag, lateness
tied to the rank's next blocking op or to the end of the following exchange, on all chains or
some, flags present or absent).

The truth is the simulator's job re-run without the slow rank's slowness (same random draws;
``tests/sim/jobsim.py`` shares no code with the analysis). *Right*: within 10 % of the truth or
20 µs and the slow rank is the costliest, or the report says it cannot measure it ("not
measured": a record without flags that cannot tell an op in flight from one seen late);
*invariant*: within that tolerance of the saving from the exact recording.

    python benchmarks/what_if_recording.py [--seeds 3] [--failures]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from sim.check_recording import RecordingResult, check_family
from sim.families import RECORDINGS, families


def _row(name: str, rs: list[RecordingResult]) -> str:
    n = len(rs)
    right = sum(r.right for r in rs)
    inv = sum(r.invariant for r in rs)
    nm = sum(not r.measured for r in rs)
    errs = sorted(
        abs(r.saving_ns - r.truth_ns) / r.truth_ns for r in rs if r.measured and r.truth_ns > 0
    )
    worst = f"{100 * errs[-1]:.1f} %" if errs else "-"
    med = f"{100 * errs[len(errs) // 2]:.1f} %" if errs else "-"
    return (
        f"| {name} | {n} | {100 * right / n:.1f} % | {100 * inv / n:.1f} % | {nm} | {med} "
        f"| {worst} |"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=3, help="seeds of the families (0..n-1)")
    p.add_argument("--failures", action="store_true", help="list the cases that were wrong")
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    results: list[RecordingResult] = []
    for seed in range(a.seeds):
        for fam in families(seed):
            results += check_family(fam, RECORDINGS)
    wall = time.perf_counter() - t0
    print(
        f"{len(results)} cases ({a.seeds} seeds × {len(families(0))} families × "
        f"{len(RECORDINGS)} recordings) in {wall:.0f} s; Python {platform.python_version()}, "
        f"{platform.machine()}"
    )
    print()
    head = (
        "| {} | cases | right | invariant | said not measured | median error "
        "| largest error |\n|---|---:|---:|---:|---:|---:|---:|"
    )
    by_fam: dict[str, list[RecordingResult]] = defaultdict(list)
    by_rec: dict[str, list[RecordingResult]] = defaultdict(list)
    for r in results:
        by_fam[r.family].append(r)
        by_rec[r.recording].append(r)
    print(head.format("family"))
    print(_row("**all**", results))
    for name, rs in by_fam.items():
        print(_row(name, rs))
    print()
    print(head.format("recording"))
    for name, rs in by_rec.items():
        print(_row(name, rs))
    if a.failures:
        print()
        for r in results:
            if not (r.right and r.invariant):
                print(
                    f"- {r.family} / {r.recording}: saving {r.saving_ns / 1e3:.1f} µs, truth "
                    f"{r.truth_ns / 1e3:.1f} µs, exact recording {r.exact_ns / 1e3:.1f} µs"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

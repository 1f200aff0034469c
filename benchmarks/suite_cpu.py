"""Where the test suite's CPU time goes: a pytest plugin that writes, per test, the CPU seconds
of the test's own process and of every process it started, and a summary by module.

The suite is CPU-bound on 2 cores (issue 38): its wall time follows its CPU time, so this is
the measure to cut. Wall time per test (``--durations``) says little under xdist, where tests
slow each other down.

Record (any pytest arguments; the plugin is loaded in every xdist worker)::

    MESHPROF_SUITE_CPU=/tmp/cpu.tsv PYTHONPATH=benchmarks python -m pytest -q -p suite_cpu

Summarize::

    python benchmarks/suite_cpu.py /tmp/cpu.tsv [--tests 30]

A row of the file: ``nodeid  self_s  children_s  wall_s  start_s  worker``. ``self_s``: user +
system CPU of the worker process during the test (its fixtures included). ``children_s``: the same for every
process below the worker, whether it ended during the test (the kernel adds a reaped child's
time, and that of the children it reaped, to its parent) or still runs (read from
``/proc/PID/stat``: its own time and that of the children it reaped). A process that outlives
its parent and is reaped by init is not counted. ``start_s``: when the test started (seconds
since the epoch, after any wait for the serial lock); ``worker``: the xdist worker's id.
Linux only.

``--timeline`` adds when each worker was busy: its first start, last end and the seconds it ran
tests, and, per stretch of the run, the workers busy on average: idle workers at the start (the
serial tests) or the end (a long module started last) are wall time that CPU cuts do not buy
back.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _descendants_cpu_s() -> float:
    """CPU seconds of every process below this one: the reaped ones (RUSAGE_CHILDREN) and the
    live ones (utime, stime, cutime, cstime of each, from /proc)."""
    me = os.getpid()
    children: dict[int, list[int]] = defaultdict(list)
    cpu: dict[int, float] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        pid = int(name)
        children[int(fields[1])].append(pid)
        cpu[pid] = sum(int(x) for x in fields[11:15]) / _HZ
    total, stack = 0.0, list(children.get(me, []))
    while stack:
        pid = stack.pop()
        total += cpu.get(pid, 0.0)
        stack.extend(children.get(pid, []))
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return total + reaped.ru_utime + reaped.ru_stime


def _self_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Iterator[None]:
    out = os.environ.get("MESHPROF_SUITE_CPU")
    if not out:
        yield
        return
    s0, c0, t0, start = _self_cpu_s(), _descendants_cpu_s(), time.monotonic(), time.time()
    yield
    s1, c1, t1 = _self_cpu_s(), _descendants_cpu_s(), time.monotonic()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(out, "a") as f:
        f.write(
            f"{item.nodeid}\t{s1 - s0:.2f}\t{c1 - c0:.2f}\t{t1 - t0:.2f}\t{start:.2f}\t{worker}\n"
        )


Row = tuple[str, float, float, float, float | None, str | None]
"""(nodeid, self_s, children_s, wall_s, start_s, worker); the last two None in a file written
before they were recorded."""


def read_rows(path: Path) -> list[Row]:
    """The rows of a file the plugin wrote."""
    rows: list[Row] = []
    for line in path.read_text().splitlines():
        nodeid, *f = line.split("\t")
        start, worker = (float(f[3]), f[4]) if len(f) >= 5 else (None, None)
        rows.append((nodeid, float(f[0]), float(f[1]), float(f[2]), start, worker))
    return rows


def summarize(path: Path, tests: int) -> str:
    """Per module: CPU seconds (self, children), wall seconds and tests, most CPU first; then
    the ``tests`` tests with the most CPU."""
    by_module: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    rows: list[tuple[float, str]] = []
    for nodeid, own, below, wall, _, _ in read_rows(path):
        m = by_module[nodeid.split("::", 1)[0]]
        m[0] += own
        m[1] += below
        m[2] += wall
        m[3] += 1
        rows.append((own + below, nodeid.split("@", 1)[0]))
    total_self = sum(m[0] for m in by_module.values())
    total_children = sum(m[1] for m in by_module.values())
    out = [
        f"{total_self + total_children:.0f} CPU s in tests ({total_self:.0f} in the workers, "
        f"{total_children:.0f} in the processes they started), {len(rows)} tests",
        f"{'CPU s':>7} {'self':>6} {'child':>7} {'wall s':>7} {'tests':>5}  module",
    ]
    for module, (s, c, w, n) in sorted(by_module.items(), key=lambda kv: -(kv[1][0] + kv[1][1])):
        out.append(f"{s + c:7.1f} {s:6.1f} {c:7.1f} {w:7.1f} {int(n):5d}  {module}")
    out.append("")
    out.append(f"the {tests} tests with the most CPU:")
    out.extend(f"{cpu:7.1f}  {nodeid}" for cpu, nodeid in sorted(rows, reverse=True)[:tests])
    return "\n".join(out)


def timeline(path: Path, stretch_s: float) -> str:
    """Per worker: first start, last end (seconds from the run's first test start) and the
    seconds it ran tests; then, per ``stretch_s`` of the run, how many workers ran a test on
    average. Needs the ``start_s`` and ``worker`` columns."""
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for _, _, _, wall, start, worker in read_rows(path):
        if start is not None and worker is not None:
            spans[worker].append((start, start + wall))
    if not spans:
        return "no start times in this file (recorded before the timeline columns)"
    t0 = min(a for s in spans.values() for a, _ in s)
    t1 = max(b for s in spans.values() for _, b in s)
    out = [f"{'worker':>8} {'first':>7} {'last':>7} {'busy s':>7}"]
    for worker, s in sorted(spans.items()):
        first, last = min(a for a, _ in s) - t0, max(b for _, b in s) - t0
        out.append(f"{worker:>8} {first:7.1f} {last:7.1f} {sum(b - a for a, b in s):7.1f}")
    out.append(f"workers busy on average, per {stretch_s:.0f} s:")
    cells = []
    edge = t0
    while edge < t1:
        end = min(edge + stretch_s, t1)
        busy = sum(
            max(0.0, min(b, end) - max(a, edge)) for s in spans.values() for a, b in s
        ) / max(end - edge, 1e-9)
        cells.append(f"{edge - t0:4.0f}s {busy:3.1f}")
        edge = end
    out.extend("  ".join(cells[i : i + 8]) for i in range(0, len(cells), 8))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("file", type=Path, help="the file MESHPROF_SUITE_CPU named")
    p.add_argument("--tests", type=int, default=30, help="how many single tests to list")
    p.add_argument(
        "--timeline", type=float, default=0.0, metavar="SECONDS",
        help="also show when the workers were busy, per stretch of this many seconds",
    )  # fmt: skip
    args = p.parse_args(argv)
    if not args.file.is_file():
        print(f"suite_cpu: no such file: {args.file}", file=sys.stderr)
        return 2
    print(summarize(args.file, args.tests))
    if args.timeline > 0:
        print()
        print(timeline(args.file, args.timeline))
    return 0


if __name__ == "__main__":
    sys.exit(main())

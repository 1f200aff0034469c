"""How ``meshprof report RUN --json`` scales with the number of ranks at a fixed event count, and
with the event count at 8 ranks.

For each case, writes a synthetic dp × tp × pp run (:mod:`synth_run`: clocks off by up to
±30 ms, one rank 30 % slower in every phase), then runs ``meshprof report DIR --json`` in a
child process and prints
its wall time, CPU time (``os.wait4``) and peak RSS (the child's ``VmHWM``), bytes per event, whether the slow rank was named, and the
largest clock-offset error against the truth. ``--src`` runs another checkout's code (e.g. a
snapshot of main: ``git archive main src | tar -x -C /tmp/base``) for a before/after table.

    python benchmarks/scale_report.py [--cases 8:2000000,1024:2000000] [--src DIR] [--out F]

A case is RANKS:TOTAL_EVENTS; the layout is chosen as dp × tp × pp with tp ≤ 8, pp ≤ 8 (even).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synth_run import write_run

DEFAULT_CASES = (
    "8:2000000,64:2000000,256:2000000,1024:2000000,4096:2000000,"
    "8:1000000,8:4000000,8:8000000,8:16000000"
)


def layout_of(n: int) -> tuple[int, int, int]:
    """A 3D layout for n ranks: pp and tp up to 8 (pp even), the rest data parallel."""
    if n < 8 or n % 8:
        return n, 1, 1
    pp = 8 if n % 64 == 0 and n >= 512 else 2
    rest = n // pp
    tp = 8 if rest % 8 == 0 and rest >= 64 else (4 if rest % 4 == 0 else 2)
    return rest // tp, tp, pp


def run_report(
    run_dir: Path, src: Path, timeout: float = 0, extra: tuple[str, ...] = ()
) -> tuple[float, float, int, int, dict]:
    """Wall seconds, CPU seconds (user + system, the worker processes included), peak RSS of
    the report process (bytes), peak memory of its whole process tree (bytes: the largest sum
    of the processes' proportional set sizes, so pages a forked worker shares with the report
    count once) and the JSON of ``meshprof report DIR --json``."""
    env = dict(os.environ, PYTHONPATH=str(src))
    code = "import sys; from meshprof.cli import main; sys.exit(main())"
    with tempfile.TemporaryFile() as out:
        t0 = time.perf_counter()
        p = subprocess.Popen(
            [sys.executable, "-c", code, "report", str(run_dir), "--json", *extra],
            stdout=out,
            env=env,
        )
        timer = threading.Timer(timeout, p.kill) if timeout > 0 else None
        if timer is not None:
            timer.start()
        hwm = [0, 0]
        watcher = threading.Thread(target=_watch_hwm, args=(p, hwm), daemon=True)
        watcher.start()
        _, status, ru = os.wait4(p.pid, 0)
        watcher.join()
        wall = time.perf_counter() - t0
        if timer is not None:
            timer.cancel()
            if wall >= timeout:
                raise RuntimeError(f"not done after {timeout:.0f} s")
        out.seek(0)
        data = out.read()
    if status != 0:
        raise RuntimeError(f"report failed ({status}) on {run_dir}")
    # ru_maxrss carries the parent's high-water mark across fork + exec (Linux keeps the larger
    # of the old and new address spaces'): this process, after writing the run, reads hundreds
    # of MiB. The child's own VmHWM, read while it runs, is the figure (ru_maxrss elsewhere).
    rss = hwm[0] if hwm[0] > 0 else ru.ru_maxrss * 1024
    return wall, ru.ru_utime + ru.ru_stime, rss, max(hwm[1], rss), json.loads(data)


def _descendants(pid: int) -> list[int]:
    """``pid``'s child processes, theirs, and so on (from /proc/PID/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(x) for x in (task / "children").read_text().split()]
            except OSError:
                continue
            out.extend(kids)
            todo.extend(kids)
    return out


def _pss(pid: int) -> int:
    """Proportional set size of ``pid`` (bytes; 0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _watch_hwm(p: subprocess.Popen, out: list[int]) -> None:
    """Until the child exits: ``out[0]``, its peak resident set (``VmHWM`` of
    /proc/PID/status, bytes; it only grows, so the last value read is the peak up to a few ms
    before the end); ``out[1]``, the largest PSS sum over it and its descendants (the report's
    worker processes), sampled every 50 ms (reading smaps walks the page tables: more often
    slowed the report measurably on 2 cores). Without workers the PSS is at most the RSS, and
    the figure reported is the larger of the two."""
    status = Path(f"/proc/{p.pid}/status")
    ticks = 0
    while True:
        try:
            text = status.read_text()
        except OSError:
            return
        for line in text.splitlines():
            if line.startswith("VmHWM:"):
                out[0] = max(out[0], int(line.split()[1]) * 1024)
        if "State:\tZ" in text:  # exited, not yet reaped
            return
        ticks += 1
        if ticks % 5 == 0:
            kids = _descendants(p.pid)
            if kids:
                out[1] = max(out[1], _pss(p.pid) + sum(_pss(k) for k in kids))
        time.sleep(0.01)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default=DEFAULT_CASES)
    p.add_argument("--src", type=Path, default=Path(__file__).resolve().parents[1] / "src")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--tmp", type=Path, default=Path(tempfile.gettempdir()))
    p.add_argument("--out", type=Path, default=None, help="append one JSON line per case")
    p.add_argument("--timeout", type=float, default=0, help="stop a report after this many s")
    p.add_argument(
        "--report-args", default="", help="more arguments for meshprof report, e.g. '--sample 0.1'"
    )
    a = p.parse_args(argv)
    print(
        "| ranks | layout | events | report time | CPU time | peak RSS | with workers | B/event | "
        "slow rank named "
        "| max clock error | load average |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for case in a.cases.split(","):
        n, total = (int(x) for x in case.split(":"))
        per_rank = total // n
        steps = max(2, min(a.steps, per_rank // 20))
        d = a.tmp / f"meshprof_scale_{n}_{total}"
        shutil.rmtree(d, ignore_errors=True)
        layout = layout_of(n)
        info = write_run(
            d,
            n,
            per_rank,
            steps,
            slow_rank=n // 3,
            seed=1,
            layout=layout,
            clock_ms=30,
            slow_phases=(1, 2, 3),
        )
        events = info["events_per_rank"] * n
        try:
            load0 = os.getloadavg()[0]
            wall, cpu, rss, tree, rep = run_report(
                d, a.src, a.timeout, tuple(a.report_args.split())
            )
            load = max(load0, os.getloadavg()[0])
        except RuntimeError as e:
            print(
                f"| {n:,} | {'x'.join(map(str, layout))} | {events:,} | {e} | | | | |", flush=True
            )
            shutil.rmtree(d, ignore_errors=True)
            continue
        named = rep["summary"]["stragglers"]
        truth = np.asarray(info["aligned_offsets_ns"])
        got = np.asarray([c["offset_ns"] for c in rep["clock"]["ranks"]])
        err = float(np.abs(got - truth).max()) if len(got) == len(truth) else float("nan")
        row = {
            "ranks": n,
            "layout": "x".join(map(str, layout)),
            "events": events,
            "seconds": round(wall, 1),
            "cpu_seconds": round(cpu, 1),
            "peak_rss_mib": round(rss / 2**20),
            "peak_tree_mib": round(tree / 2**20),
            "bytes_per_event": round(tree / events),
            "slow_rank": info["slow_rank"],
            "named": named,
            "max_clock_error_us": round(err / 1e3, 1),
            "load_average": round(load, 1),
            "sampling": rep.get("sampling", {}).get("fraction"),
        }
        print(
            f"| {n:,} | {row['layout']} | {events:,} | {wall:.1f} s | {cpu:.1f} s "
            f"| {rss / 2**20:,.0f} MiB | {tree / 2**20:,.0f} MiB | "
            f"{tree / events:.0f} | {'yes' if info['slow_rank'] in named else 'NO'} {named[:3]} | "
            f"{err / 1e3:.1f} µs | {load:.1f} |",
            flush=True,
        )
        if a.out:
            with a.out.open("a") as f:
                f.write(json.dumps(row) + "\n")
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

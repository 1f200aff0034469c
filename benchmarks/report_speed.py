"""How long ``meshprof report`` takes on a big run, and how much memory it needs.

Writes a synthetic run (:mod:`synth_run`: 8 ranks × 1M collectives by default), then, R rounds
in a row, runs as subprocesses, one after the other in each round (alternating, so a slow
moment of a shared machine hits every variant alike):

- ``import``: ``python -c "import meshprof.cli"``, the fixed start-up cost of the command;
- ``json``: ``meshprof report DIR --json``;
- ``html``: ``meshprof report DIR --json --html FILE``;
- ``trace``: ``meshprof report DIR --json --trace FILE`` (the trace keeps its default cap,
  ``--trace-max-events`` 500000 collectives: the last whole steps that fit).

Each child's wall time (perf_counter around the run), CPU time and peak RSS (``os.wait4``
rusage of that child alone) are recorded; the medians over rounds are printed, with one in-process
breakdown (import, load, analyze, JSON) of the ``json`` variant. A benchmark, not a test: it never
fails on a time, it prints whether the goals (≤ 10 s, ≤ 2 GiB) held.

    python benchmarks/report_speed.py [--ranks 8] [--collectives 1000000] [--rounds 3]
                                      [--dir DIR] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from synth_run import write_run

GOAL_S = 10.0
GOAL_BYTES = 2 * 2**30

_BREAKDOWN = """
import json, sys, time
t0 = time.perf_counter()
import meshprof.cli
from pathlib import Path
from meshprof.report.analysis import analyze_run_parts
from meshprof.rundir import load_run
t1 = time.perf_counter()
run = load_run(Path(sys.argv[1]))
t2 = time.perf_counter()
parts = analyze_run_parts(run)
t3 = time.perf_counter()
s = json.dumps(parts.report.to_dict(), default=str)
t4 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "analyze_s": t3 - t2, "json_s": t4 - t3}))
"""


def run_child(cmd: list[str]) -> dict[str, float]:
    """Run ``cmd`` (stdout discarded); its wall time, CPU time and peak RSS."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    err = p.stderr.read().decode(errors="replace") if p.stderr else ""
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {err[-2000:]}")
    return {
        "wall_s": wall,
        "cpu_s": ru.ru_utime + ru.ru_stime,
        "peak_rss_bytes": ru.ru_maxrss * 1024,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--collectives", type=int, default=1_000_000, help="per rank")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dir", type=Path, help="use (or write) the run here instead of a temp dir")
    p.add_argument("--out", type=Path, help="also write the results as JSON")
    a = p.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="meshprof-bench-") as tmp:
        run_dir = a.dir or Path(tmp) / "run"
        if not (run_dir / "manifest.json").exists():
            t0 = time.perf_counter()
            info = write_run(run_dir, a.ranks, a.collectives, a.steps)
            print(f"wrote {run_dir} in {time.perf_counter() - t0:.1f} s: {info}")
        size = sum(f.stat().st_size for f in run_dir.glob("rank*.npz"))
        py = sys.executable
        cli = [py, "-c", "import sys; from meshprof.cli import main; sys.exit(main())"]
        variants = {
            "import": [py, "-c", "import meshprof.cli"],
            "json": [*cli, "report", str(run_dir), "--json"],
            "html": [*cli, "report", str(run_dir), "--json", "--html", f"{tmp}/r.html"],
            "trace": [*cli, "report", str(run_dir), "--json", "--trace", f"{tmp}/t.json"],
        }
        results: dict[str, list[dict[str, float]]] = {k: [] for k in variants}
        for i in range(a.rounds):
            for name, cmd in variants.items():
                r = run_child(cmd)
                results[name].append(r)
                print(
                    f"round {i + 1} {name:6s} wall {r['wall_s']:6.2f} s  cpu {r['cpu_s']:6.2f} s  "
                    f"peak RSS {r['peak_rss_bytes'] / 2**30:5.2f} GiB",
                    flush=True,
                )
        trace_mb = Path(f"{tmp}/t.json").stat().st_size / 1e6
        html_kb = Path(f"{tmp}/r.html").stat().st_size / 1e3
        out = subprocess.run(
            [py, "-c", _BREAKDOWN, str(run_dir)], check=True, capture_output=True, text=True
        )
        breakdown = json.loads(out.stdout.strip().splitlines()[-1])

    med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in results.items()}
    events = a.ranks * a.collectives
    print(
        f"\n{a.ranks} ranks × {a.collectives} collectives ({events} events, {size / 1e6:.0f} MB "
        f"of rank files), median of {a.rounds} rounds:"
    )
    print(f"{'variant':8s} {'wall s':>8s} {'cpu s':>8s} {'peak RSS GiB':>13s}")
    for k, v in med.items():
        print(f"{k:8s} {v['wall_s']:8.2f} {v['cpu_s']:8.2f} {v['peak_rss_bytes'] / 2**30:13.2f}")
    print(f"trace file {trace_mb:.0f} MB, HTML {html_kb:.0f} kB")
    print(
        "breakdown of the json variant (in process): "
        + ", ".join(f"{k[:-2]} {v:.2f} s" for k, v in breakdown.items())
    )
    j = med["json"]
    ok_t, ok_m = j["wall_s"] <= GOAL_S, j["peak_rss_bytes"] <= GOAL_BYTES
    print(
        f"goal ≤ {GOAL_S:.0f} s: {'held' if ok_t else 'NOT held'} ({j['wall_s']:.2f} s); "
        f"goal ≤ 2 GiB: {'held' if ok_m else 'NOT held'} ({j['peak_rss_bytes'] / 2**30:.2f} GiB)"
    )
    if a.out:
        a.out.write_text(
            json.dumps(
                {
                    "ranks": a.ranks,
                    "collectives_per_rank": a.collectives,
                    "rounds": results,
                    "median": med,
                    "breakdown": breakdown,
                    "trace_mb": trace_mb,
                    "html_kb": html_kb,
                    "cpus": os.cpu_count(),
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

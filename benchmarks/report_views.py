"""What a reader gets from ``meshprof report`` as the world grows: console lines and width of the
brief view (the default) and of ``--full``, and the HTML report's size, build time and load time
in headless Chromium, on synthetic dp × tp × pp runs (``synth_run.py``) of 8 to 4,096 ranks.

Load time: ``chromium --headless --dump-dom`` of the report minus the same command on an empty
page (the browser's start), median of ``--repeat`` alternating pairs; the page's script (sorting,
canvas heatmaps) runs before the DOM is dumped.

    python benchmarks/report_views.py [--ranks 8,256,1024,4096] [--repeat 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synth_run import write_run

LAYOUTS = {8: (2, 2, 2), 256: (8, 4, 8), 1024: (32, 4, 8), 4096: (64, 8, 8)}


def _browser() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        p = shutil.which(name)
        if p:
            return p
    return None


def _dump(exe: str, page: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [exe, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()],
        capture_output=True,
        timeout=300,
        check=True,
    )
    return time.perf_counter() - t0


def measure(n: int, root: Path, repeat: int, exe: str | None) -> dict[str, object]:
    d = root / f"r{n}"
    if not d.exists():
        layout = LAYOUTS.get(n)
        write_run(d, n, collectives=200, steps=10, slow_rank=n // 3, seed=1, layout=layout)
    row: dict[str, object] = {"ranks": n}
    for view, extra in (("brief", []), ("full", ["--full"])):
        p = subprocess.run(
            ["meshprof", "report", str(d), *extra],
            capture_output=True,
            text=True,
            timeout=1800,
            env={"COLUMNS": "80", "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"},
        )
        lines = p.stdout.splitlines()
        row[f"{view}_lines"] = len(lines)
        row[f"{view}_width"] = max((len(x) for x in lines), default=0)
    page = root / f"r{n}.html"
    t0 = time.perf_counter()
    subprocess.run(
        ["meshprof", "report", str(d), "--html", str(page)],
        capture_output=True,
        timeout=1800,
        check=True,
    )
    row["html_s"] = time.perf_counter() - t0
    row["html_mb"] = page.stat().st_size / 2**20
    if exe is not None:
        empty = root / "empty.html"
        empty.write_text("<!doctype html><html><body></body></html>")
        diffs = []
        for _ in range(repeat):
            base = _dump(exe, empty)
            diffs.append(_dump(exe, page) - base)
        row["load_s"] = statistics.median(diffs)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="8,256,1024,4096")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default="", help="keep the runs here (default: a temporary dir)")
    args = ap.parse_args()
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="meshprof-views-"))
    root.mkdir(parents=True, exist_ok=True)
    exe = _browser()
    print(
        "| ranks | brief lines (width) | --full lines (width) | HTML MB | HTML build s | load s |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for n in (int(x) for x in args.ranks.split(",")):
        r = measure(n, root, args.repeat, exe)
        load = f"{r['load_s']:.2f}" if "load_s" in r else "no browser"
        print(
            f"| {n:,} | {r['brief_lines']} ({r['brief_width']}) | {r['full_lines']:,} "
            f"({r['full_width']}) | {r['html_mb']:.2f} | {r['html_s']:.1f} | {load} |",
            flush=True,
        )


if __name__ == "__main__":
    main()

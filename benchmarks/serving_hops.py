"""What the serving demo's client clock adds to the server's: each hop between the client's
timestamps and rank 0's, per request and per token (issue 40).

The demo (``meshprof demo --serve``'s job: 2 tensor-parallel ranks, a frontend process, a
load-generating client process) is run as tests/test_serving_truth.py runs it, then two
timestamps of the same event are compared, one from each side:

* **up**: the client's send of a request → its arrival as rank 0 recorded it (the frontend's
  reading, passed on with the request);
* **down**: rank 0's emission of a token (the request monitor's row) → the client's receipt of
  it, through the frontend;
* **TTFT**: the client's TTFT minus the server's, per request (up + the first token's down).

The truth tests compare the two sides' percentiles within max(1 ms, 5 %): these figures say how
much of that bound the transport takes.

    python benchmarks/serving_hops.py [--runs 1] [--requests 40] [--rate 10] [--out DIR]

Run it with ``PYTHONPATH`` at another checkout's ``src`` to measure that one (a before/after).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np


def hops(run: Path) -> dict[str, np.ndarray]:
    """The up, down and TTFT differences of one served run (ns, float64)."""
    from meshprof.demo.serving_run import CLIENT_FILE
    from meshprof.rundir.segment_reader import load_rank_dir

    client = {r["id"]: r for r in json.loads((run / CLIENT_FILE).read_text())["requests"]}
    rank0 = load_rank_dir(run / "rank00000")
    emitted: dict[int, list[int]] = defaultdict(list)
    for row in rank0.tokens:
        emitted[int(row["id"])].extend([int(row["t_ns"])] * int(row["n"]))
    up, down, ttft = [], [], []
    for r in rank0.requests:
        c = client[int(r["id"])]
        got, sent = c["token_ns"], emitted[int(r["id"])]
        if len(got) != len(sent):
            raise SystemExit(f"request {r['id']}: {len(sent)} tokens sent, {len(got)} received")
        up.append(int(r["arrival_ns"]) - c["sent_ns"])
        down.extend(g - s for g, s in zip(got, sent, strict=True))
        ttft.append((got[0] - c["sent_ns"]) - (int(r["first_token_ns"]) - int(r["arrival_ns"])))
    return {k: np.asarray(v, np.float64) for k, v in (("up", up), ("down", down), ("ttft", ttft))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--rate", type=float, default=10.0)
    p.add_argument("--out", default="", help="keep the runs here (default: a temporary folder)")
    a = p.parse_args()

    from meshprof.demo.serving import ServeConfig
    from meshprof.demo.serving_client import Load
    from meshprof.demo.serving_run import run_serving

    load = Load(requests=a.requests, rate=a.rate, prompt=(8, 40), output=(6, 24), seed=3)
    root = Path(a.out or tempfile.mkdtemp(prefix="meshprof-hops-"))
    got: dict[str, list[np.ndarray]] = defaultdict(list)
    for i in range(a.runs):
        run = root / f"run{i}"
        t0 = time.perf_counter()
        run_serving(run, ServeConfig(device_ms=30, nice=10), load, tp=2, timeout_s=500)
        print(f"run {i}: served in {time.perf_counter() - t0:.1f} s")
        for k, v in hops(run).items():
            got[k].append(v)
    print(f"{'hop':<6} {'n':>5} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for k, vs in got.items():
        v = np.concatenate(vs) / 1e6
        q = np.percentile(v, [50, 90, 99])
        print(f"{k:<6} {len(v):>5} {q[0]:>8.2f} {q[1]:>8.2f} {q[2]:>8.2f} {v.max():>8.2f}")


if __name__ == "__main__":
    main()

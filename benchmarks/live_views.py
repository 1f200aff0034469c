"""Cost of the live views at scale: one Prometheus scrape (``LiveCollector`` → text), one
``meshprof serve`` sample (``read_snapshot`` + history) and one ``/api/live`` body, over R
synthetic rank records shaped like a 3D job's (6 (op, dim) series, 3 dimensions, 32 recent steps).

    python benchmarks/live_views.py [--ranks 8,64,512,2048] [--repeat 5]

Prints one row per rank count: median milliseconds of each operation and the sizes of the
scrape and of the JSON (full history after 300 samples, and one incremental ``?since`` poll).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from meshprof.live.metrics import LiveCollector, metrics_text
from meshprof.live.server import LiveServer
from meshprof.records.live import HIST_BOUNDS_S, DimLive, OpSeries, RankLive
from meshprof.rundir.live import write_rank_live

OPS = [("all_reduce", "dp"), ("reduce_scatter", "dp"), ("all_gather", "tp"), ("all_reduce", "tp")]
OPS += [("send", "pp"), ("recv", "pp")]


def write_ranks(d: Path, n: int) -> None:
    now = time.time_ns()
    for r in range(n):
        write_rank_live(
            d,
            RankLive(
                rank=r,
                updated_ns=now,
                interval_s=1.0,
                world_size=n,
                hostname=f"node{r // 8:04d}",
                node_id=f"node{r // 8:04d}-1",
                steps_done=1000,
                recent_step_ns=[250_000_000 + i for i in range(32)],
                step_ns=250_000_000,
                compute_ns=200_000_000,
                steps_per_s=4.0,
                tokens_per_s=16384.0,
                comm_share=0.3,
                exposed_share=0.1,
                dims=[DimLive(dim, 10**7, 10**6, 0.1, 0.03) for dim in ("dp", "tp", "pp")],
                memory_bytes=40 << 30,
                memory_peak_bytes=60 << 30,
                memory_capacity_bytes=80 << 30,
                collectives=60_000,
                series=[
                    OpSeries(op, dim, 10_000, 10**10, [700] * (len(HIST_BOUNDS_S) + 1))
                    for op, dim in OPS
                ],
            ),
        )


def median_ms(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", default="8,64,512,2048")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(
        "| ranks | scrape, all ranks (ms) | scrape, one node's 8 (ms) | scrape KiB | "
        "serve sample (ms) | /api/live full (ms) | full KiB | ?since poll KiB |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in (int(x) for x in args.ranks.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            write_ranks(d, n)
            everyone = LiveCollector(d)
            node = LiveCollector(d, node_id="node0000-1")
            t_all = median_ms(lambda c=everyone: metrics_text(c), args.repeat)
            metrics_text(node)  # the first scrape learns which ranks are elsewhere
            t_node = median_ms(lambda c=node: metrics_text(c), args.repeat)
            size = len(metrics_text(everyone)[0]) / 1024
            live = LiveServer(d, poll_s=3600)
            for _ in range(299):  # a full history: every sample sees new records
                for r, x in live.history._rows.items():
                    live.history._last[r] = x[-1]["t_ns"] - 1
                live.sample()
            t_sample = median_ms(live.sample, args.repeat)
            t_json = median_ms(lambda s=live: json.dumps(s.live()), args.repeat)
            full = len(json.dumps(live.live())) / 1024
            tick = live.history.tick
            for r, x in live.history._rows.items():
                live.history._last[r] = x[-1]["t_ns"] - 1
            live.sample()
            inc = len(json.dumps(live.live(since=tick))) / 1024
            print(
                f"| {n} | {t_all:.1f} | {t_node:.1f} | {size:.0f} | {t_sample:.1f} | "
                f"{t_json:.1f} | {full:.0f} | {inc:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()

"""meshprof vs Holistic Trace Analysis on the same torch.profiler traces: where did the time go?

Both tools read the same 8 Kineto (torch.profiler) JSON traces, one per rank, and compute each
rank's communication / computation breakdown:

- **HTA** (PyPI ``holistictraceanalysis``, a benchmark-only dependency: install it in its own
  virtual environment and pass ``--hta-python``): ``TraceAnalysis(trace_dir=...)`` (parses every
  trace), then ``get_temporal_breakdown()`` and ``get_comm_comp_overlap()``;
- **meshprof**: :func:`meshprof.analyze.traces.kineto.kineto_report` over the same folder (HTA's
  temporal breakdown and overlap on HTA's definitions, plus exposed communication, memcpy,
  iterations, streams, collectives and the kernel-level straggler).

HTA's breakdowns count GPU kernels (a CPU-only trace has none, and HTA reports nothing for it),
so the traces are GPU-like and synthesized here the way Kineto writes them: per step a
``ProfilerStep#N`` annotation, ``aten::`` CPU ops launching kernels through ``cudaLaunchKernel``
(``correlation`` ids tying runtime call and kernel), compute kernels on stream 7 and NCCL kernels
(``ncclDevKernel_AllReduce_Sum_f32_RING_LL``, ``ncclDevKernel_ReduceScatter_...``) on stream 20,
``record_param_comms`` CPU ops, ``distributedInfo`` and ``baseTimeNanoseconds``. Rank 7 computes
10 % longer, so the others wait in their collectives.

Each round runs both tools once, alternating which goes first, each in a fresh subprocess (wall
time from start to exit, so both pay their imports and JSON parsing; the in-process analysis time
is reported too), and records the ratio HTA / meshprof of that round. Peak RSS per child from
``os.wait4``. The median ratio over rounds is the figure; the goal is ≥ 10× at no more memory.
The per-rank figures of both are printed side by side with their largest difference.

    python benchmarks/hta_compare.py --hta-python /path/to/venv/bin/python [--ranks 8]
        [--steps 20] [--kernels 400] [--rounds 3] [--dir DIR] [--out results.json]
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

import numpy as np

US = 1000  # Kineto times are µs; kernel timings below in ns then converted
BASE_NS = 1_750_000_000 * 10**9

_MESHPROF = """
import json, sys, time
t0 = time.perf_counter()
from pathlib import Path
from meshprof.analyze.traces.kineto import find_traces, kineto_report
t1 = time.perf_counter()
rep = kineto_report(find_traces(sys.argv[1]), hta_rounding=sys.argv[2] == "1")
t2 = time.perf_counter()
print(json.dumps({
    "import_s": t1 - t0, "analysis_s": t2 - t1,
    "ranks": {b.rank: {"compute_pctg": b.gpu.total.compute_pct,
                       "non_compute_pctg": b.gpu.total.non_compute_pct,
                       "idle_pctg": b.gpu.total.idle_pct,
                       "overlap_pctg": b.gpu.total.comm_comp_overlap_pct}
              for b in rep.ranks if b.gpu is not None},
}))
"""

_HTA = """
import json, sys, time, warnings, logging
warnings.simplefilter("ignore")
logging.disable(logging.WARNING)
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
t1 = time.perf_counter()
ta = TraceAnalysis(trace_dir=sys.argv[1])
t2 = time.perf_counter()
tb = ta.get_temporal_breakdown(visualize=False)
ov = ta.get_comm_comp_overlap(visualize=False)
t3 = time.perf_counter()
ranks = {}
for _, r in tb.iterrows():
    ranks[int(r["rank"])] = {"compute_pctg": float(r["compute_time_pctg"]),
                             "non_compute_pctg": float(r["non_compute_time_pctg"]),
                             "idle_pctg": float(r["idle_time_pctg"])}
for _, r in ov.iterrows():
    ranks.setdefault(int(r["rank"]), {})["overlap_pctg"] = float(r["comp_comm_overlap_pctg"])
print(json.dumps({"import_s": t1 - t0, "parse_s": t2 - t1, "analysis_s": t3 - t2,
                  "ranks": ranks}))
"""


def make_trace(rank: int, world: int, steps: int, kernels: int, seed: int) -> dict:
    """One rank's GPU-like Kineto trace: ``steps`` profiler steps of ``kernels`` compute kernels
    with an NCCL collective after every 8th, each launched by an ``aten::`` op."""
    rng = np.random.default_rng(seed * 1000 + rank)
    pid, tid = 1000 + rank, 1000 + rank
    ev: list[dict] = []
    corr = 1
    t_cpu = 0.0  # µs since the trace's base time
    t_gpu = 50.0
    slow = 1.10 if rank == world - 1 else 1.0
    comm_done = 0.0
    for s in range(steps):
        step0 = t_cpu
        for k in range(kernels):
            is_comm = k % 8 == 7
            launch = t_cpu + float(rng.uniform(2, 6))
            op = "record_param_comms" if is_comm else ("aten::mm" if k % 2 else "aten::add_")
            op_dur = float(rng.uniform(8, 14))
            ev.append(
                {
                    "ph": "X",
                    "cat": "cpu_op",
                    "name": op,
                    "pid": pid,
                    "tid": tid,
                    "ts": round(t_cpu, 3),
                    "dur": round(op_dur, 3),
                    "args": {"External id": corr, "Sequence number": corr, "Record function id": 0},
                }
            )
            ev.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "pid": pid,
                    "tid": tid,
                    "ts": round(launch, 3),
                    "dur": 4.0,
                    "args": {"correlation": corr, "cbid": 211, "external id": corr},
                }
            )
            if is_comm:
                # a collective starts when this rank launched it, ends when the slowest did
                start = max(t_gpu, launch + 5)
                dur = float(rng.uniform(40, 80)) + (0.0 if rank == world - 1 else 25.0)
                name = (
                    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
                    if k % 16 == 15
                    else "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
                )
                stream = 20
                comm_done = start + dur
            else:
                start = max(t_gpu, launch + 5)
                dur = float(rng.uniform(20, 60)) * slow
                name = (
                    "ampere_sgemm_128x64_tn"
                    if k % 2
                    else "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>"
                )
                stream = 7
            ev.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": name,
                    "pid": 0,
                    "tid": stream,
                    "ts": round(start, 3),
                    "dur": round(dur, 3),
                    "args": {
                        "queued": 0,
                        "device": 0,
                        "context": 1,
                        "stream": stream,
                        "correlation": corr,
                        "registers per thread": 64,
                        "shared memory": 0,
                        "blocks per SM": 1.0,
                        "warps per SM": 4.0,
                        "grid": [1, 1, 1],
                        "block": [128, 1, 1],
                        "est. achieved occupancy %": 50,
                        "External id": corr,
                    },
                }
            )
            if stream == 7:
                t_gpu = start + dur
            corr += 1
            t_cpu += op_dur + float(rng.uniform(1, 3))
        t_gpu = max(t_gpu, comm_done)
        t_cpu = max(t_cpu, t_gpu) + 20.0  # the optimizer step synchronizes
        ev.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{s}",
                "pid": pid,
                "tid": tid,
                "ts": round(step0, 3),
                "dur": round(t_cpu - step0, 3),
                "args": {"External id": corr},
            }
        )
        corr += 1
    ev.append(
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "python3"}}
    )
    ev.append({"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}})
    return {
        "schemaVersion": 1,
        "deviceProperties": [
            {
                "id": 0,
                "name": "NVIDIA A100-SXM4-80GB",
                "totalGlobalMem": 85e9,
                "computeMajor": 8,
                "computeMinor": 0,
                "maxThreadsPerBlock": 1024,
                "numSms": 108,
                "regsPerBlock": 65536,
                "regsPerMultiprocessor": 65536,
                "sharedMemPerBlock": 49152,
                "sharedMemPerMultiprocessor": 167936,
                "maxThreadsPerMultiprocessor": 2048,
                "warpSize": 32,
            }
        ],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
        "record_shapes": 0,
        "with_stack": 0,
        "traceEvents": ev,
        "traceName": f"rank{rank}.json",
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": BASE_NS,
    }


def write_traces(out: Path, world: int, steps: int, kernels: int, seed: int = 0) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in range(world):
        p = out / f"rank{r}.json"
        p.write_text(json.dumps(make_trace(r, world, steps, kernels, seed)))
        paths.append(p)
    return paths


def run_child(cmd: list[str]) -> dict:
    """Run ``cmd``; its wall time, CPU time, peak RSS and the JSON it printed last."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate()
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} failed ({p.returncode}): {err.decode()[-3000:]}")
    return {"wall_s": wall, "result": json.loads(out.decode().strip().splitlines()[-1])}


def run_measured(cmd: list[str]) -> dict:
    """:func:`run_child` plus CPU time and peak RSS of that child (``os.wait4``)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        p = subprocess.Popen(cmd, stdout=fo, stderr=fe)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        code = os.waitstatus_to_exitcode(status)
        p.returncode = code
        fo.seek(0)
        fe.seek(0)
        out, err = fo.read().decode(), fe.read().decode(errors="replace")
    if code != 0:
        raise RuntimeError(f"{' '.join(cmd[:2])} failed ({code}): {err[-3000:]}")
    return {
        "wall_s": wall,
        "cpu_s": ru.ru_utime + ru.ru_stime,
        "peak_rss_bytes": ru.ru_maxrss * 1024,
        "result": json.loads(out.strip().splitlines()[-1]),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--hta-python",
        default=sys.executable,
        help="python with holistictraceanalysis installed (default: this one)",
    )
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--kernels", type=int, default=400, help="kernels per step")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--hta-rounding",
        action="store_true",
        help="meshprof rounds sub-µs times to whole µs as HTA 0.5 does (default: exact ns)",
    )
    p.add_argument("--dir", type=Path, help="write the traces here (default: a temp dir)")
    p.add_argument("--out", type=Path, help="also write the results as JSON")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="meshprof-hta-") as tmp:
        d = a.dir or Path(tmp) / "traces"
        t0 = time.perf_counter()
        paths = write_traces(d, a.ranks, a.steps, a.kernels)
        mb = sum(x.stat().st_size for x in paths) / 1e6
        n_ev = a.steps * (a.kernels * 3 + 1) * a.ranks
        print(
            f"wrote {len(paths)} traces ({n_ev} events, {mb:.0f} MB) in "
            f"{time.perf_counter() - t0:.1f} s to {d}",
            flush=True,
        )
        cmds = {
            "hta": [a.hta_python, "-c", _HTA, str(d)],
            "meshprof": [sys.executable, "-c", _MESHPROF, str(d), "1" if a.hta_rounding else "0"],
        }
        rounds: list[dict] = []
        for i in range(a.rounds):
            order = ["hta", "meshprof"] if i % 2 == 0 else ["meshprof", "hta"]
            res = {k: run_measured(cmds[k]) for k in order}
            ratio = res["hta"]["wall_s"] / res["meshprof"]["wall_s"]
            cpu_ratio = res["hta"]["cpu_s"] / res["meshprof"]["cpu_s"]
            rounds.append({**res, "ratio": ratio, "cpu_ratio": cpu_ratio})
            print(
                f"round {i + 1}: HTA {res['hta']['wall_s']:.2f} s "
                f"({res['hta']['peak_rss_bytes'] / 2**20:.0f} MiB), meshprof "
                f"{res['meshprof']['wall_s']:.2f} s "
                f"({res['meshprof']['peak_rss_bytes'] / 2**20:.0f} MiB): ratio {ratio:.1f}×; "
                f"CPU time HTA {res['hta']['cpu_s']:.1f} s, meshprof {res['meshprof']['cpu_s']:.1f} s: "
                f"{cpu_ratio:.1f}×",
                flush=True,
            )
    last = rounds[-1]
    hr, mr = last["hta"]["result"], last["meshprof"]["result"]
    print("\nper rank (last round), HTA / meshprof, % of the GPU kernel span (overlap: % of comm)")
    keys = ("idle_pctg", "compute_pctg", "non_compute_pctg", "overlap_pctg")
    worst = 0.0
    for r in sorted(mr["ranks"], key=int):
        m = mr["ranks"][r]
        h = hr["ranks"].get(str(r), hr["ranks"].get(r, {}))
        cells = []
        for k in keys:
            hv, mv = h.get(k, float("nan")), m.get(k)
            mv = float("nan") if mv is None else mv
            worst = max(worst, abs(hv - mv))
            cells.append(f"{k[:-5]} {hv:.2f} / {mv:.2f}")
        print(f"  rank {r}: " + ", ".join(cells))
    print(f"largest difference: {worst:.2f} percentage points")
    med = lambda k, m: statistics.median(x[k][m] for x in rounds)  # noqa: E731
    ratio = statistics.median(x["ratio"] for x in rounds)
    cpu_ratio = statistics.median(x["cpu_ratio"] for x in rounds)
    print(
        f"\nmedian of {a.rounds} rounds: HTA {med('hta', 'wall_s'):.2f} s "
        f"(parse {statistics.median(x['hta']['result']['parse_s'] for x in rounds):.2f} s, "
        f"analysis {statistics.median(x['hta']['result']['analysis_s'] for x in rounds):.2f} s),"
        f" peak {med('hta', 'peak_rss_bytes') / 2**20:.0f} MiB; meshprof "
        f"{med('meshprof', 'wall_s'):.2f} s (analysis "
        f"{statistics.median(x['meshprof']['result']['analysis_s'] for x in rounds):.2f} s), "
        f"peak {med('meshprof', 'peak_rss_bytes') / 2**20:.0f} MiB"
    )
    print(
        f"ratio HTA / meshprof (median of per-round ratios): {ratio:.1f}× "
        f"(goal ≥ 10×: {'held' if ratio >= 10 else 'NOT held'}); memory HTA / meshprof "
        f"{med('hta', 'peak_rss_bytes') / med('meshprof', 'peak_rss_bytes'):.1f}×; CPU time "
        f"ratio {cpu_ratio:.1f}× (the steadier figure on a shared machine)"
    )
    if a.out:
        a.out.write_text(
            json.dumps(
                {
                    "rounds": rounds,
                    "ratio": ratio,
                    "trace_mb": mb,
                    "events": n_ev,
                    "largest_difference_pp": worst,
                    "cpu_ratio": cpu_ratio,
                },
                indent=2,
                default=str,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

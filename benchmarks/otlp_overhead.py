"""What OTLP export costs the job: a 2-rank gloo DDP job under ``meshprof run``, with the
exporter off, and sending every step (``--otlp-every 1``: the most it sends) to a backend that
is up, slow (answers each request after ``--slow-s`` seconds), or down (nothing listens), and
with the default sampling (``up/100``: every 100th step and the slow ones) to one that is up;
rotated round by round in one run.

Per variant, medians over the rounds of: the job's median step time and its loop's wall time
(the script's own clock), the launcher's CPU time (where the exporter runs), how long the
launcher took to exit after the job's last step, and what the exporter said it sent and
dropped.

``--only agent``: the exporter's own CPU per rank-step, without a job: two ranks' segments
written by the real rank writer (3 phases and 2 all_reduces a step), read by the agent with the
default sampling and with every step sent (spans built and encoded to OTLP protobuf, not sent).

    PYTHONPATH=src python benchmarks/otlp_overhead.py [--rounds 3] [--steps 6000] [--only agent|jobs]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil

from meshprof.launch.spawn import free_port

JOB = """
import json, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
steps, out = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, 256)
times = []
t_loop = time.perf_counter()
for _ in range(steps):
    t0 = time.perf_counter()
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
    times.append(time.perf_counter() - t0)
loop = time.perf_counter() - t_loop
dist.barrier()
with open(f"{out}/job{rank}.json", "w") as f:
    json.dump({"times": times, "loop_s": loop, "end_ns": time.time_ns()}, f)
dist.destroy_process_group()
"""


class Backend:
    """An OTLP/HTTP endpoint that accepts everything (an empty body is a valid
    ``Export*ServiceResponse``), after ``delay_s``."""

    def __init__(self, delay_s: float) -> None:
        delay = delay_s

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if delay:
                    time.sleep(delay)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def one(variant: str, steps: int, urls: dict[str, str]) -> dict[str, float]:
    out = Path(tempfile.mkdtemp(prefix=f"otlp-{variant.replace('/', '-every')}-"))
    script = out / "job.py"
    script.write_text(JOB)
    cmd = [
        sys.executable,
        "-m",
        "meshprof.cli",
        "run",
        "--nproc-per-node",
        "2",
        "-o",
        str(out / "run"),
    ]
    cmd += ["--no-summary", "--no-report"]
    if variant != "off":
        backend, _, every = variant.partition("/")
        cmd += ["--otlp-endpoint", urls[backend], "--otlp-every", every or "1"]
    cmd += [str(script), str(steps), str(out)]
    env = {**os.environ, "OTEL_METRIC_EXPORT_INTERVAL": "1000"}
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    launcher = psutil.Process(proc.pid)
    cpu = 0.0
    err_lines: list[str] = []
    reader = threading.Thread(target=lambda: err_lines.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    while proc.poll() is None:
        try:
            t = launcher.cpu_times()
            cpu = t.user + t.system
        except psutil.Error:
            pass
        time.sleep(0.05)
    exit_ns = time.time_ns()
    reader.join(5)
    if proc.returncode != 0:
        raise SystemExit(f"{variant}: exit code {proc.returncode}\n{''.join(err_lines[-20:])}")
    jobs = [json.loads((out / f"job{r}.json").read_text()) for r in (0, 1)]
    step = statistics.median(t for j in jobs for t in j["times"][10:])
    summary = next((x for x in err_lines if "OTLP: sent" in x), "")
    sent = re.search(r"sent ([\d,]+) spans", summary)
    dropped = re.search(r"dropped ([\d,]+)", summary)
    return {
        "step_ms": step * 1e3,
        "loop_s": max(j["loop_s"] for j in jobs),
        "launcher_cpu_s": cpu,
        "exit_after_s": (exit_ns - max(j["end_ns"] for j in jobs)) / 1e9,
        "spans": float(sent.group(1).replace(",", "")) if sent else 0.0,
        "dropped": float(dropped.group(1).replace(",", "")) if dropped else 0.0,
    }


def agent_cost(steps: int) -> None:
    """The agent's CPU per rank-step, by sampling (see the module docstring)."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from meshprof.api import StepMonitor
    from meshprof.comm.recorder import CommProfiler
    from meshprof.config import ProfilerConfig
    from meshprof.events import OP_CODES, GroupInfo
    from meshprof.live.otel.agent import OtlpAgent
    from meshprof.live.otel.exporters import JobIdentity
    from meshprof.live.otel.settings import resolve_settings
    from meshprof.live.otel.trace_sampling import TraceSampling
    from meshprof.rundir.writer import RankWriter

    run = Path(tempfile.mkdtemp(prefix="otlp-agent-"))
    ranks = []
    for r in (0, 1):
        prof = CommProfiler(ProfilerConfig(max_events=100_000))
        mon = StepMonitor(None, profiler=prof, rank=r)
        w = RankWriter(run, prof, mon, interval_s=0, rank=r, extra_meta={"node_id": "n0"})  # type: ignore[arg-type]
        ranks.append(
            (prof, mon, w, prof.log.group_index(GroupInfo("0", "default_pg", (0, 1), "gloo")))
        )
    seq = 0
    for i in range(steps):
        for prof, mon, _w, g in ranks:
            with mon.step():
                for name in ("forward", "backward", "optimizer"):
                    with mon.phase(name):
                        if name != "forward":
                            t = time.time_ns()
                            row = (
                                OP_CODES["all_reduce"],
                                0,
                                0,
                                0,
                                g,
                                -1,
                                seq + (name == "optimizer"),
                            )
                            prof.log.append((*row, 64, 64, t, 1000, i, None, None))
        seq += 2
        if i % 100 == 99:
            for _p, _m, w, _g in ranks:
                w.tick()
    for _p, _m, w, _g in ranks:
        w.tick()
    for every in (100, 1):
        env = {"OTEL_METRIC_EXPORT_INTERVAL": "100000000"}
        sampling = TraceSampling(every=every, slow=0, max_held_steps=10**6)
        settings = resolve_settings("http://127.0.0.1:9", "http/protobuf", env, sampling)
        assert settings is not None
        agent = OtlpAgent(run, settings, JobIdentity(run_id="bench"), node_id="n0")
        built: list[object] = []
        agent.spans = Collected(built)  # type: ignore[assignment]  (not started: no sending)
        t0 = time.thread_time()
        for now in (0.0, 2.0, 60.0):
            agent.poll(now=now)
        read = time.thread_time() - t0
        t1 = time.thread_time()
        size = sum(
            len(encode_spans(built[k : k + 512]).SerializeToString())  # type: ignore[arg-type]
            for k in range(0, len(built), 512)
        )
        enc = time.thread_time() - t1
        n = 2 * steps
        print(
            f"--otlp-every {every}: {read / n * 1e6:.0f} µs CPU per rank-step to read and "
            f"build, {enc / n * 1e6:.0f} µs to encode; {len(built):,} spans, "
            f"{size / max(len(built), 1):.0f} B each"
        )


class Collected:
    """Stands for the span worker: keeps what is offered (nothing is sent)."""

    def __init__(self, into: list[object]) -> None:
        self.into = into

    def offer(self, items: list[object]) -> None:
        self.into.extend(items)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument(
        "--slow-s", type=float, default=2.0, help="the slow backend's delay per request"
    )
    ap.add_argument("--only", choices=["agent", "jobs"], default=None)
    args = ap.parse_args()
    if args.only != "jobs":
        agent_cost(min(args.steps, 3000))
    if args.only == "agent":
        return
    up, slow = Backend(0.0), Backend(args.slow_s)
    urls = {"up": up.url, "slow": slow.url, "down": f"http://127.0.0.1:{free_port()}"}
    variants = ["off", "up", "up/100", "slow", "down"]
    got: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for r in range(args.rounds):
        k = r % len(variants)
        order = variants[k:] + variants[:k]  # rotated: no variant always first
        for v in order:
            got[v].append(one(v, args.steps, urls))
            print(f"round {r + 1} {v}: {got[v][-1]}", file=sys.stderr, flush=True)
    up.close()
    slow.close()
    base = statistics.median(x["step_ms"] for x in got["off"])
    base_loop = statistics.median(x["loop_s"] for x in got["off"])
    print(f"{args.steps} steps x 2 ranks, {args.rounds} rounds, medians over rounds")
    print(
        "| backend | step (ms) | vs off | loop (s) | vs off | launcher CPU (s) | exit after last step (s) | spans sent | dropped |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for v in variants:
        m = {k: statistics.median(x[k] for x in got[v]) for k in got[v][0]}
        print(
            f"| {v} | {m['step_ms']:.2f} | {m['step_ms'] / base:.3f} | {m['loop_s']:.2f} | "
            f"{m['loop_s'] / base_loop:.3f} | {m['launcher_cpu_s']:.2f} | {m['exit_after_s']:.2f} | "
            f"{m['spans']:,.0f} | {m['dropped']:,.0f} |"
        )


if __name__ == "__main__":
    main()

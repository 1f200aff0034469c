"""What a rank's storage costs over a long run: bytes written per collective, fsyncs per minute,
and the worker's memory over 400k steps, before and after append-only segments (issue 26).

    python benchmarks/storage_cost.py [--before SRC] [--seconds 120] [--rate 5000]
                                      [--soak-steps 400000] [--only write,soak,step]

Each measure runs in its own process against a meshprof source tree: this checkout's, and with
``--before SRC`` an older one (e.g. ``git archive 8bea06e src | tar -x -C /tmp/base``) on the
same machine, side by side. The driver is synthetic: a recorder and step monitor fed events
through the event log's ``append`` (the recorder's hot path without a process group) and steps
through ``StepMonitor.step()``, with the rank writer running as ``meshprof run`` configures it
(its flush interval of 30 s; the ring and monitor bounds of the version measured).

- ``write``: ``--rate`` collectives/s in steps of 100 for ``--seconds``: bytes sent to the
  storage layer (``/proc/self/io`` ``write_bytes``, which counts pages dirtied through a
  memory mapping too), bytes passed to ``write`` calls (``wchar``), fsync calls, and what the
  run directory holds at the end; per collective and per minute, and the 1,024-rank figures
  they extrapolate to;
- ``soak``: ``--soak-steps`` steps of 4 collectives as fast as the driver goes, the writer's
  ticks and periodic writes done on the driver's thread as often as ``--steps-per-s`` steps a
  second would make them (400k steps at 10 steps/s: 11 hours of training in a minute): RSS and
  its high-water mark (VmHWM) every 5 % of the run, above the RSS before recording began;
- ``job``: a real 2-rank DDP job (gloo, ``tests/scripts/run_steps.py``, ``--job-steps`` steps)
  under plain torchrun and under ``meshprof run``: each worker's RSS and high-water mark at its
  end (KiB from ``/proc/self/status``);
- ``step``: ns a step change costs the training thread with the writer listening (the cursor:
  a store into a mapped file before, a 16-byte ``pwrite`` after), against none.

Prints tables; nothing here is a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PER_STEP = 100


def _io() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/io").read_text().splitlines():
        k, v = line.split(":")
        out[k.strip()] = int(v)
    return out


def _status(key: str) -> float:
    """A /proc/self/status field in MiB (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _recorder(run_dir: Path, start: bool = True) -> tuple[Any, Any, Any, int]:
    """Recorder, step monitor and rank writer (started: its own thread ticks) as ``meshprof
    run`` sets them up in the version on the path; and the group code of a 2-rank group."""
    from meshprof.api import StepMonitor
    from meshprof.comm.recorder import CommProfiler
    from meshprof.config import ProfilerConfig
    from meshprof.events import GroupInfo
    from meshprof.rundir.writer import RankWriter

    try:
        from meshprof.launch.bootstrap import MONITOR_ROWS, RING_EVENTS
    except ImportError:  # before segments: the recorder's and the monitor's own defaults
        RING_EVENTS, MONITOR_ROWS = 1_000_000, 0
    prof = CommProfiler(ProfilerConfig(max_events=RING_EVENTS))
    mon = StepMonitor(None, profiler=prof, rank=0)
    if MONITOR_ROWS:
        mon.keep_rows(MONITOR_ROWS)
    g = prof.log.group_index(GroupInfo("0", "default_pg", (0, 1), "gloo"))
    w = RankWriter(run_dir, prof, mon, 30.0, rank=0)
    if start:
        w.start()
    return prof, mon, w, g


def child_write(seconds: float, rate: int) -> dict[str, Any]:
    fsyncs = [0]
    real = os.fsync

    def counting(fd: int) -> None:
        fsyncs[0] += 1
        real(fd)

    os.fsync = counting  # type: ignore[assignment]
    import torch  # noqa: F401  (imported by both versions' meta; before the counters start)

    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        run_dir = Path(tmp)
        prof, mon, w, g = _recorder(run_dir)
        io0 = _io()
        seq = 0
        t_start = time.monotonic()
        period = PER_STEP / rate
        sizes = []
        step = 0
        while (now := time.monotonic()) - t_start < seconds:
            with mon.step(tokens=1024):
                t_ns = time.time_ns()
                for _ in range(PER_STEP):
                    prof.log.append(
                        (0, 0, 0, 0, g, -1, seq, 4096, 4096, t_ns, 50_000, step, None, None)
                    )
                    seq += 1
            step += 1
            if step % int(rate // PER_STEP * 10) == 0:
                sizes.append((round(now - t_start, 1), _du(run_dir)))
            wait = t_start + step * period - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        elapsed = time.monotonic() - t_start
        w.set_exit("normal", 0)
        w.stop(final_write=True)
        io1 = _io()
        stored = _du(run_dir)
    return {
        "collectives": seq,
        "steps": step,
        "seconds": elapsed,
        "write_bytes": io1["write_bytes"] - io0["write_bytes"],
        "wchar": io1["wchar"] - io0["wchar"],
        "fsyncs": fsyncs[0],
        "stored": stored,
        "sizes": sizes,
    }


def child_soak(steps: int, steps_per_s: float) -> dict[str, Any]:
    """``steps`` steps as fast as the driver goes, the writer's work done on the driver's
    thread at the rate ``steps_per_s`` steps a second would give it: a tick every 0.5 s of
    emulated time, the periodic write every 30 s (400k steps at 10 steps/s: 11 hours)."""
    import torch  # noqa: F401

    base = _status("VmRSS")
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        prof, mon, w, g = _recorder(Path(tmp), start=False)
        tick = getattr(w, "tick", None) or w.persist_crashsafe  # (before: the crash-safe tick)
        tick_every = max(int(steps_per_s * 0.5), 1)
        write_every = max(int(steps_per_s * 30), 1)
        curve = []
        seq = 0
        t0 = time.monotonic()
        for s in range(steps):
            with mon.step(tokens=1024):
                t_ns = time.time_ns()
                for _ in range(4):
                    prof.log.append(
                        (0, 0, 0, 0, g, -1, seq, 4096, 4096, t_ns, 50_000, s, None, None)
                    )
                    seq += 1
            if (s + 1) % tick_every == 0:
                tick()
            if (s + 1) % write_every == 0:
                w.write()
            if (s + 1) % max(steps // 20, 1) == 0:
                point = (
                    s + 1,
                    round(_status("VmRSS") - base, 1),
                    round(_status("VmHWM") - base, 1),
                )
                curve.append(point)
                print(json.dumps({"point": point}), flush=True)  # (progress of a long soak)
        elapsed = time.monotonic() - t0
        w.set_exit("normal", 0)
        w.stop(final_write=True)
    return {"base_mib": base, "curve": curve, "seconds": elapsed}


def child_step() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        prof, _mon, w, g = _recorder(Path(tmp))
        prof.log.append((0, 0, 0, 0, g, -1, 0, 1, 1, time.time_ns(), 1, 0, None, None))
        time.sleep(1.2)  # two ticks: the files (and the cursor) exist
        n = 200_000

        def loop() -> float:
            t0 = time.perf_counter_ns()
            for s in range(n):
                prof.step = s
            return (time.perf_counter_ns() - t0) / n

        with_writer = min(loop() for _ in range(3))
        w.stop(final_write=False)
        without = min(loop() for _ in range(3))
    return {"with_ns": with_writer, "without_ns": without}


def job_rss(src: Path | None, steps: int) -> dict[int, tuple[float, float]]:
    """Each rank's (RSS, VmHWM) in MiB at the end of a 2-rank DDP job of ``steps`` steps: under
    plain torchrun (``src`` None) or ``meshprof run`` from ``src``."""
    script = HERE.parent / "tests/scripts/run_steps.py"
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        env = dict(os.environ)
        if src is None:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
            cmd += ["--nproc-per-node", "2", str(script), str(steps), str(out)]
        else:
            env["PYTHONPATH"] = str(src)
            cmd = [sys.executable, "-m", "meshprof.cli", "run", "--nproc-per-node", "2"]
            cmd += ["-o", str(Path(tmp) / "run"), "--no-summary", str(script), str(steps), str(out)]
        got = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
        if got.returncode != 0:
            raise SystemExit(f"job failed:\n{got.stderr[-3000:]}")
        done = [json.loads(p.read_text()) for p in sorted(out.glob("done_rank*.json"))]
    return {d["rank"]: (d["VmRSS"] / 1024, d["VmHWM"] / 1024) for d in done}


def _run_child(src: Path, what: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", what]
    cmd += ["--seconds", str(args.seconds), "--rate", str(args.rate)]
    cmd += ["--soak-steps", str(args.soak_steps), "--steps-per-s", str(args.steps_per_s)]
    env = {**os.environ, "PYTHONPATH": str(src)}
    got = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=4 * 3600)
    if got.returncode != 0:
        raise SystemExit(f"{what} with {src} failed:\n{got.stderr[-3000:]}")
    return json.loads(got.stdout.strip().splitlines()[-1])


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, help="an older meshprof src/ to compare with")
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--rate", type=int, default=5000, help="collectives per second (write)")
    ap.add_argument("--soak-steps", type=int, default=400_000)
    ap.add_argument("--steps-per-s", type=float, default=10.0, help="emulated step rate (soak)")
    ap.add_argument("--job-steps", type=int, default=20_000)
    ap.add_argument("--only", default="write,soak,job,step")
    ap.add_argument("--which", default="before,after", help="versions to measure")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        fn = {"write": lambda: child_write(args.seconds, args.rate),
              "soak": lambda: child_soak(args.soak_steps, args.steps_per_s),
              "step": child_step}[args.child]  # fmt: skip
        print(json.dumps(fn()))
        return
    import torch

    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"{platform.system()}, Python {platform.python_version()}, torch {torch.__version__}"
    )
    versions = [("after", HERE.parent / "src")]
    if args.before is not None:
        versions.insert(0, ("before", args.before))
    versions = [v for v in versions if v[0] in args.which.split(",")]
    only = set(args.only.split(","))
    if "write" in only:
        print(
            f"\nwrite: {args.rate:,} collectives/s ({PER_STEP} per step) for {args.seconds:.0f} s, flush interval 30 s"
        )
        print(
            "| version | collectives | written (block layer) | per collective | write() bytes | fsyncs/min | stored at end | stored per collective | written / stored |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for name, src in versions:
            r = _run_child(src, "write", args)
            n = r["collectives"]
            per_min = r["fsyncs"] / (r["seconds"] / 60)
            print(
                f"| {name} | {n:,} | {_mb(r['write_bytes'])} | {r['write_bytes'] / n:,.0f} B | "
                f"{_mb(r['wchar'])} | {per_min:.1f} | {_mb(r['stored'])} | "
                f"{r['stored'] / n:,.1f} B | {r['write_bytes'] / max(r['stored'], 1):.2f} |"
            )
            print(f"|   {name}: directory size over time (s, bytes) | {r['sizes']} |")
            rate_b = r["write_bytes"] / r["seconds"]
            print(
                f"|   {name} × 1,024 ranks | {_mb(rate_b * 30 * 1024)} per 30 s "
                f"({rate_b * 1024 / 1e9:.2f} GB/s), {per_min * 1024:,.0f} fsyncs/min |"
            )
    if "soak" in only:
        print(
            f"\nsoak: {args.soak_steps:,} steps of 4 collectives; RSS / VmHWM above the start (MiB)"
        )
        for name, src in versions:
            r = _run_child(src, "soak", args)
            print(f"{name} (start {r['base_mib']:.0f} MiB, {r['seconds']:.0f} s):")
            print("| steps | RSS above start | high-water mark above start |")
            print("|---:|---:|---:|")
            for s, rss, hwm in r["curve"]:
                print(f"| {s:,} | {rss:.1f} | {hwm:.1f} |")
    if "job" in only:
        print(
            f"\njob: 2-rank DDP over gloo, {args.job_steps:,} steps; each worker's RSS / VmHWM at its end (MiB)"
        )
        print("| launcher | rank 0 RSS | rank 0 HWM | rank 1 RSS | rank 1 HWM |")
        print("|---|---:|---:|---:|---:|")
        for name, src in [("torchrun", None), *versions]:
            got = job_rss(src, args.job_steps)
            cells = " | ".join(f"{got[r][0]:.0f} | {got[r][1]:.0f}" for r in (0, 1))
            print(f"| {'meshprof run, ' + name if src else name} | {cells} |")
    if "step" in only:
        print("\nstep change on the training thread (ns per step)")
        print("| version | with the writer | without | added |")
        print("|---|---:|---:|---:|")
        for name, src in versions:
            r = _run_child(src, "step", args)
            print(
                f"| {name} | {r['with_ns']:.0f} | {r['without_ns']:.0f} | {r['with_ns'] - r['without_ns']:+.0f} |"
            )


if __name__ == "__main__":
    main()

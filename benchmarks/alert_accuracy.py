"""Alerts measured like a detector (issue 27): real jobs under ``meshprof run`` (torchrun, gloo,
2 or 4 ranks, a tiny model) with a fault injected at a random step, and the alerts they raise
read back from ``DIR/live/alerts.jsonl``. Prints per fault kind: runs, true positives, false
positives, misses, precision, recall and the seconds from the fault's onset to the first right
alert (median, max).

Truth comes from the injection, not from meshprof: the job writes the wall time (ns) at which it
started the fault into ``MARK/onset``, and the time it finished its warm-up steps into
``MARK/warm``. An alert is *right* when its kind is one the fault explains (table below) and,
for the rules that name a culprit (straggler, stall, memory, memory_growth, stale), it names the
faulty rank. *False positives* are every alert raised after the warm-up in a clean run (``clean``,
``clean_load``, ``pause``: whatever it says), before the onset in a faulty run, and of a wrong
kind or rank after it — unless it is a *side effect* of the fault that the job's own clock
confirms (a leak that slows the leaking rank's steps): not counted either way, but listed.

The judge of side effects (:func:`confirmed`) reads the job's own clock, not meshprof's: every
rank writes each step's duration, its compute time (the step less its collectives) and the wall
time at which it ended (``MARK/times{rank}.json``). An alert about steps — ``step_regression``,
``throughput_drop``, ``straggler`` — claims something over a window: the steps from its
``since_step`` to the last step every rank it names had ended at the alert's time (at least the
rule's last 8 steps, its ``recent_steps``). It is confirmed when, over exactly that window and
for every rank it names, the job's clock shows the claim beyond the alert's own ``threshold``
(the rule's margin, a ratio): ``step_regression``, the median step above (1 + threshold) × the
rank's median of steps 10–29 (the rule's baseline); ``throughput_drop``, steps per second over
the window (steps / the wall time from the end of the step before it to the end of its last)
below (1 − threshold) × those of steps 10–29; ``straggler``, the rank's median compute above
(1 + threshold) × the median of the other ranks' medians over the same steps. Else it is false.

A faulty run is a true positive when a right alert comes after the onset, else a miss.
Precision = TP / (TP + FP) (FP counted in alerts, so one noisy run can cost several), recall =
TP / faulty runs.

Fault kinds:

* ``clean`` / ``clean_load``: no fault; ``clean_load`` also spins ``--load`` busy processes
  (default 1, half of a 2-CPU machine) beside the job for the whole run.
* ``clean_burst`` (not in the default ``--kinds``): no fault; a passing load: from the warm-up
  on, ``--burst`` processes of torch matrix products (default 3, each on every CPU) run for
  1–2.5 s every 1.5–3.5 s (a neighbour's tests, a compile next door).
* ``pause``: no fault either: rank 0 pauses 15 s between two steps once (a checkpoint or an
  evaluation, no collective in flight on it) while the other rank waits in the next step's
  ``all_reduce``. Any alert after the warm-up is false (the stall floor exists for this).
* ``slow_rank``: one rank computes 1–2× its step time more per step from a random step on.
* ``hang``: one rank posts a ``recv`` that no rank ever sends (the others wait in the step's
  ``all_reduce``); the job ends on gloo's timeout (15 s).
* ``kill``: one rank SIGKILLs itself (torchrun then stops the others).
* ``slow_link``: 4 ranks; the all_reduce of one 2-rank group ({2, 3}) grows from 4 KiB to
  32 MiB from a random step on (a slower collective, no rank computes longer).
* ``mem_leak``: one rank keeps 8 MiB more per step (every page touched) from a random step on.
* ``data_stall``: one rank's data loading stalls for 10 s once (no collective in flight on it).

    PYTHONPATH=src python benchmarks/alert_accuracy.py --runs 48 --seed 1
    PYTHONPATH=src python benchmarks/alert_accuracy.py --runs 8 --kinds clean,slow_rank

``--extra`` passes ``meshprof run`` options to every run (default none: the defaults are
measured; the output says which). A hang is a stall after ``--alert-hang-floor`` (5 s) when
every rank waits in a collective, else after ``--alert-stall-floor`` (120 s, so that evaluation
or a checkpoint between steps is no stall): the ``data_stall`` fault (a rank outside any
collective for 10 s) is then found by other rules or not at all, as a ``pause`` would be.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import random
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

KINDS = (
    "clean",
    "clean_load",
    "clean_burst",
    "slow_rank",
    "hang",
    "kill",
    "slow_link",
    "mem_leak",
    "data_stall",
    "pause",
)

CLEAN = frozenset({"clean", "clean_load", "clean_burst", "pause"})
"""Runs with no fault: every alert after the warm-up is false."""

RIGHT: dict[str, frozenset[str]] = {
    "clean": frozenset(),
    "clean_load": frozenset(),
    "clean_burst": frozenset(),
    "slow_rank": frozenset({"straggler", "step_regression", "throughput_drop"}),
    "hang": frozenset({"stall", "inflight", "stale"}),
    "kill": frozenset({"stale", "stall", "inflight"}),
    "slow_link": frozenset({"step_regression", "throughput_drop"}),
    "mem_leak": frozenset({"memory_growth", "memory"}),
    "data_stall": frozenset({"stall", "inflight", "throughput_drop", "step_regression"}),
    "pause": frozenset(),
}
"""The alert kinds that explain each fault."""

CULPRIT_RULES = frozenset({"straggler", "stall", "memory", "memory_growth", "stale"})
"""Rules whose alert must name the faulty rank to be right."""

WARMUP_STEPS = 20
"""Steps before the job writes MARK/warm (the rules' warm-up and baseline: 5 + 10 steps)."""

BASE_S = 0.04
"""A step's compute (sleep, so that 4 ranks fit on 2 CPUs) besides the tiny model's."""


# -- the job (runs under meshprof run on every rank) ---------------------------------------------
def job(kind: str, fault_rank: int, onset: int, seconds: float, extra: float, mark: Path) -> None:
    """One training job: WARMUP_STEPS, then steps until ``seconds`` of wall time have passed
    (rank 0 decides, every rank stops after the same step); the fault from step ``onset`` on."""
    import datetime

    import torch
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=15 if kind == "hang" else 120)
    dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    pair = None
    small, big = torch.ones(1024), torch.ones(8 << 20)  # allocated once: only the link slows
    if kind == "slow_link":
        groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        pair = groups[rank // 2]
    leak: list[bytearray] = []
    start = time.monotonic()

    def note(name: str) -> None:
        if rank == (fault_rank if name == "onset" else 0):
            (mark / name).write_text(str(time.time_ns()))

    steps: list[float] = []
    computes: list[float] = []
    ends: list[int] = []
    for i in range(10**9):
        if kind == "pause" and i == onset and rank == fault_rank:
            note("onset")
            time.sleep(15.0)  # a checkpoint between two steps: no collective in flight here
        t0 = time.perf_counter()
        if i == WARMUP_STEPS:
            note("warm")
        faulty = i >= onset and rank == fault_rank and kind != "pause"
        if i == onset and kind != "pause":
            note("onset")
        if kind == "data_stall" and faulty and i == onset:
            time.sleep(10.0)  # the loader stalls: no collective in flight on this rank
        x = torch.randn(32, 64)
        loss = model(x).sum()
        loss.backward()
        time.sleep(BASE_S + (extra * BASE_S if kind == "slow_rank" and faulty else 0.0))
        if kind == "mem_leak" and faulty:
            b = bytearray(8 << 20)
            b[::4096] = b"\x01" * (len(b) // 4096)  # every page touched: resident
            leak.append(b)
        if kind == "kill" and faulty:
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "hang" and faulty:
            buf = torch.zeros(4)
            dist.recv(buf, src=(rank + 1) % world)  # never sent: in flight until the timeout
        computes.append(time.perf_counter() - t0)
        if pair is not None:
            dist.all_reduce(big if i >= onset and rank in (2, 3) else small, group=pair)
        flat = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        # the stop flag rides in the step's all_reduce: every rank stops after the same step
        flag = torch.cat(
            [flat, torch.tensor([float(rank == 0 and time.monotonic() - start > seconds)])]
        )
        dist.all_reduce(flag)
        opt.step()
        opt.zero_grad()
        steps.append(time.perf_counter() - t0)
        ends.append(time.time_ns())
        if flag[-1].item() > 0:
            break
    # the job's own step and compute times (wall, s) and step ends (ns): the truth of a fault's
    # side effects
    (mark / f"times{rank}.json").write_text(
        json.dumps({"step": steps, "compute": computes, "end": ends})
    )
    dist.barrier()
    dist.destroy_process_group()


# -- the benchmark -------------------------------------------------------------------------------
@dataclass(slots=True)
class RunResult:
    """One run's outcome."""

    kind: str
    fault_rank: int
    onset_step: int
    detected: bool
    latency_s: float | None
    """Onset → first right alert, s."""
    first: str = ""
    """The first right alert's kind."""
    by_kind: dict[str, float] = field(default_factory=dict)
    """Onset → the first right alert of each kind, s."""
    dir: str = ""
    """The run's folder (its run directory is ``run``, the marks ``mark``)."""
    false: list[str] = field(default_factory=list)
    """The false positives, as "kind@ranks (+t s)"."""
    warmup_alerts: int = 0
    """Alerts before the warm-up ended (not counted)."""
    side_effects: list[str] = field(default_factory=list)
    """Alerts after the onset of a kind the fault does not explain but that the job's own clock
    confirms (its steps slowed, a rank computed longer: :func:`side_effects`); not counted."""
    rc: int = 0
    wall_s: float = 0.0


def run_one(kind: str, rng: random.Random, args: argparse.Namespace, i: int) -> RunResult:
    world = 4 if kind == "slow_link" else 2
    fault_rank = 2 if kind == "slow_link" else rng.randrange(world)
    onset = rng.randrange(40, 100)
    extra = rng.uniform(1.0, 2.0)
    seconds = args.seconds if kind in STEADY else 0.0
    # faulty runs: about onset + 12 s of steps (the window the alerts must fall in)
    if kind not in STEADY:
        seconds = onset * (BASE_S + 0.01) + args.window
    if kind == "pause":
        fault_rank, seconds = 0, seconds + 15.0
    tmp = Path(tempfile.mkdtemp(prefix=f"alert-{kind}-"))
    mark, out = tmp / "mark", tmp / "run"
    mark.mkdir()
    cmd = [
        sys.executable,
        "-m",
        "meshprof.cli",
        "run",
        "--nproc-per-node",
        str(world),
        "-o",
        str(out),
        "--no-summary",
        *shlex.split(args.extra),
        __file__,
        "--job",
        kind,
        str(fault_rank),
        str(onset if kind not in STEADY else 10**9),
        str(seconds),
        f"{extra:.3f}",
        str(mark),
    ]
    load: list[subprocess.Popen[bytes]] = []
    if kind == "clean_load":
        load = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(args.load)]
    stop = threading.Event()
    burster = threading.Thread(
        target=bursts, args=(mark, stop, args.burst, rng.randrange(2**32)), daemon=True
    )
    if kind == "clean_burst":
        burster.start()
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, timeout=seconds + 120)
        rc = p.returncode
        if args.verbose and rc not in (0, 1):
            print(p.stderr.decode()[-1500:], file=sys.stderr)
    except subprocess.TimeoutExpired:
        rc = -1
    finally:
        stop.set()
        if burster.is_alive():
            burster.join()
        for q in load:
            q.kill()
            q.wait()
    wall = time.monotonic() - t0
    return judge(kind, fault_rank, onset, out, mark, rc, wall)


SPIN = "while True: pass"
"""A busy process's program."""

MATMUL = "import torch\na = torch.randn(1024, 1024)\nwhile True: a @ a"
"""A burst's process: torch's threads on every CPU and the memory bus (a neighbour's test or
training; its import alone is a second of work)."""

STEADY = ("clean", "clean_load", "clean_burst")
"""Runs of ``--seconds`` with no onset."""


def bursts(mark: Path, stop: threading.Event, n: int, seed: int) -> None:
    """``clean_burst``'s load: from the warm-up mark on until ``stop``, ``n`` busy processes
    for 1–2.5 s every 1.5–3.5 s."""
    r = random.Random(seed)
    while not (mark / "warm").exists():
        if stop.wait(0.1):
            return
    while not stop.wait(r.uniform(1.5, 3.5)):
        procs = [subprocess.Popen([sys.executable, "-c", MATMUL]) for _ in range(n)]
        stop.wait(r.uniform(1.0, 2.5))
        for q in procs:
            q.kill()
            q.wait()


def judge(
    kind: str, fault_rank: int, onset_step: int, out: Path, mark: Path, rc: int, wall: float
) -> RunResult:
    """Compare the run's alerts with its injection (see the module docstring)."""
    alerts_file = out / "live" / "alerts.jsonl"
    alerts = []
    if alerts_file.exists():
        alerts = [json.loads(x) for x in alerts_file.read_text().splitlines() if x.strip()]
    warm = int((mark / "warm").read_text()) if (mark / "warm").exists() else None
    onset = int((mark / "onset").read_text()) if (mark / "onset").exists() else None
    res = RunResult(
        kind, fault_rank, onset_step, False, None, rc=rc, wall_s=wall, dir=str(out.parent)
    )
    if warm is None:
        res.false.append("no warm-up mark (the job failed early)")
        return res
    times = {int(f.stem[5:]): json.loads(f.read_text()) for f in mark.glob("times*.json")}
    for a in alerts:
        t = a["t_ns"]
        if t < warm:
            res.warmup_alerts += 1
            continue
        after = onset is not None and t >= onset
        right = (
            after
            and a["kind"] in RIGHT[kind]
            and (a["kind"] not in CULPRIT_RULES or fault_rank in a["ranks"])
        )
        ok = confirmed(a, times)
        if after and not right and kind not in CLEAN and ok:
            res.side_effects.append(f"{a['kind']}@{a['ranks']}")
            continue
        if right:
            assert onset is not None
            if not res.detected:
                res.detected, res.latency_s = True, (t - onset) / 1e9
                res.first = a["kind"]
            res.by_kind.setdefault(a["kind"], (t - onset) / 1e9)
        else:
            ref = onset if onset is not None else warm
            note = " (the job's clock confirms it)" if ok else ""
            res.false.append(f"{a['kind']}@{a['ranks']} ({(t - ref) / 1e9:+.1f} s){note}")
    return res


BASELINE = (10, 30)
"""The steps whose median is a rank's baseline (the rules' warm-up of 10 steps, then 20)."""

RECENT = 8
"""The rules' ``recent_steps``: an alert's window is at least this many steps."""


def confirmed(alert: dict[str, Any], times: dict[int, dict[str, list[float]]]) -> bool:
    """Whether the job's own clock confirms a step alert's claim over the alert's own window,
    by its own threshold (see the module docstring); False for the other kinds."""
    kind, thr = alert["kind"], float(alert.get("threshold") or 0.0)
    if kind not in ("step_regression", "throughput_drop", "straggler") or not alert["ranks"]:
        return False
    lo0, hi0 = BASELINE
    for r in alert["ranks"]:
        d = times.get(r)
        if d is None or len(d["end"]) < hi0:
            return False
        n = bisect.bisect_right(d["end"], alert["t_ns"])  # steps ended by the alert
        lo = max(min(int(alert.get("since_step", -1)), n - RECENT), hi0)
        if n - lo < 2:
            return False
        if kind == "step_regression":
            base = statistics.median(d["step"][lo0:hi0])
            if not statistics.median(d["step"][lo:n]) > (1 + thr) * base:
                return False
        elif kind == "throughput_drop":
            e = d["end"]
            base_rate = (hi0 - lo0) / (e[hi0 - 1] - e[lo0 - 1])
            rate = (n - lo) / (e[n - 1] - e[lo - 1])
            if not rate < (1 - thr) * base_rate:
                return False
        else:
            mine = statistics.median(d["compute"][lo:n])
            others = [
                statistics.median(q["compute"][lo:n])
                for k, q in times.items()
                if k != r and q["compute"][lo:n]
            ]
            if not others or not mine > (1 + thr) * statistics.median(others):
                return False
    return True


def table(results: list[RunResult]) -> str:
    rows = [
        "| kind | runs | true positives | false positives | misses | precision | recall "
        "| onset → alert median s | max s | side-effect alerts |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def row(name: str, rs: list[RunResult]) -> str:
        faulty = [r for r in rs if r.kind not in CLEAN]
        tp = sum(r.detected for r in faulty)
        fp = sum(len(r.false) for r in rs)
        miss = len(faulty) - tp
        prec = f"{tp / (tp + fp):.2f}" if tp + fp else ("1.00" if not fp else "0.00")
        if not faulty:
            prec = "—" if not fp else "0.00"
        rec = f"{tp / len(faulty):.2f}" if faulty else "—"
        lat = [r.latency_s for r in faulty if r.latency_s is not None]
        med = f"{statistics.median(lat):.1f}" if lat else "—"
        mx = f"{max(lat):.1f}" if lat else "—"
        side = sum(len(r.side_effects) for r in rs)
        return (
            f"| {name} | {len(rs)} | {tp} | {fp} | {miss} | {prec} | {rec} | {med} | {mx} "
            f"| {side} |"
        )

    for k in KINDS:
        rs = [r for r in results if r.kind == k]
        if rs:
            rows.append(row(k, rs))
    rows.append(row("**all**", results))
    rows += ["", "| fault | alert kind | runs it came in | onset → alert median s | max s |"]
    rows.append("|---|---|---:|---:|---:|")
    for k in KINDS:
        rs = [r for r in results if r.kind == k]
        for ak in sorted({a for r in rs for a in r.by_kind}):
            lat = [r.by_kind[ak] for r in rs if ak in r.by_kind]
            rows.append(
                f"| {k} | {ak} | {len(lat)} of {len(rs)} | {statistics.median(lat):.1f} "
                f"| {max(lat):.1f} |"
            )
    return "\n".join(rows)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--job":
        kind, rank, onset, seconds, extra, mark = sys.argv[2:8]
        job(kind, int(rank), int(onset), float(seconds), float(extra), Path(mark))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=48, help="runs in all, spread over the kinds")
    ap.add_argument(
        "--kinds",
        default=",".join(k for k in KINDS if k != "clean_burst"),
        help="comma-separated fault kinds (default: all but clean_burst)",
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=10.0, help="a clean run's length")
    ap.add_argument("--window", type=float, default=9.0, help="seconds of steps after an onset")
    ap.add_argument("--load", type=int, default=1, help="busy processes beside clean_load runs")
    ap.add_argument("--burst", type=int, default=3, help="busy processes of clean_burst's bursts")
    ap.add_argument(
        "--extra",
        default="",
        help="meshprof run options added to every run (default: %(default)s)",
    )
    ap.add_argument("--json", type=Path, help="also write every run's result here")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    for k in kinds:
        if k not in KINDS:
            ap.error(f"unknown kind {k!r}: one of {', '.join(KINDS)}")
    rng = random.Random(args.seed)
    order = [kinds[i % len(kinds)] for i in range(args.runs)]
    rng.shuffle(order)
    print(f"{args.runs} runs, kinds {','.join(kinds)}, seed {args.seed}, options {args.extra!r}")
    results = []
    for i, k in enumerate(order):
        r = run_one(k, rng, args, i)
        results.append(r)
        lat = (
            f"{r.first} {r.latency_s:.1f} s"
            if r.latency_s is not None
            else "missed"
            if k not in CLEAN
            else "-"
        )
        print(
            f"[{i + 1}/{args.runs}] {k} rank {r.fault_rank} onset step {r.onset_step}: {lat}; "
            f"false: {', '.join(r.false) or 'none'}; side effects: "
            f"{', '.join(r.side_effects) or 'none'}; warm-up alerts {r.warmup_alerts}; "
            f"rc {r.rc}; {r.wall_s:.0f} s",
            flush=True,
        )
    print()
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))


if __name__ == "__main__":
    main()

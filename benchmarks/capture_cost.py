"""What captures cost a rank while none is pending, in CPU time (robust on a loaded machine,
where the wall-clock A/B of ``training_overhead.py`` is noisy):

* per step: a step monitor's step (open + close, no memory sample) with the boundary-hook check
  vs as it was before captures (no check), paired batches alternated in one process, on the
  calling thread's CPU clock;
* per second: the CPU of an idle capture agent's thread (a ``stat`` of ``RUN_DIR/requests`` every
  0.5 s, a listing every 5 s), read from the thread's own CPU clock.

    python benchmarks/capture_cost.py [--steps 20000] [--rounds 15] [--seconds 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import types
from typing import Any

# (run as a script: its folder is on sys.path)
from training_overhead import _open_without_capture_hook


def _steps_cpu_ns(mon: Any, n: int) -> float:
    t0 = time.thread_time_ns()
    for _ in range(n):
        with mon.step():
            pass
    return (time.thread_time_ns() - t0) / n


def per_step(steps: int, rounds: int) -> tuple[float, float, list[float]]:
    """(median ns per step without the check, with it, per-round differences)."""
    from meshprof.api import StepMonitor

    mon = StepMonitor(track_pipeline=False, sample_memory_every_step=False, max_spans=steps)
    _steps_cpu_ns(mon, steps)  # warm up
    before, after, diffs = [], [], []
    for r in range(rounds):
        for variant in ("before", "after") if r % 2 == 0 else ("after", "before"):
            if variant == "before":
                mon._open = types.MethodType(_open_without_capture_hook, mon)  # type: ignore[method-assign]
                b = _steps_cpu_ns(mon, steps)
                del mon._open
            else:
                a = _steps_cpu_ns(mon, steps)
        before.append(b)
        after.append(a)
        diffs.append(a - b)
        mon.reset()
    return statistics.median(before), statistics.median(after), diffs


class _Host:
    monitor = None

    def rank(self) -> int:
        return 0


def agent_cpu(seconds: float) -> tuple[float, int]:
    """(CPU ns per second of an idle agent's thread, looks made)."""
    from meshprof.rundir.requests import requests_dir
    from meshprof.session.capture_agent import CaptureAgent

    run = tempfile.mkdtemp(prefix="meshprof-capture-cost-")
    requests_dir(run).mkdir()
    agent = CaptureAgent(run, _Host()).start()
    assert agent._thread is not None and agent._thread.ident is not None
    clock = time.pthread_getcpuclockid(agent._thread.ident)
    time.sleep(1.0)
    c0, t0 = time.clock_gettime_ns(clock), time.monotonic()
    time.sleep(seconds)
    c1, t1 = time.clock_gettime_ns(clock), time.monotonic()
    agent.stop()
    return (c1 - c0) / (t1 - t0), int((t1 - t0) / agent.poll_s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    b, a, diffs = per_step(args.steps, args.rounds)
    d = sorted(diffs)
    print(
        f"step monitor, one step (open + close), CPU: before captures {b:.0f} ns, with the hook "
        f"check {a:.0f} ns; paired difference median {statistics.median(d):+.0f} ns "
        f"(rounds {d[0]:+.0f} .. {d[-1]:+.0f})"
    )
    cpu, looks = agent_cpu(args.seconds)
    print(
        f"idle capture agent: {cpu / 1e3:.1f} µs of CPU per second ({cpu / 1e9:.5%} of a core) "
        f"over {args.seconds:g} s, about {looks} looks"
    )


if __name__ == "__main__":
    main()

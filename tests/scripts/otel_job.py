"""A 2-rank job for the OTLP tests. Each step is marked by the script (``with mon.step()``)
with phases: ``forward``; ``backward`` holding a nested ``allreduce`` (one all_reduce);
``optimizer`` (a second all_reduce). Every phase computes BASE_S seconds. At step DELAY_STEP,
rank DELAY_RANK sleeps DELAY_S seconds in ``backward`` before its all_reduce (the other rank
waits for it there). Each rank writes its own ``time.time_ns()`` brackets of every step and
phase, and the collectives it issued, to OUT/truth{R}.json: the truth the spans are checked
against. argv: steps base_s delay_step delay_rank delay_s out"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from live_common import busy

from meshprof.monitor import get_monitor

steps, base_s = int(sys.argv[1]), float(sys.argv[2])
delay_step, delay_rank, delay_s = int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
out = sys.argv[6]
dist.init_process_group("gloo")
rank = dist.get_rank()
mon = get_monitor()
assert mon is not None, "run this under meshprof run"
truth: dict = {"steps": {}, "phases": {}, "all_reduce": 0}


def bracket(key: str, step: int, name: str, fn) -> None:  # type: ignore[no-untyped-def]
    t0 = time.time_ns()
    with mon.phase(name):
        fn()
    truth["phases"].setdefault(str(step), []).append([name, key, t0, time.time_ns()])


def reduce() -> None:
    dist.all_reduce(torch.ones(256))
    truth["all_reduce"] += 1


for i in range(steps):
    t0 = time.time_ns()
    with mon.step():
        bracket("forward", i, "forward", lambda: busy(base_s))

        def backward(i: int = i) -> None:
            busy(base_s)
            if i == delay_step and rank == delay_rank:
                time.sleep(delay_s)
            bracket("allreduce", i, "allreduce", reduce)

        bracket("backward", i, "backward", backward)
        bracket("optimizer", i, "optimizer", lambda: (busy(base_s / 2), reduce()))
    truth["steps"][str(i)] = [t0, time.time_ns()]
dist.barrier()
with open(os.path.join(out, f"truth{rank}.json"), "w") as f:
    json.dump(truth, f)
dist.destroy_process_group()

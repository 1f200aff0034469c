"""A 2-rank training loop for the live-alert tests: every step does other work (slept) of BASE_S
seconds, then one all_reduce; from step SLOW_FROM on, rank SLOW_RANK computes EXTRA_S more per
step and writes the wall-clock time (ns) it became slow into STOP_FILE.slow. argv: steps base_s
extra_s slow_rank slow_from stop_file (the loop runs until the file exists or `steps` steps are
done; every rank stops after the same step)."""

import os
import sys
import time

import torch
import torch.distributed as dist
from live_common import busy, setup

steps, base_s, extra_s, slow, slow_from = (
    int(sys.argv[1]),
    float(sys.argv[2]),
    float(sys.argv[3]),
    int(sys.argv[4]),
    int(sys.argv[5]),
)
stop_file = sys.argv[6]
rank, model, opt = setup()


for i in range(steps):
    slow_now = rank == slow and i >= slow_from
    if slow_now and i == slow_from:
        with open(stop_file + ".slow", "w") as f:
            f.write(str(time.time_ns()))
    loss = model(torch.randn(4, 8)).sum()
    loss.backward()
    busy(base_s + (extra_s if slow_now else 0.0))
    t = torch.ones(1024)
    # the stop file rides in the step's all_reduce: every rank stops after the same step (a rank
    # that stopped on its own would leave the others in an all_reduce against its barrier)
    t[0] += float(os.path.exists(stop_file))
    dist.all_reduce(t)
    opt.step()
    opt.zero_grad()
    if t[0].item() > dist.get_world_size():
        break
dist.barrier()
dist.destroy_process_group()

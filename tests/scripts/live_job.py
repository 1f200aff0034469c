"""A 2-rank training loop for the live-state tests: every step does other work (slept) of
BASE_S seconds (rank SLOW_RANK: BASE_S + EXTRA_S), then one all_reduce; optimizer steps make
the steps. argv: steps base_s extra_s slow_rank stop_file (the loop runs until the file exists
or `steps` steps are done; every rank stops after the same step)."""

import os
import sys

import torch
import torch.distributed as dist
from live_common import busy, setup

steps, base_s, extra_s, slow = (
    int(sys.argv[1]),
    float(sys.argv[2]),
    float(sys.argv[3]),
    int(sys.argv[4]),
)
stop_file = sys.argv[5]
rank, model, opt = setup()


for _ in range(steps):
    loss = model(torch.randn(4, 8)).sum()
    loss.backward()
    busy(base_s + (extra_s if rank == slow else 0.0))
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

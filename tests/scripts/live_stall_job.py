"""A 2-rank training loop for the stall alert test: every step does other work (slept) of BASE_S
seconds, then one all_reduce; in step STALL_AT, rank STALL_RANK writes the wall-clock time (ns)
into MARK_FILE and sleeps STALL_S seconds before its all_reduce (no collective in flight on it;
the other rank waits in the all_reduce). argv: steps base_s stall_rank stall_at stall_s
mark_file."""

import sys
import time

import torch
import torch.distributed as dist
from live_common import busy, setup

steps, base_s, stall_rank, stall_at, stall_s = (
    int(sys.argv[1]),
    float(sys.argv[2]),
    int(sys.argv[3]),
    int(sys.argv[4]),
    float(sys.argv[5]),
)
mark_file = sys.argv[6]
rank, model, opt = setup()

for i in range(steps):
    loss = model(torch.randn(4, 8)).sum()
    loss.backward()
    busy(base_s)
    if rank == stall_rank and i == stall_at:
        with open(mark_file, "w") as f:
            f.write(str(time.time_ns()))
        time.sleep(stall_s)
    t = torch.ones(1024)
    dist.all_reduce(t)
    opt.step()
    opt.zero_grad()
dist.barrier()
dist.destroy_process_group()

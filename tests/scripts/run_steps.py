"""A tiny DDP job for the storage tests: ``run_steps.py STEPS OUT [SLEEP_MS]``: every rank trains
STEPS steps of a small model (DDP over gloo) and writes ``OUT/done_rank{R}.json`` with the steps it
finished; OUT is outside the run directory (the storage under test may be full)."""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

steps, out = int(sys.argv[1]), sys.argv[2]
sleep_s = float(sys.argv[3]) / 1000 if len(sys.argv) > 3 else 0.0
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
done = 0
for _ in range(steps):
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
    done += 1
    if sleep_s:
        time.sleep(sleep_s)
dist.barrier()
with open("/proc/self/status") as f:
    lines = [line.split(":", 1) for line in f]
status = {k: int(v.split()[0]) for k, v in lines if k in ("VmRSS", "VmHWM")}  # KiB
with open(os.path.join(out, f"done_rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, "steps": done, "pid": os.getpid(), **status}, f)
dist.destroy_process_group()

"""A tiny plain DDP script (no meshprof in it) for the `meshprof run` tests.

It writes its own oracle to ``argv[1]/oracle_rank{r}.json``: the collectives PyTorch's Flight
Recorder saw (gloo records it when TORCH_FR_BUFFER_SIZE is set) and its optimizer step count.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 3

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
for _ in range(STEPS):
    opt.zero_grad()
    ddp(torch.randn(4, 8)).sum().backward()
    opt.step()
dist.all_reduce(torch.ones(5))
fr = json.loads(torch._C._distributed_c10d._dump_fr_trace_json())
ops = [e["profiling_name"].split(":", 1)[-1] for e in fr.get("entries", [])]
with open(os.path.join(sys.argv[1], f"oracle_rank{rank}.json"), "w") as f:
    json.dump({"ops": ops, "optimizer_steps": STEPS, "argv": sys.argv[1:]}, f)
dist.destroy_process_group()

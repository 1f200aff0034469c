"""A 2-rank DDP job whose gradient buckets overlap the backward compute (async all_reduces in
flight together), for the test that sets the live figures against the post-mortem report.
argv: steps. Unmodified PyTorch: meshprof run finds the steps (optimizer steps)."""

import sys

import torch
import torch.distributed as dist

steps = int(sys.argv[1])
dist.init_process_group("gloo")
torch.manual_seed(0)
torch.set_num_threads(1)
layers = []
for _ in range(6):
    layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
model = torch.nn.Sequential(*layers)
# small buckets: several all_reduces a step, issued during backward and in flight together
ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.3)
opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
x = torch.randn(64, 256)
for _ in range(steps):
    opt.zero_grad()
    ddp(x).pow(2).mean().backward()
    opt.step()
dist.barrier()
dist.destroy_process_group()

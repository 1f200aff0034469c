"""A 2-rank training loop in phases for the metrics tests: each step does a busy compute of
BASE_S seconds (rank 1: BASE_S + EXTRA_S) and one all_reduce; optimizer steps make the steps.
After each phase of `steps` steps, each rank writes how many all_reduces it has completed to
DIR/phase{P}.rank{R} and waits (issuing nothing) until DIR/go{P} exists. argv: steps phases
base_s extra_s dir."""

import os
import sys
import time

import torch
import torch.distributed as dist
from live_common import busy, setup

steps, phases, base_s, extra_s = (
    int(sys.argv[1]),
    int(sys.argv[2]),
    float(sys.argv[3]),
    float(sys.argv[4]),
)
folder = sys.argv[5]
rank, model, opt = setup()


issued = 0
for phase in range(phases):
    for _ in range(steps):
        loss = model(torch.randn(4, 8)).sum()
        loss.backward()
        busy(base_s + (extra_s if rank == 1 else 0.0))
        dist.all_reduce(torch.ones(1024))
        issued += 1
        opt.step()
        opt.zero_grad()
    with open(os.path.join(folder, f"phase{phase}.rank{rank}"), "w") as f:
        f.write(str(issued))
    go = os.path.join(folder, f"go{phase}")
    deadline = time.time() + 120
    while not os.path.exists(go) and time.time() < deadline:
        time.sleep(0.05)
dist.destroy_process_group()

"""A DDP job (gloo) for the capture tests. Every step: zero_grad, the model's forward, BASE_S
seconds of other work (slept, no op), backward, the optimizer step, then an all_reduce of
the stop flag (every rank stops after the same step once STOP_FILE exists).

From step SLOW_FROM on, rank SLOW_RANK's forward does EXTRA more ``aten::mm`` calls (512 × 512,
results unused) per step and writes the wall-clock time (ns) it began into STOP_FILE.slow. With
HOLD_RANK >= 0, that rank stops at step HOLD_STEP in Python (sleeping in ``held_until_released``)
until HOLD_FILE exists, after writing HOLD_FILE.held.

argv: steps base_s slow_rank slow_from extra stop_file [hold_rank hold_step hold_file]
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

steps, base_s = int(sys.argv[1]), float(sys.argv[2])
slow, slow_from, extra = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
stop_file = sys.argv[6]
hold_rank, hold_step, hold_file = (
    (int(sys.argv[7]), int(sys.argv[8]), sys.argv[9]) if len(sys.argv) > 9 else (-1, -1, "")
)


def busy(seconds: float) -> None:
    time.sleep(seconds)  # (slept: no CPU taken from the tests beside it; see live_common.busy)


def held_until_released(path: str) -> None:
    with open(path + ".held", "w") as f:
        f.write(str(time.time_ns()))
    while not os.path.exists(path):
        time.sleep(0.05)


torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(
    torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128))
)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(32, 128)
a, b = torch.randn(512, 512), torch.randn(512, 512)
for i in range(steps):
    opt.zero_grad()
    out = model(x)
    if rank == slow and i >= slow_from:
        if i == slow_from:
            with open(stop_file + ".slow", "w") as f:
                f.write(str(time.time_ns()))
        for _ in range(extra):
            torch.mm(a, b)
    busy(base_s)
    out.square().mean().backward()
    opt.step()
    if rank == hold_rank and i == hold_step:
        held_until_released(hold_file)
    flag = torch.tensor([float(os.path.exists(stop_file))])
    dist.all_reduce(flag)
    if flag.item() > 0:
        break
dist.barrier()
dist.destroy_process_group()

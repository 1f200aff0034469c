"""A DDP job with several gradient buckets per step where one rank computes longer in forward
(a sleep): only the first bucket's all_reduce waits for it; the later buckets every rank
reaches at nearly the same time. Usage: ddp_straggler.py SLOW_RANK SLEEP_S STEPS"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    slow, sleep_s, steps = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(96, 96) for _ in range(6)])
    # ~37 KB of gradients per layer, 0.04 MB buckets: about one bucket per layer
    ddp = DDP(model, bucket_cap_mb=0.04)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    x = torch.randn(8, 96)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        if rank == slow:
            time.sleep(sleep_s)
        ddp(x).sum().backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

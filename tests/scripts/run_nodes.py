"""For the multi-node `meshprof run` test: every rank issues 3 all_reduces and a barrier, then
the rank named by argv[1] exits with code argv[2] after the process group is gone (so the other
node ends cleanly with 0)."""

import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
for _ in range(3):
    dist.all_reduce(torch.ones(32))
dist.barrier()
rank = dist.get_rank()
dist.destroy_process_group()
if rank == int(sys.argv[1]):
    sys.exit(int(sys.argv[2]))

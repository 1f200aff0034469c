"""Rank 1 issues 4 all_reduces then exits with code 5; rank 0 issues the same 4 and then waits
until torchrun ends it with SIGTERM (the meshprof run tests check both rank files)."""

import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
for _ in range(4):
    # the Work is dropped as soon as it is waited on (the recorder must not need it alive)
    dist.all_reduce(torch.ones(16), async_op=True).wait()
if dist.get_rank() == 1:
    sys.exit(5)
time.sleep(120)

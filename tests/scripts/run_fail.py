"""Rank 1 issues 4 all_reduces then exits with code 5; rank 0 issues the same 4 and then waits
until torchrun ends it with SIGTERM (the meshprof run tests check both rank files)."""

import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
# Works are kept alive: a gloo worker thread dropping the last reference to a finished Work
# while the next collective is issued can deadlock under the recorder's dispatcher hooks.
works = []
for _ in range(4):
    works.append(dist.all_reduce(torch.ones(16), async_op=True))
    works[-1].wait()
if dist.get_rank() == 1:
    sys.exit(5)
time.sleep(120)

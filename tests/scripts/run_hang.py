"""Rank 1 skips the second all_reduce, so rank 0 waits in it forever (a hang for the watchdog)."""

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
works = [dist.all_reduce(torch.ones(4), async_op=True)]  # kept alive: see run_fail.py
works[0].wait()
if dist.get_rank() == 0:
    dist.all_reduce(torch.ones(4))
time.sleep(120)

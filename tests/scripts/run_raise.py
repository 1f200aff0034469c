"""Run as a module (`-m run_raise`): two all_reduces, then every rank raises."""

import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
works = [dist.all_reduce(torch.ones(4), async_op=True)]  # kept alive: see run_fail.py
works[0].wait()
works.append(dist.all_reduce(torch.ones(4), async_op=True))
works[1].wait()
raise ValueError(f"boom argv={sys.argv[1:]} name={__name__}")

"""Run as a module (`-m run_raise`): two all_reduces, then every rank raises."""

import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
dist.all_reduce(torch.ones(4))
dist.all_reduce(torch.ones(4))
raise ValueError(f"boom argv={sys.argv[1:]} name={__name__}")

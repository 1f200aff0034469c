"""A tiny tensor-parallel inference script (no meshprof in it, no optimizer) for `meshprof run`.

Two ranks serve ``argv[2]`` requests (default 10) with an MLP split over a 1-D DeviceMesh
(DTensor, ColwiseParallel + RowwiseParallel: an all_reduce per request). Each request is one
forward of the model under ``torch.inference_mode()``; the model sleeps 1-5 ms in it so that
requests take visibly different times. The script writes its own timing of every request
(``time.perf_counter_ns`` around the call) to ``argv[1]/oracle_rank{r}.json``.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

REQUESTS = int(sys.argv[2]) if len(sys.argv) > 2 else 10


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 16)
        self.delay_s = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delay_s)
        return self.down(torch.relu(self.up(x)))


dist.init_process_group("gloo")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
torch.manual_seed(0)
model = parallelize_module(MLP(), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
times = []
starts = []
with torch.inference_mode():
    for i in range(REQUESTS):
        model.delay_s = 0.001 * (1 + (i * 3) % 5)
        x = torch.randn(4, 16)
        t0 = time.perf_counter_ns()
        y = model(x)
        t1 = time.perf_counter_ns()
        starts.append(t0)
        times.append(t1 - t0)
        assert y.shape == (4, 16)
with open(os.path.join(sys.argv[1], f"oracle_rank{rank}.json"), "w") as f:
    json.dump({"requests": REQUESTS, "request_ns": times, "elapsed_ns": t1 - starts[0]}, f)
dist.destroy_process_group()
